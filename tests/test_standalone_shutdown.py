"""``make standalone`` stops, every process of it, within 30 s of a SIGTERM.

The test runs ``make standalone`` itself, as the README tells a user to, in a temporary
AIRFLOW_HOME: make migrates the database, applies the pools and starts ``airflow
standalone`` with the Makefile's settings (PreloadedLocalExecutor, its parallelism). It
waits until the stack is up (standalone printed "Airflow is ready") and the scheduler has
forked its LocalExecutor workers, sends SIGTERM to the top process (make) and asserts that
every process of the tree seen until then is gone within 30 s.

What it found before the fix (``airflow standalone`` has no SIGTERM handler; the forked
workers inherit the scheduler's, which returns in a child): make and standalone ended at
once, the dag-processor a second later, and the scheduler with its 32 idle workers and log
server, the api-server and the triggerer were all still running 75 s later.

Differences from a user's run, none of which changes what starts: make is told the venv is
up to date (``-o .venv/.installed``: a test never installs packages); the api-server listens
on 127.0.0.1 and a free port, the log servers on free ports (Airflow binds those on every
interface, ``serve_logs/core.py``); ``PYTHONPATH`` puts this checkout's plugins first, in
case the venv's editable install points at another checkout; a marker variable lets the
cleanup find any process of this stack by PID. Whatever is left after the test is killed by
PID, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from accelmatrix_testkit.airflow_stack import free_port

ROOT = Path(__file__).resolve().parents[1]
MARKER = "ACCELMATRIX_STANDALONE_TEST"
STOP_WITHIN = 30.0
STARTUP_TIMEOUT = 900.0  # migrate, pools, standalone's own db check, the preload: 2-5 min here
WORKER_TITLE = "airflow worker -- LocalExecutor"


def _env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "_AIRFLOW", "ACCELMATRIX_"))
        and k not in ("PYTHONPATH", "GX_ANALYTICS_ENABLED", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    }
    port = free_port()
    env.update(
        {
            "AIRFLOW_HOME": str(home / "airflow"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "PYTHONPATH": str(ROOT / "plugins"),
            "GX_ANALYTICS_ENABLED": "false",
            "NO_COLOR": "1",
            MARKER: home.name,
        }
    )
    return env


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:100]}"
    except psutil.Error:
        return f"{p.pid} (gone)"


def _is_worker(p: psutil.Process) -> bool:
    try:
        return WORKER_TITLE in " ".join(p.cmdline())
    except psutil.Error:
        return False


class _Tree:
    """Every process seen under the top one, kept by PID (psutil guards against reuse)."""

    def __init__(self, top: psutil.Process) -> None:
        self.top = top
        self.seen: dict[int, psutil.Process] = {top.pid: top}

    def look(self) -> list[psutil.Process]:
        """Add the live descendants of every process seen; return those alive."""
        for p in list(self.seen.values()):
            if not _alive(p):
                continue
            try:
                for q in p.children(recursive=True):
                    self.seen.setdefault(q.pid, q)
            except psutil.Error:
                continue
        return [p for p in self.seen.values() if _alive(p)]

    def marked(self, mark: str) -> list[psutil.Process]:
        """Live processes carrying this test's marker: ours, even if re-parented away."""
        found = []
        for p in psutil.process_iter():
            if p.pid == os.getpid():
                continue
            try:
                if p.environ().get(MARKER) == mark and _alive(p):
                    found.append(p)
            except (psutil.Error, OSError):
                continue
        return found


def _expected_workers(env: dict[str, str]) -> int:
    """The Makefile's parallelism: 4 per CPU (nproc), at most 32."""
    n = int(subprocess.run(["nproc"], env=env, capture_output=True, text=True).stdout.strip())  # noqa: S607
    return min(4 * n, 32)


@pytest.mark.integration
@pytest.mark.slow(220)
def test_make_standalone_stops_within_30_s_of_sigterm(tmp_path):
    env = _env(tmp_path)
    log_path = tmp_path / "make-standalone.log"
    expected_workers = _expected_workers(env)
    with open(log_path, "wb") as out:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "standalone"],  # noqa: S607
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tree = _Tree(psutil.Process(make.pid))

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        # Up: standalone says so, and the scheduler has forked all its workers.
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            assert make.poll() is None, f"make standalone exited {make.returncode}:\n{log_tail()}"
            alive = tree.look()
            workers = [p for p in alive if _is_worker(p)]
            if len(workers) >= expected_workers and "Airflow is ready" in log_path.read_text(
                errors="replace"
            ):
                break
            assert time.monotonic() < deadline, (
                f"not up in {STARTUP_TIMEOUT:.0f} s ({len(workers)} workers):\n{log_tail()}"
            )
            time.sleep(1)
        time.sleep(3)  # workers reach their idle loop; nothing else is starting
        before = tree.look()
        workers = [p for p in before if _is_worker(p)]
        names = " ".join(" ".join(p.cmdline()) for p in before if _alive(p))
        for component in ("scheduler", "dag-processor", "triggerer", "api_server"):
            assert component in names, (component, [_describe(p) for p in before])

        os.kill(make.pid, signal.SIGTERM)
        t0 = time.monotonic()
        while time.monotonic() - t0 < STOP_WITHIN:
            make.poll()
            left = tree.look() + tree.marked(env[MARKER])
            if not left and make.returncode is not None:
                break
            time.sleep(0.2)
        took = time.monotonic() - t0
        left = {p.pid: p for p in tree.look() + tree.marked(env[MARKER])}
        print(f"{len(before)} processes, {len(workers)} workers; all gone after {took:.1f} s")
        assert not left, (
            f"{len(left)} of {len(before)} processes still running {STOP_WITHIN:.0f} s after "
            f"SIGTERM to make standalone:\n  "
            + "\n  ".join(_describe(p) for p in left.values())
            + f"\n{log_tail()}"
        )
        assert make.returncode is not None
        # The pool is what the Makefile sizes it to, not Airflow's default of 32.
        assert len(workers) == expected_workers, [_describe(p) for p in workers]
    finally:
        for p in [*tree.seen.values(), *tree.marked(env[MARKER])]:
            try:
                if p.is_running():
                    p.kill()
            except psutil.Error:
                pass
        try:
            make.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def test_what_outlives_the_grace_period_is_killed(tmp_path):
    """The backstop of ``accelmatrix.deploy.standalone``: a descendant that ignores SIGTERM is
    killed once the grace period is over, one that obeys stops at once (a fresh interpreter:
    the code signals its own descendants)."""
    code = (
        "import subprocess, sys, time\n"
        "from accelmatrix.deploy.standalone import _Shutdown\n"
        "stubborn = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'],"
        " stdout=subprocess.PIPE)\n"
        "stubborn.stdout.readline()  # its handler is set\n"
        "obedient = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "shutdown = _Shutdown(grace=2)\n"
        "t0 = time.monotonic()\n"
        "shutdown.finish()\n"
        "took = time.monotonic() - t0\n"
        "assert 1.5 < took < 8, took\n"
        "assert obedient.wait(1) is not None and stubborn.wait(1) is not None  # reaped\n"
        "assert [k.split()[0] for k in shutdown.killed] == [str(stubborn.pid)], shutdown.killed\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok"), out.stdout
