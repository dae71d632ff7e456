"""The rule for files a suite names under include/ (bounds and baseline files): they stay inside.

Written once because three readers apply it: suite validation (the text of the path, before
there is a directory to resolve against), the maintenance job that re-centers the bounds of
bounds files and the matrix page that draws them (the resolved path, so a symlink cannot
lead out either). A suite is reviewed like code, but a ``../../etc/x`` there would still
let a DAG read, or the re-centering job store bounds for, a file the suite's author does
not own.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["include_file", "relative_path"]


def relative_path(value: str, field: str) -> str:
    """``value`` unchanged when it is a non-empty relative path without ``..`` parts.

    Raises ValueError naming ``field``. Both separators count: suites are written on
    laptops of either kind, and ``..\\x`` escapes on one of them.
    """
    if not value.strip():
        raise ValueError(f"{field} must not be empty")
    if PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute():
        raise ValueError(f"{field} must be a relative path, got absolute path {value!r}")
    if ".." in re.split(r"[\\/]", value):
        raise ValueError(f"{field} must not contain '..' path parts, got {value!r}")
    return value


def include_file(include_dir: Path, rel: str, field: str = "bounds_file") -> Path:
    """The resolved path of ``rel`` under ``include_dir``; ValueError when it leads outside.

    The text rule first (what validation already said), then the resolved path, which
    must lie strictly below the resolved include dir (a symlink out of it fails too).
    """
    relative_path(rel, field)
    include = Path(include_dir).resolve()
    path = (include / rel).resolve()
    if include not in path.parents:
        raise ValueError(f"{field} {rel!r} is outside the include dir {include}")
    return path
