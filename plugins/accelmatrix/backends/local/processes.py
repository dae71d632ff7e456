"""Processes on this host: is a pid or a process group alive, and stop a group for good.

Every local workload, setup command and service runs in a session of its own, so it is
stopped with one ``killpg``: SIGTERM, a grace period, then SIGKILL for whatever is left. A
group is alive while one of its members is not a zombie (``runner.procfs``); a zombie has
exited and cannot be killed further.
"""

from __future__ import annotations

import os
import signal
import time

from accelmatrix.backends.runner import procfs

KILL_GRACE_SECONDS = 5.0


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has exited, for our purposes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = procfs.pid_state(pid)
    return fields is None or not procfs.is_zombie(fields)


def pgid_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still exists (signal 0 reaches it)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_process_group(pgid: int, grace: float = KILL_GRACE_SECONDS) -> bool:
    """SIGTERM the group, then SIGKILL after ``grace`` seconds. True if something was killed."""
    if pgid <= 1 or pgid == os.getpgid(0):
        raise ValueError(f"refusing to kill process group {pgid}")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not procfs.group_members(pgid):
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
