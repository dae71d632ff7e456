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

import re
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
