"""LocalBackend against real processes: detached runs, logs, kill, cleanup."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import CellContext, SetupFailed
from accelmatrix.backends.local.backend import LocalBackend
from accelmatrix.backends.local.processes import pid_alive as _pid_alive
from accelmatrix.backends.machine_kinds import get_backend

SPEC = {"backend": "local"}


def _ctx(home: Path, cell: str = "model=a") -> CellContext:
    return CellContext(
        dag_id="d",
        run_id="manual__2026-01-01T00:00:00+00:00",
        cell_id=cell,
        artifacts_dir=home / "artifacts" / cell,
    )


def _wait(backend, handle, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = backend.poll(handle)
        if st.done:
            return st
        time.sleep(0.05)
    raise AssertionError("workload did not finish")


def test_provision_is_idempotent_and_labelled(accel_home):
    b = get_backend(SPEC)
    assert isinstance(b, LocalBackend)
    r1 = b.provision(_ctx(accel_home))
    r2 = b.provision(_ctx(accel_home))
    assert r1 == r2  # a retry finds the same resource
    assert Path(r1.work_dir).is_dir()
    assert r1.labels["managed-by"] == "accelmatrix"
    assert r1.labels["cell"] == "model=a"
    assert int(r1.labels["ttl"]) > time.time()
    assert [m.name for m in b.list_managed()] == [r1.name]


def test_provision_failure_removes_what_it_created(accel_home):
    b = backend_of(LocalBackend, SPEC)
    # An environmental fault half way: the work dir is made, then the cell's artifacts path
    # turns out to be taken by a file (the fault matrix blocks provision the same way).
    ctx = _ctx(accel_home)
    ctx.artifacts_dir.parent.mkdir(parents=True, exist_ok=True)
    ctx.artifacts_dir.write_text("not a directory\n")
    with pytest.raises(FileExistsError):
        b.provision(ctx)
    assert not LocalBackend.work_dir_for(_ctx(accel_home)).exists()
    assert b.list_managed() == []


def test_setup_runs_argv_without_shell_and_fails_clearly(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    lines: list[str] = []
    # A shell metacharacter stays a literal argument: no shell ever sees it.
    b.setup(
        r,
        [[sys.executable, "-c", "import sys; print(sys.argv[1])", "a; rm -rf /"]],
        {},
        30,
        lines.append,
    )
    assert "a; rm -rf /" in lines
    with pytest.raises(SetupFailed, match="exited with 3"):
        b.setup(
            r, [[sys.executable, "-c", "print('boom'); raise SystemExit(3)"]], {}, 30, lines.append
        )
    assert "boom" in (Path(r.artifacts_dir) / "setup.log").read_text()


def test_setup_timeout_kills_the_command(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    t0 = time.time()
    with pytest.raises(SetupFailed, match="timed out"):
        b.setup(r, [[sys.executable, "-c", "import time; time.sleep(60)"]], {}, 1, print)
    assert time.time() - t0 < 15


def test_run_detached_streams_logs_and_records_exit(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    code = "import sys\nprint('hello', flush=True)\nprint('oops', file=sys.stderr)\nsys.exit(4)"
    h = b.submit(r, [sys.executable, "-c", code], {"FOO": "bar"})
    st = _wait(b, h)
    assert st.done and st.exit_code == 4
    lines, off = b.read_logs(h, 0)
    assert "hello" in lines and "oops" in lines
    assert b.read_logs(h, off) == ([], off)
    status = json.loads(Path(h.status_path).read_text())
    assert status["ended_at"] >= status["started_at"]
    assert (Path(r.artifacts_dir) / "stderr.log").read_text().strip() == "oops"


def test_workload_env_has_no_airflow_secrets(accel_home, monkeypatch):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://u:S3cr3tValueXyz@h/db")
    monkeypatch.setenv("AIRFLOW_CONN_MY_DB", "postgresql://u:S3cr3tValueXyz2@h/db")
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    h = b.submit(r, [sys.executable, "-c", "import os; print(sorted(os.environ.items()))"], {})
    _wait(b, h)
    out = Path(h.log_path).read_text()
    assert "S3cr3tValueXyz" not in out
    assert "ACCELMATRIX_WORK_DIR" in out


def test_cancel_and_teardown_kill_the_whole_process_group(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    # The workload forks a grandchild: both must die.
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    h = b.submit(r, [sys.executable, "-c", code], {})
    deadline = time.time() + 20
    lines: list[str] = []
    while not lines and time.time() < deadline:
        lines, _ = b.read_logs(h, 0)
        time.sleep(0.05)
    grandchild = int(lines[0])
    assert _pid_alive(grandchild)
    b.teardown(r)
    deadline = time.time() + 10
    while (_pid_alive(grandchild) or _pid_alive(h.pid)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(grandchild)
    assert not _pid_alive(h.pid)
    assert not Path(r.work_dir).exists()
    assert Path(r.artifacts_dir, "output.log").exists()  # artifacts are kept
    b.teardown(r)  # idempotent


def test_submit_reattaches_to_a_running_workload(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    h1 = b.submit(r, [sys.executable, "-c", "import time; time.sleep(30)"], {})
    h2 = b.submit(r, [sys.executable, "-c", "import time; time.sleep(30)"], {})
    assert h2.reattached and h2.pid == h1.pid
    b.cancel(h1)
    st = _wait(b, h1)
    assert st.exit_code is not None and st.exit_code != 0


def test_collect_copies_globs_and_refuses_escaping_symlinks(accel_home, tmp_path):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    work = Path(r.work_dir)
    (work / "out").mkdir()
    (work / "out" / "a.json").write_text("{}")
    (work / "out" / "b.txt").write_text("b")
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, work / "out" / "leak.json")
    dest = Path(r.artifacts_dir) / "files"
    copied = b.collect(r, ["out/*.json"], dest)
    assert copied == ["out/a.json"]
    assert not (dest / "out" / "leak.json").exists()


def test_collect_double_star_takes_files_inside(accel_home):
    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    work = Path(r.work_dir)
    (work / "out" / "sub").mkdir(parents=True)
    (work / "out" / "sub" / "t.pt.trace.json").write_text("{}")
    (work / "out" / "m.jsonl").write_text("")
    copied = b.collect(r, ["out/**"], Path(r.artifacts_dir) / "files")
    assert copied == ["out/m.jsonl", "out/sub/t.pt.trace.json"]


def test_a_setup_command_outliving_its_killed_task_is_stopped(accel_home, tmp_path):
    """The setup task's process is SIGKILLed mid-setup: its command (own session) lives on.
    The retried setup stops it before running again; the teardown stops it too."""
    import signal
    import subprocess

    b = backend_of(LocalBackend, SPEC)
    r = b.provision(_ctx(accel_home))
    pidfile = tmp_path / "setup.pid"
    cmd = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)",
    ]
    task = subprocess.Popen(  # noqa: S603 - the "setup task": runs backend.setup
        [
            sys.executable,
            "-c",
            "import json, sys; from accelmatrix.backends.machine_kinds import get_backend; "
            "from accelmatrix.contracts.machine_records import LocalResource; "
            "get_backend({'backend': 'local'}).setup(LocalResource.model_validate_json("
            "sys.argv[1]), [json.loads(sys.argv[2])], {}, 120, print)",
            json.dumps(r.to_json()),
            json.dumps(cmd),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "plugins")},
    )
    deadline = time.time() + 20
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    setup_pid = int(pidfile.read_text())
    os.kill(task.pid, signal.SIGKILL)
    task.wait(10)
    assert _pid_alive(setup_pid)  # orphaned, as after a real SIGKILL
    b.setup(r, [[sys.executable, "-c", "print('retry')"]], {}, 30, print)  # the retry
    deadline = time.time() + 10
    while _pid_alive(setup_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(setup_pid)
    b.teardown(r)
