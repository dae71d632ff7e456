"""``airflow standalone`` that stops on SIGTERM: what ``make standalone`` runs.

``python -m accelmatrix.deploy.standalone`` is ``airflow standalone`` with one difference: SIGTERM
(and SIGHUP) stop it the way Ctrl-C does.

Why: Airflow 3.3.2's ``airflow standalone`` (``airflow/cli/commands/standalone_command.py``)
stops its components only on ``KeyboardInterrupt``: its main loop catches it, terminates
each component (scheduler, dag-processor, api-server, triggerer) and waits for them. It sets
no SIGTERM handler, so a SIGTERM (``kill``, a process manager, ``make`` passing on its own
SIGTERM) ends that process at once and leaves every component running, orphaned: the
scheduler with its LocalExecutor workers and log server, the api-server, the triggerer.
Here SIGTERM and SIGHUP raise that ``KeyboardInterrupt``, so the command's own shutdown runs.

A component that does not stop within Airflow's grace period for a terminated process,
``[core] killed_task_cleanup_time`` (60 s by default), is killed with its descendants
(SIGKILL), as are the descendants still alive once the components have exited. An idle
stack stops in a few seconds (``tests/test_standalone_shutdown.py``); a task still running
holds the scheduler (LocalExecutor waits for its workers' tasks) until then. A second signal
stops waiting: what is left gets SIGTERM, then SIGKILL when the grace period is over.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import psutil

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Shutdown:
    """Remembers this process's descendants once a stop began, and kills late ones."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.started: float | None = None
        self.known: dict[int, psutil.Process] = {}
        self.killed: list[str] = []
        self._lock = threading.Lock()

    def remember(self) -> list[psutil.Process]:
        """Every descendant alive now or seen before and still alive."""
        with self._lock:
            try:
                for p in psutil.Process().children(recursive=True):
                    self.known.setdefault(p.pid, p)
            except psutil.Error:
                pass
            return [p for p in self.known.values() if _alive(p)]

    def begin(self) -> None:
        """The first stop signal: start the clock and the backstop."""
        if self.started is not None:
            return
        self.started = time.monotonic()
        self.remember()
        timer = threading.Timer(self.grace, self.kill_left)
        timer.daemon = True
        timer.start()

    def kill_left(self) -> None:
        for p in self.remember():
            try:
                self.killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.Error:
                pass

    def finish(self) -> None:
        """After the command returned: descendants it left get SIGTERM, then SIGKILL."""
        self.begin()
        left = self.remember()
        for p in left:
            try:
                p.terminate()
            except psutil.Error:
                pass
        deadline = (self.started or time.monotonic()) + self.grace
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.remember()
        if left:
            self.kill_left()
        psutil.wait_procs(list(self.known.values()), timeout=5)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str] | None = None) -> int:
    # Before any component exists: a signal now needs no cleanup.
    from airflow.configuration import conf

    shutdown = _Shutdown(grace=conf.getfloat("core", "killed_task_cleanup_time", fallback=60))

    def stop(signum: int, frame: Any) -> None:
        shutdown.begin()
        # What Ctrl-C raises: `airflow standalone` stops its components on it.
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    # Ctrl-C keeps Python's KeyboardInterrupt, and starts the same clock.
    signal.signal(signal.SIGINT, lambda signum, frame: stop(signum, frame))

    sys.argv = ["airflow", "standalone", *(argv if argv is not None else sys.argv[1:])]
    from airflow.__main__ import main as airflow_main

    try:
        airflow_main()
    except KeyboardInterrupt:
        pass  # a signal before its main loop began, or a second one while it was stopping
    finally:
        # Every stop signal is taken from here on: the cleanup below must not be cut short.
        for sig in (*STOP_SIGNALS, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: shutdown.begin())
        shutdown.finish()
    if shutdown.killed:
        print(
            f"standalone | killed {len(shutdown.killed)} process(es) still running "
            f"{shutdown.grace:.0f} s after the stop began:\n  " + "\n  ".join(shutdown.killed),
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
