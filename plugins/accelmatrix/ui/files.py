"""Which artifact files the matrix page may serve: a run's evidence, nothing else.

The URL path comes from the browser, so it is hostile until proven otherwise: ``..``,
absolute paths, symlinks that point out of the tree, and files that are not evidence (a work
dir, the results database, another suite's files, a marker file) are all refused the same
way (None -> 404), so a probe learns nothing about what exists outside.

Evidence, relative to the suite's artifacts dir ``<artifacts>/<dag>/``:

* ``<run>/index.html``: the run report the gate writes (every cell, its state and links);
* ``<run>/data_docs/...``: the Data Docs of the run's table of cells (evaluation.run_table);
* ``<run>/<cell>/data_docs/...``: the cell's Great Expectations Data Docs;
* ``<run>/<cell>/<log or metrics file>``: the workload's output, stdout and stderr (earlier
  attempts' too), the runner's resource samples, status and the collected metrics table;
* ``<run>/<cell>/files/...``: the artifacts collected from the cell's machine (metrics
  files, profiler traces, anything the suite's ``artifacts`` globs name).

Every class is checked again after symlinks are resolved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from accelmatrix import settings

# <artifacts>/<dag>/<run>/<cell>/data_docs/...: the part that names the Data Docs tree.
DOCS_DIR = "data_docs"
FILES_DIR = "files"
REPORT = "index.html"
_DOCS_DEPTH = 2
# The files a cell's artifacts dir holds beside data_docs/ and files/ that are evidence.
CELL_FILES = re.compile(
    r"(output(-\d+)?|stdout|stderr|runner)\.log(\.\d+)?"
    r"|metrics\.json|train_metrics\.json|status\.json(\.\d+)?|resources\.jsonl(\.\d+)?"
)
# Kinds of served file: how the app sends each (ui/app.py).
DOCS, RUN_REPORT, CELL_FILE, ARTIFACT = "docs", "report", "cell", "artifact"


def suite_root(dag_id: str) -> Path:
    return settings.artifacts_dir() / settings.safe_name(dag_id)


def kind_of(parts: tuple[str, ...]) -> str | None:
    """Which kind of evidence the relative path ``parts`` names, or None."""
    if len(parts) == 2 and parts[1] == REPORT:
        return RUN_REPORT
    if len(parts) > 2 and parts[1] == DOCS_DIR:  # a cell's directory is never "data_docs"
        return DOCS
    if len(parts) <= _DOCS_DEPTH:
        return None
    if parts[_DOCS_DEPTH] == DOCS_DIR and len(parts) > _DOCS_DEPTH + 1:
        return DOCS
    if parts[_DOCS_DEPTH] == FILES_DIR and len(parts) > _DOCS_DEPTH + 1:
        return ARTIFACT
    if len(parts) == _DOCS_DEPTH + 1 and CELL_FILES.fullmatch(parts[_DOCS_DEPTH]):
        return CELL_FILE
    return None


def evidence_file(dag_id: str, rel: str) -> tuple[Path, str] | None:
    """(file, kind) for ``rel`` (posix, relative to the suite's artifacts dir) if it is a
    regular file of that suite's evidence, after resolving symlinks; else None."""
    if not rel or "\x00" in rel or "\\" in rel:
        return None
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
        return None
    if kind_of(parts) is None:
        return None
    try:
        root = suite_root(dag_id).resolve(strict=True)
        target = root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    try:
        inside = target.relative_to(root).parts
    except ValueError:
        return None
    kind = kind_of(inside)  # re-checked after symlinks: still evidence of this suite
    if kind is None or not target.is_file():
        return None
    return target, kind


def run_docs(dag_id: str, run_id: str) -> str | None:
    """The path of the run's Data Docs index relative to the suite's artifacts dir, if the
    gate wrote them."""
    rel = f"{settings.safe_name(run_id)}/{DOCS_DIR}/{REPORT}"
    return rel if evidence_file(dag_id, rel) is not None else None


def data_docs_file(dag_id: str, rel: str) -> Path | None:
    """The file ``rel`` if it is a regular file inside some cell's Data Docs tree."""
    found = evidence_file(dag_id, rel)
    return found[0] if found and found[1] == DOCS else None


# A profiler trace among a cell's collected files (the profiler_trace source's default glob
# is **/*.pt.trace.json; torch also writes .json.gz).
TRACE_SUFFIXES = (".trace.json", ".trace.json.gz")
# Entries looked at when searching a cell's collected files for a trace: the matrix page
# lists every cell, so one cell with thousands of artifacts must not slow the page.
TRACE_SCAN_LIMIT = 500


@dataclass(frozen=True)
class CellFiles:
    """A cell's evidence files that exist, as paths relative to the suite's artifacts dir
    (what ``evidence_file`` serves): the links an on-call engineer opens from the matrix
    instead of finding them in the collect task's log."""

    stdout: str | None = None  # the workload's output (stdout and stderr, as the runner wrote)
    metrics: str | None = None  # the collected metrics table (metrics.json)
    trace: str | None = None  # the first profiler trace among the collected files
    docs: str | None = None  # the cell's Data Docs index

    def links(self) -> list[tuple[str, str]]:
        """(kind, relative path) of each file present, in the order the page lists them."""
        pairs = (
            ("stdout", self.stdout),
            ("metrics", self.metrics),
            ("trace", self.trace),
            ("docs", self.docs),
        )
        return [(k, v) for k, v in pairs if v]


def cell_files(dag_id: str, run_id: str, cell_id: str, docs: str | None = None) -> CellFiles:
    """The evidence files of one cell (a few ``stat`` calls and a bounded walk of its
    collected files). ``docs``: the cell's Data Docs as the store records them, relative."""
    cell_dir = settings.cell_artifacts_dir(dag_id, run_id, cell_id)
    rel = f"{settings.safe_name(run_id)}/{settings.safe_name(cell_id)}"
    if not cell_dir.is_dir():
        return CellFiles(docs=docs)

    def present(name: str) -> str | None:
        return f"{rel}/{name}" if (cell_dir / name).is_file() else None

    if docs is None and (cell_dir / DOCS_DIR / REPORT).is_file():
        docs = f"{rel}/{DOCS_DIR}/{REPORT}"
    return CellFiles(
        stdout=present("output.log"),
        metrics=present("metrics.json"),
        trace=_first_trace(cell_dir / FILES_DIR, f"{rel}/{FILES_DIR}"),
        docs=docs,
    )


def _first_trace(root: Path, rel: str) -> str | None:
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            seen += 1
            if seen > TRACE_SCAN_LIMIT:
                return None
            if name.endswith(TRACE_SUFFIXES):
                sub = Path(dirpath).relative_to(root).as_posix()
                return f"{rel}/{name}" if sub == "." else f"{rel}/{sub}/{name}"
    return None
