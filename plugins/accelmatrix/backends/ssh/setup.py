"""Setup commands of the SSH backend: run attached over the channel, streamed, killable.

Unlike the workload (started detached under the runner and polled), each setup command runs
while the task waits: its output is streamed line by line to the task log and setup.log, it
runs as its own session so a timeout stops the whole process group, and a retry first stops
the group an earlier, SIGKILLed attempt left running. That is its own protocol (the pgid
marker line, the plain-sh kill that needs no Python on the host), hence its own module;
``RemoteSetup`` works on a ``remote.Remote``.
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path

from accelmatrix.backends.base import BackendError, InfrastructureError, LogFn, SetupFailed
from accelmatrix.backends.ssh.remote import (
    _PGID_LINE,
    KILL_GRACE_SECONDS,
    Remote,
    _argv,
    _checked_work_dir,
    _env_lines,
)
from accelmatrix.contracts.machine_records import SshResource

logger = logging.getLogger("accelmatrix.backends.ssh")


class _Lines:
    """Splits a byte stream into decoded lines for a sink, taking out our pgid marker."""

    def __init__(self, sink: LogFn):
        self.sink = sink
        self.buf = b""
        self.pgid: int | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self._emit(line)

    def close(self) -> None:
        if self.buf:
            self._emit(self.buf)
            self.buf = b""

    def _emit(self, line: bytes) -> None:
        # Only lines before the marker are candidates (a login rc file may print first);
        # after it, everything is the command's own output, whatever it looks like.
        if self.pgid is None:
            m = _PGID_LINE.match(line)
            if m:
                self.pgid = int(m.group(1))
                return
        self.sink(line.rstrip(b"\r").decode("utf-8", errors="replace"))


class RemoteSetup:
    """The setup step of a cell on one host."""

    def __init__(self, remote: Remote):
        self.remote = remote

    def run(
        self,
        resource: SshResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        """Run ``commands`` in order; raise SetupFailed on the first failure."""
        host = self.remote.host
        work_dir = _checked_work_dir(resource.work_dir)
        log_path = Path(resource.artifacts_dir) / "setup.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        env_lines = _env_lines(env, work_dir)
        self.stop_earlier(resource, work_dir, log)
        with open(log_path, "a", encoding="utf-8") as setup_log:
            for i, argv in enumerate(commands):
                command = _argv(argv)
                if deadline - time.monotonic() <= 0:
                    raise SetupFailed(f"setup[{i}] {argv} timed out after {timeout}s")
                log(f"setup[{i}]: {argv}")
                setup_log.write(f"$ {command}\n")
                setup_log.flush()
                tail: list[str] = []

                def sink(line: str, tail: list[str] = tail) -> None:
                    log(line)
                    setup_log.write(line + "\n")
                    setup_log.flush()
                    tail.append(line)
                    del tail[:-20]

                lines = _Lines(sink)
                # The script runs as its own session (setsid -w waits and passes the exit
                # code on), so a timeout can kill the whole group, grandchildren included.
                # setup.pgid lets a teardown stop it even if this worker dies meanwhile.
                script = "\n".join(
                    [
                        "printf 'accelmatrix-pgid=%s\\n' \"$$\"",
                        f"printf '%s\\n' \"$$\" > {shlex.quote(resource.internal_dir)}/setup.pgid",
                        f"cd -- {shlex.quote(work_dir)} || exit 126",
                        *env_lines,
                        "exec 2>&1",
                        f"exec {command} < /dev/null",
                        "",
                    ]
                )

                def on_timeout(lines: _Lines = lines, i: int = i) -> None:
                    if lines.pgid:
                        host.execute(_shell_kill(lines.pgid), timeout=30)
                    else:
                        logger.warning("setup[%d] timed out before it reported its pgid", i)

                result = host.execute(
                    "exec setsid -w sh -s",
                    stdin=script.encode(),
                    timeout=max(0.0, deadline - time.monotonic()),
                    combine=True,
                    on_output=lines.feed,
                    on_timeout=on_timeout,
                )
                lines.close()
                if result.timed_out:
                    raise SetupFailed(f"setup[{i}] {argv} timed out after {timeout}s")
                if result.exit_code is None:
                    raise InfrastructureError(
                        f"setup[{i}] {argv}: lost the SSH connection to {host.hostname}"
                    )
                if result.exit_code != 0:
                    raise SetupFailed(
                        f"setup[{i}] {argv} exited with {result.exit_code}; last lines:\n"
                        + "\n".join(tail)
                    )

    def stop_earlier(self, resource: SshResource, work_dir: str, log: LogFn) -> None:
        """A setup command whose task was SIGKILLed lives on (no pty, no SIGHUP) and may be
        what hung. A retried setup stops it first, before its own command overwrites
        setup.pgid (else the teardown could no longer find it); the teardown stops it too."""
        pgid = self.remote.host.read(f"{resource.internal_dir}/setup.pgid")
        if not (pgid and pgid.strip().isdigit()):
            return
        outcome = self.remote.kill_group(int(pgid), work_dir)
        if outcome in ("terminated", "killed"):
            log(f"stopped the setup command an earlier attempt left running (group {int(pgid)})")


def _shell_kill(pgid: int) -> str:
    """TERM, then KILL after a grace, of a group we are still attached to (setup timeout).

    Plain sh (no Python): setup may be what installs the machine's Python.
    """
    p = int(pgid)
    if p <= 1:
        raise BackendError(f"refusing to kill process group {p}")
    steps = int(KILL_GRACE_SECONDS / 0.2)
    return (
        f"kill -TERM -- -{p} 2>/dev/null || exit 0; i=0; "
        f"while [ $i -lt {steps} ]; do sleep 0.2; kill -0 -- -{p} 2>/dev/null || exit 0; "
        f"i=$((i+1)); done; kill -KILL -- -{p} 2>/dev/null; exit 0"
    )
