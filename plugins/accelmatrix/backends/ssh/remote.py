"""The host side of the SSH backend: the remote layout, what we send, and the primitives on it.

Everything here is about one ``RemoteHost`` and none of it about a cell's life: the names of
the work dir's files and logs, the Python snippets that stop a process group and expand
artifact globs on the host, the quoting of env and argv into the script a shell sees, and
``Remote``, one host with the Python that runs there: read a record, check that Python,
upload the include dir, probe and stop a process group and copy the runner's logs back. The
lifecycle (``backend``: provision, submit, poll, collect, teardown) and the setup step
(``setup``) are built on it. The ``/proc`` reading is ``runner.procfs``'s, the same code the
local backend runs: its source goes to the host ahead of the kill script.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import stat
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from accelmatrix import settings
from accelmatrix.backends.base import BackendError
from accelmatrix.backends.runner import procfs
from accelmatrix.backends.runner import status as runner_status
from accelmatrix.contracts.machine_records import SshResource
from accelmatrix.hooks.ssh import RemoteHost, sftp_makedirs

RECORD = "resource.json"
INTERNAL_DIR = ".accelmatrix"
LOG_FILES = (
    "output.log",
    "stdout.log",
    "stderr.log",
    "status.json",
    "runner.log",
    "resources.jsonl",
)
ROTATED_LOGS = ("output.log", "stdout.log", "stderr.log", "status.json", "resources.jsonl")
DEFAULT_WORK_ROOT = "~/.accelmatrix/work"
KILL_GRACE_SECONDS = 5.0
SUBMIT_WAIT_SECONDS = 15.0
INCLUDE_MAX_BYTES = 64 << 20
READ_CHUNK = 1 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PGID_LINE = re.compile(rb"^accelmatrix-pgid=(\d+)$")

# Signals a process group, but only if one of its live members carries the work dir marker
# in its environment (a PID reused by an unrelated program after the group died is spared).
# Zombies are not members: they are dead and cannot be killed further. Runs on the host.
_KILL_GROUP_PY = (
    Path(procfs.__file__).read_text(encoding="utf-8")
    + r"""
import signal, sys, time
pgid, marker, grace = int(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3])
def members():
    return group_members(pgid)
def ours(pids):
    for pid in pids:
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if marker in f.read().split(b"\0"):
                    return True
        except OSError:
            pass
    return False
if pgid <= 1 or pgid == os.getpgid(0):
    sys.exit("refusing to kill process group %d" % pgid)
live = members()
if not live:
    print("gone")
    sys.exit(0)
if not ours(live):
    print("foreign")
    sys.exit(0)
try:
    os.killpg(pgid, signal.SIGTERM)
except ProcessLookupError:
    print("gone")
    sys.exit(0)
deadline = time.monotonic() + grace
while time.monotonic() < deadline and members():
    time.sleep(0.1)
if members():
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    print("killed")
else:
    print("terminated")
"""
)

# Expands the artifact globs on the host with the same pathlib semantics as LocalBackend,
# and keeps only regular files whose real path stays inside the work dir (a symlink to
# ~/.ssh/id_rsa must not be exfiltrated) and outside the backend's own internal dir.
_GLOB_PY = r"""
import json, sys
from pathlib import Path
work = Path(sys.argv[1]).resolve()
internal = work / sys.argv[2]
found, refused = {}, []
for pattern in json.loads(sys.argv[3]):
    if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        refused.append(pattern)
        continue
    for m in work.glob(pattern):
        for src in (m.rglob("*") if m.is_dir() and not m.is_symlink() else [m]):
            rel = src.relative_to(work)
            real = src.resolve()
            if rel.parts[:1] == (sys.argv[2],) or real == internal or internal in real.parents:
                continue
            if real != work and work not in real.parents:
                refused.append(str(rel))
                continue
            if real.is_file():
                found[str(rel)] = str(real)
