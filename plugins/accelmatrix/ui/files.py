"""Which artifact files the matrix page may serve: Data Docs of one suite, nothing else.

The URL path comes from the browser, so it is hostile until proven otherwise: ``..``,
absolute paths, symlinks that point out of the tree, and files that are not Data Docs
(workload logs, traces, anything a workload wrote) are all refused the same way (None ->
404), so a probe learns nothing about what exists outside.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from accelmatrix import settings

# <artifacts>/<dag>/<run>/<cell>/data_docs/...: the part that names the Data Docs tree.
DOCS_DIR = "data_docs"
_DOCS_DEPTH = 2


def suite_root(dag_id: str) -> Path:
    return settings.artifacts_dir() / settings.safe_name(dag_id)


def data_docs_file(dag_id: str, rel: str) -> Path | None:
    """The file ``rel`` (posix, relative to the suite's artifacts dir) if it is a regular
    file inside some cell's Data Docs tree of that suite, after resolving symlinks."""
    if not rel or "\x00" in rel or "\\" in rel:
        return None
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
        return None
    if len(parts) <= _DOCS_DEPTH + 1 or parts[_DOCS_DEPTH] != DOCS_DIR:
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
    # Re-check after symlinks: still under <run>/<cell>/data_docs of this suite.
    if len(inside) <= _DOCS_DEPTH + 1 or inside[_DOCS_DEPTH] != DOCS_DIR:
        return None
    return target if target.is_file() else None
