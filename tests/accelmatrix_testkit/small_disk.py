"""A size-limited directory: a tmpfs of a few hundred KiB mounted over a path (root only).

The "artifacts disk full" fault of the fault matrix and tests/test_collect_disk_full.py
fill a real filesystem: writes past its size fail with ENOSPC exactly as on a full disk.
A mount needs root (or CAP_SYS_ADMIN); ``mount_tmpfs`` says why it could not.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


def mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` (e.g. ``256k``) over ``path`` (created); None when mounted,
    else why not."""
    mount = shutil.which("mount")
    if mount is None:
        return "no mount command"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(  # noqa: S603 (argv list)
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def unmount(path: Path) -> None:
    """Unmount ``path`` (lazily: a process still inside does not keep the mount)."""
    umount = shutil.which("umount")
    if umount is not None:
        subprocess.run([umount, "-l", str(path)], capture_output=True, check=False)  # noqa: S603


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a ``size`` tmpfs while the block runs; raises OSError if it cannot."""
    why = mount_tmpfs(path, size)
    if why is not None:
        raise OSError(f"cannot mount a {size} tmpfs on {path}: {why}")
    try:
        yield path
    finally:
        unmount(path)