print(json.dumps({"found": found, "refused": refused}))
"""
# (connection, pid, start time) of processes already proven to be ours: later polls only
# re-read /proc/<pid>/stat (the start time tells a recycled PID apart).
_verified: set[tuple[str, int, bytes, str]] = set()
_verified_lock = threading.Lock()


def _last_line(data: bytes) -> bytes:
    """The last non-empty line: what our own snippet printed, after any rc-file noise."""
    lines = [line for line in data.splitlines() if line.strip()]
    return lines[-1] if lines else b""


def expand_work_root(work_root: str, home: str) -> str:
    """An absolute remote path from ``work_root`` (``~/`` is the login user's home)."""
    if work_root == "~" or work_root.startswith("~/"):
        path = home.rstrip("/") + work_root[1:]
    elif work_root.startswith("/"):
        path = work_root
    else:
        raise BackendError(f"work_root {work_root!r} must be absolute or start with '~/'")
    return posixpath.normpath(path)


def _checked_work_dir(path: str) -> str:
    """``path`` if it can be a cell work dir; refuses anything `rm -rf` must never get."""
    p = PurePosixPath(path)
    if not p.is_absolute() or ".." in p.parts or len(p.parts) < 5 or str(p) != path:
        raise BackendError(f"refusing to use {path!r} as a cell work dir")
    return path


def _marker(work_dir: str) -> str:
    return f"ACCELMATRIX_WORK_DIR={work_dir}"


def _env_lines(env: dict[str, str], work_dir: str) -> list[str]:
    lines = []
    for name, value in {**env, "ACCELMATRIX_WORK_DIR": work_dir}.items():
        if not _ENV_NAME.match(name):
            raise BackendError(f"env name {name!r} is not a valid variable name")
        if "\x00" in value:
            raise BackendError(f"env {name}: values cannot contain NUL bytes")
        lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def _argv(argv: list[str]) -> str:
    if not argv or any("\x00" in a for a in argv):
        raise BackendError(f"invalid argv {argv!r}: empty or containing NUL bytes")
    return shlex.join(argv)


class Remote:
    """One host, and the Python the runner and our snippets run with there."""

    def __init__(self, host: RemoteHost, python: str):
        self.host = host
        self.python = python

    def read_json(self, path: str) -> dict[str, Any] | None:
        """A record or the runner's status on the host; None if missing or unreadable."""
        return runner_status.parse(self.host.read(path))

    def kill_group(self, pgid: int, work_dir: str) -> str:
        """SIGTERM then SIGKILL the remote group, if it is still this work dir's."""
        if pgid <= 1:
            raise BackendError(f"refusing to kill process group {pgid}")
        result = self.host.execute(
            shlex.join([self.python, "-", str(pgid), _marker(work_dir), str(KILL_GRACE_SECONDS)]),
            stdin=_KILL_GROUP_PY.encode(),
            timeout=KILL_GRACE_SECONDS + 30,
        )
        if result.exit_code != 0:
            raise BackendError(
                f"could not stop process group {pgid} on {self.host.hostname}: "
                f"exit {result.exit_code}: {result.text().strip()[-500:]}"
            )
        return _last_line(result.stdout).decode(errors="replace")

    def alive(self, pid: int, work_dir: str, verify: bool = True) -> bool:
        """Is ``pid`` a live (non-zombie) process started for this work dir?

        SFTP reads of /proc (no command, no shell): its stat, and its environment the first
        time only. Cheap enough for every poll. ``verify=False`` skips the environment check,
        for a PID we started a moment ago (a forked shell shows its old environment until
        it execs).
        """
        if not self.host.has_proc():
            return self.host.execute(f"kill -0 {int(pid)}", timeout=30).exit_code == 0
        try:
            raw = self.host.read(f"/proc/{int(pid)}/stat")
            if raw is None:
                return False
            fields = procfs.stat_fields(raw)
            if procfs.is_zombie(fields):
                return False
            if not verify:
                return True
            key = (self.host.conn_id, int(pid), fields[19], work_dir)  # [19]: stat field 22, start
            with _verified_lock:
                if key in _verified:
                    return True
            environ = self.host.read(f"/proc/{int(pid)}/environ")
        except PermissionError:
            return True  # someone else's process: it exists, and it is not ours to judge
        if environ is None:
            return False
        ours = _marker(work_dir).encode() in environ.split(b"\0")
        if ours:
            with _verified_lock:
                if len(_verified) > 10_000:
                    _verified.clear()
                _verified.add(key)
        return ours

    def fetch_logs(self, resource: SshResource) -> list[str]:
        """Copy the runner's logs into the local artifacts dir (where evaluation reads them)."""
        art = Path(resource.artifacts_dir)
        art.mkdir(parents=True, exist_ok=True)
        log_dir = resource.log_dir
        copied = []
        with self.host.bulk_sftp() as sftp:
            for name in LOG_FILES:
                try:
                    sftp.get(f"{log_dir}/{name}", str(art / f".{name}.part"))
                except FileNotFoundError:
                    continue
                os.replace(art / f".{name}.part", art / name)
                copied.append(name)
        return copied

    def check_python(self) -> None:
        """Fail at provision, clearly, if the host cannot run the runner (not at submit)."""
        probe = "import sys; print('%d.%d' % sys.version_info[:2])"
        result = self.host.execute(shlex.join([self.python, "-c", probe]), timeout=60)
        version = _last_line(result.stdout).decode(errors="replace").strip()
        if result.exit_code != 0 or tuple(map(int, (version or "0.0").split("."))) < (3, 10):
            raise BackendError(
                f"{self.python!r} on {self.host.hostname} is not Python >= 3.10 (exit "
                f"{result.exit_code}: {result.text().strip()[-300:]}); set the machine's `python`"
            )

    def upload_include(self, remote: str) -> str:
        """Copy the include dir to the host, so `${include_dir}/...` works there as locally."""
        local = settings.include_dir()
        if not local.is_dir():
            return remote
        files = [
            p
            for p in sorted(local.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
        total = sum(p.stat().st_size for p in files)
        if total > INCLUDE_MAX_BYTES:
            raise BackendError(
                f"include dir {local} holds {total} bytes; more than {INCLUDE_MAX_BYTES} is "
                "not copied to SSH hosts (ship big inputs through a setup command instead)"
            )
        with self.host.bulk_sftp() as sftp:
            sftp_makedirs(sftp, remote)
            for p in files:
                target = f"{remote}/{p.relative_to(local).as_posix()}"
                sftp_makedirs(sftp, posixpath.dirname(target))
                sftp.put(str(p), target)
                sftp.chmod(target, stat.S_IMODE(p.stat().st_mode))
        return remote
