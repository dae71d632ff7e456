"""What the runner's ``status.json`` says about a workload: running, exited, or lost.

The local and SSH backends poll a workload the same way and differ only in how they read a
file and ask whether a pid lives (a local read and ``kill -0``; an SFTP read and ``/proc``
on the host), so the rules live here once: a status with an exit code is the verdict; a
live runner is "running"; a dead runner whose status has no exit code (read again: it may
have written it between the two reads) is an infrastructure failure, since the supervisor
was killed and nobody can say how the workload ended.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from accelmatrix.backends.base import JobStatus


def parse(data: bytes | str | None) -> dict[str, Any] | None:
    """A status (or resource record) from its JSON text; None if missing or unreadable."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def judge(read: Callable[[], dict[str, Any] | None], alive: Callable[[], bool]) -> JobStatus:
    """The workload's state from ``read()`` (its status) and ``alive()`` (its runner)."""
    status = read()
    if status and status.get("exit_code") is not None:
        sig = status.get("signal")
        detail = f"exit code {status['exit_code']}" + (f" (signal {sig})" if sig else "")
        return JobStatus(done=True, exit_code=status["exit_code"], detail=detail)
    if alive():
        return JobStatus(done=False, detail="running")
    # Re-read: the runner may have written its final status between the two reads.
    status = read()
    if status and status.get("exit_code") is not None:
        return JobStatus(done=True, exit_code=status["exit_code"], detail="exited")
    return JobStatus(
        done=True,
        exit_code=None,
        detail="the workload's supervisor process disappeared (killed?) without a status",
        infrastructure_failure=True,
    )
