"""Copy a work dir's files matching artifact globs, and nothing from outside it.

The local backend collects from its work dir; the Kubernetes backends from the cell's folder
on the artifacts volume as the worker sees it. A symlink out of the work dir is skipped (it
must not exfiltrate a file), and ``out/**`` takes the files inside matched directories.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def collect_globs(work_dir: Path, globs: list[str], dest: Path) -> list[str]:
    """Copy the files under ``work_dir`` matching ``globs`` into ``dest``; their relative paths."""
    work = work_dir.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    copied: list[str] = []
    for pattern in globs:
        matches = set()
        for m in work.glob(pattern):
            # `out/**` matches directories only in Python 3.11: take what is inside.
            matches.update(m.rglob("*") if m.is_dir() and not m.is_symlink() else [m])
        for src in sorted(matches):
            real = src.resolve()
            # A symlink pointing outside the work dir must not exfiltrate files.
            if not real.is_relative_to(work) or not real.is_file():
                continue
            rel = src.relative_to(work)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, target)
            copied.append(str(rel))
    return sorted(set(copied))
