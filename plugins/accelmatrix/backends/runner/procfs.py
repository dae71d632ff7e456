"""Reading ``/proc``: a process's state, and the live members of a process group.

Written once for every place that asks (the local backend's kill and liveness checks, the
SSH backend's liveness check over SFTP and its kill script on the host). Stdlib only and
self-contained on purpose: the SSH backend sends this module's source to the host, where
accelmatrix is not installed, ahead of its kill script (``ssh.remote``).

A zombie is not alive here: it has exited, and it cannot be killed further.
"""

from __future__ import annotations

import os


def stat_fields(raw: bytes) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name; ``[0]`` is the state
    (field 3 of proc(5)), ``[2]`` the process group, ``[19]`` the start time.

    The name is cut at the *last* ``)``: it may itself hold spaces and parentheses.
    """
    return raw.rsplit(b")", 1)[1].split()


def is_zombie(fields: list[bytes]) -> bool:
    return fields[0] == b"Z"


def group_members(pgid: int, proc: str = "/proc") -> list[str]:
    """The pids (as text) of the live, non-zombie processes in process group ``pgid``."""
    out = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                fields = stat_fields(f.read())
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and not is_zombie(fields):
            out.append(name)
    return out


def pid_state(pid: int) -> list[bytes] | None:
    """The stat fields of ``pid``, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return stat_fields(f.read())
    except (OSError, IndexError):
        return None
