"""SshBackend against a real OpenSSH server on 127.0.0.1: the LocalBackend tests, over SSH.

The "remote" host is this machine, reached only through sshd: the backend never touches
the remote paths directly, but the tests may (to plant files, or to check with /proc that
a killed process is really gone).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest
from backend_of import backend_of
from pydantic import ValidationError

from accelmatrix.backends.base import BackendError, CellContext, SetupFailed
from accelmatrix.backends.local.processes import pid_alive as _pid_alive
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.backends.machines.ssh import SshMachine
from accelmatrix.backends.ssh import backend as ssh_backend
from accelmatrix.backends.ssh.backend import SshBackend, expand_work_root
from accelmatrix.contracts.machine_records import SshHandle
from accelmatrix.hooks import ssh as ssh_hook

# tests/sshd.py: the session-wide server. Without /usr/sbin/sshd every test that needs it
# is skipped with the reason (install openssh-server); the pure spec tests still run.
pytest_plugins = ["sshd"]
CONN_ID = "accelmatrix_test_ssh"


@pytest.fixture(scope="module")
def server(sshd_server):
    assert sshd_server.conn_id == CONN_ID
    yield sshd_server
    ssh_hook.close_all()  # before sshd stops: no session outlives the module


@pytest.fixture
def spec(server, tmp_path) -> dict:
    machine = SshMachine(
        backend="ssh",
        ssh_conn_id=CONN_ID,
        python=sys.executable,  # the host's python3 may be a shim not on sshd's PATH
        work_root=str(tmp_path / "remote"),
    )
    return machine.model_dump(mode="json")


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


def _first_lines(backend, handle, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines, offset = backend.read_logs(handle, 0)
        if lines:
            return lines, offset
        time.sleep(0.05)
    raise AssertionError("no log line arrived")


def _spawner(python: str) -> list[str]:
    """A workload that forks a sleeping grandchild, prints its pid and sleeps."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    return [python, "-c", code]


def _gone(*pids: int, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while any(_pid_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    return not any(_pid_alive(p) for p in pids)


def test_provision_is_idempotent_and_labelled(accel_home, spec, monkeypatch):
    b = get_backend(spec)
    assert isinstance(b, SshBackend)
    r1 = b.provision(_ctx(accel_home))
    r2 = b.provision(_ctx(accel_home))
    assert r1 == r2  # a retry finds the same resource
    assert r1.work_dir.startswith(
        spec["work_root"] + "/d/manual__2026-01-01T00_00_00_00_00~1e8dc70c2b69/"
    )
    assert Path(r1.work_dir, "resource.json").is_file()
    labels = r1.labels
    assert labels["managed-by"] == "accelmatrix" and labels["cell"] == "model=a"
    assert labels["host"] == "127.0.0.1" and labels["run"] == "manual__2026-01-01T00:00:00+00:00"
    assert int(labels["ttl"]) > time.time()
    assert [m.name for m in b.list_managed()] == [r1.name]
    variables = b.variables(r1)
    assert variables["python"] == sys.executable
    # ${include_dir} works on the host: the include dir was copied there.
    assert Path(variables["include_dir"], "workloads", "train_tiny.py").is_file()


def test_provision_failure_removes_what_it_created(accel_home, spec):
    b = backend_of(SshBackend, spec)
    # An environmental fault half way: the work dir is made, then the cell's artifacts path
    # turns out to be taken by a file (the fault matrix blocks provision the same way).
    ctx = _ctx(accel_home)
    ctx.artifacts_dir.parent.mkdir(parents=True, exist_ok=True)
    ctx.artifacts_dir.write_text("not a directory\n")
    with pytest.raises(FileExistsError):
        b.provision(ctx)
    assert not any(Path(spec["work_root"]).rglob("model=a"))
    assert b.list_managed() == []


def test_provision_refuses_a_python_that_cannot_run_the_runner(accel_home, spec):
    b = backend_of(SshBackend, {**spec, "python": "/nonexistent/python3"})
    with pytest.raises(BackendError, match="not Python >= 3.10"):
        b.provision(_ctx(accel_home))
    assert not any(Path(spec["work_root"]).rglob("resource.json"))


def test_setup_quotes_every_argument_and_env_value(accel_home, spec, tmp_path):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    pwned = tmp_path / "pwned"
    nasty = [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"a; touch {pwned}",
        f"x\ntouch {pwned}",
        'it\'s "quoted"',
        "*",
        "$HOME",
        "  spaced  ",
        "",
    ]
    env = {"NASTY": f"$(touch {pwned}); 'x'\n`y`", "PLAIN": "bar"}
    code = (
        "import json, os, sys\n"
        "print(json.dumps([os.getcwd(), os.environ['NASTY'], os.environ['PLAIN'], sys.argv[1:]]))"
    )
    lines: list[str] = []
    b.setup(r, [[sys.executable, "-c", code, *nasty]], env, 30, lines.append)
    payload = json.loads(next(line for line in lines if line.startswith('["')))
    assert payload == [r.work_dir, env["NASTY"], "bar", nasty]
    assert not pwned.exists()  # nothing was executed
    setup_log = Path(r.artifacts_dir, "setup.log").read_text()
    assert setup_log.startswith("$ ") and "bar" in setup_log


def test_setup_failure_reports_the_tail(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    lines: list[str] = []
    code = "import sys; print('boom'); print('to stderr', file=sys.stderr); raise SystemExit(3)"
    with pytest.raises(SetupFailed, match="exited with 3") as err:
        b.setup(r, [[sys.executable, "-c", code]], {}, 30, lines.append)
    assert "boom" in str(err.value) and "to stderr" in lines
    assert "boom" in Path(r.artifacts_dir, "setup.log").read_text()
    with pytest.raises(SetupFailed, match="exited with 127"):
        b.setup(r, [["no-such-command-accelmatrix"]], {}, 30, lines.append)
    # Commands run in order and stop at the first failure.
    marker = Path(r.work_dir, "second-ran")
    with pytest.raises(SetupFailed):
        b.setup(r, [["false"], ["touch", str(marker)]], {}, 30, lines.append)
    assert not marker.exists()


def test_setup_timeout_kills_the_remote_process_group(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    lines: list[str] = []
    t0 = time.time()
    with pytest.raises(SetupFailed, match="timed out"):
        b.setup(r, [_spawner(sys.executable)], {}, 2, lines.append)
    assert time.time() - t0 < 15
    grandchild = int(next(line for line in lines if line.isdigit()))
    assert _gone(grandchild)


def test_a_setup_command_outliving_its_killed_task_is_stopped_by_the_retry(
    accel_home, spec, tmp_path
):
    """The setup task's process is SIGKILLed mid-setup: the SSH session closes, but its
    remote command (no pty, no SIGHUP) lives on. The retried setup stops it first; before,
    the retry overwrote setup.pgid and the teardown no longer found it (fault matrix)."""
    import subprocess

    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    pidfile = tmp_path / "setup.pid"
    cmd = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)",
    ]
    task = subprocess.Popen(  # noqa: S603 - the "setup task": runs backend.setup over SSH
        [
            sys.executable,
            "-c",
            "import json, sys; from accelmatrix.backends.machine_kinds import get_backend; "
            "from accelmatrix.contracts.machine_records import SshResource; "
            "get_backend(json.loads(sys.argv[1])).setup(SshResource.model_validate_json("
            "sys.argv[2]), [json.loads(sys.argv[3])], {}, 120, print)",
            json.dumps(spec),
            json.dumps(r.to_json()),
            json.dumps(cmd),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "plugins")},
    )
    deadline = time.time() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    setup_pid = int(pidfile.read_text())
    task.kill()
    task.wait(10)
    time.sleep(0.5)
    assert _pid_alive(setup_pid)  # orphaned on the host, as after a real SIGKILL
    said: list[str] = []
    b.setup(r, [[sys.executable, "-c", "print('retry')"]], {}, 30, said.append)  # the retry
    deadline = time.time() + 10
    while _pid_alive(setup_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(setup_pid)
    assert any("an earlier attempt left running" in line for line in said), said
    assert "retry" in said
    b.teardown(r)


def test_run_detached_streams_live_logs_and_records_exit(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    code = (
        "import os, sys, time\n"
        "print('hello', flush=True)\n"
        "sys.stdout.write('part'); sys.stdout.flush()\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        "print('ial', flush=True)\n"
        "print('oops', file=sys.stderr, flush=True)\n"
        "sys.exit(4)\n"
    )
    h = b.submit(r, [sys.executable, "-c", code], {"FOO": "bar"})
    assert not h.reattached and h.pid == h.pgid
    lines, off = _first_lines(b, h)
    assert lines == ["hello"] and off == len("hello\n")  # an incomplete line waits
    assert b.poll(h).done is False
    assert b.read_logs(h, off) == ([], off)
    Path(r.work_dir, "go").touch()
    st = _wait(b, h)
    assert st.done and st.exit_code == 4 and not st.infrastructure_failure
    lines, off2 = b.read_logs(h, off)
    assert "partial" in lines and "oops" in lines
    assert b.read_logs(h, off2) == ([], off2)
    # Evaluation reads the local artifacts dir: collect brings the logs there.
    b.collect(r, [], Path(r.artifacts_dir) / "files")
    art = Path(r.artifacts_dir)
    status = json.loads((art / "status.json").read_text())
    assert status["exit_code"] == 4 and status["ended_at"] >= status["started_at"]
    assert (art / "stderr.log").read_text().strip() == "oops"
    assert "hello" in (art / "output.log").read_text()


def test_workload_env_has_no_airflow_secrets(accel_home, spec, server, monkeypatch):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://u:S3cr3tValueXyz@h/db")
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    h = b.submit(r, [sys.executable, "-c", "import os; print(sorted(os.environ.items()))"], {})
    _wait(b, h)
    lines, _ = b.read_logs(h, 0)
    out = "\n".join(lines)
    assert "S3cr3tValueXyz" not in out and "AIRFLOW_CONN" not in out
    assert _key_body(server) not in out
    assert f"'ACCELMATRIX_WORK_DIR', '{r.work_dir}'" in out


def test_cancel_and_teardown_kill_the_whole_process_group(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    h = b.submit(r, _spawner(sys.executable), {})
    lines, _ = _first_lines(b, h)
    grandchild = int(lines[0])
    assert _pid_alive(grandchild) and _pid_alive(h.pid)
    b.teardown(r)
    assert _gone(grandchild, h.pid)
    assert not Path(r.work_dir).exists()
    art = Path(r.artifacts_dir)
    assert (art / "output.log").read_text().strip() == str(grandchild)  # logs are kept
    assert json.loads((art / "status.json").read_text())["signal"] == signal.SIGTERM
    b.teardown(r)  # idempotent
    b.cancel(h)  # tolerates already-gone


def test_submit_reattaches_to_a_running_workload(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    h1 = b.submit(r, sleeper, {})
    ssh_hook.close_all()  # a retry runs in a new process: no cached connection
    h2 = backend_of(SshBackend, spec).submit(r, sleeper, {})
    assert h2.reattached and h2.pid == h1.pid
    b.cancel(h1)
    st = _wait(b, h1)
    assert st.exit_code is not None and st.exit_code != 0
    # Once it has finished, a new submit starts afresh and keeps the old logs aside.
    h3 = b.submit(r, [sys.executable, "-c", "print('again')"], {})
    assert not h3.reattached and _wait(b, h3).exit_code == 0
    assert any(p.name.startswith("status.json.") for p in Path(h3.log_dir).iterdir())


def test_runner_killed_without_status_is_an_infrastructure_failure(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    h = b.submit(r, [sys.executable, "-c", code], {})
    lines, _ = _first_lines(b, h)
    workload = int(lines[0])
    os.kill(h.pid, signal.SIGKILL)  # the host lost the supervisor: no status is written
    st = _wait(b, h)
    assert st.infrastructure_failure and st.exit_code is None
    assert _pid_alive(workload)  # orphaned, still in the group
    # The retry must not run a second copy beside the orphan: it stops the old group first.
    h2 = b.submit(r, [sys.executable, "-c", "print('fresh')"], {})
    assert not h2.reattached and _gone(workload)
    assert _wait(b, h2).exit_code == 0


def test_collect_copies_globs_and_refuses_escaping_symlinks(accel_home, spec, tmp_path):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    work = Path(r.work_dir)
    (work / "out" / "sub").mkdir(parents=True)
    (work / "out" / "a.json").write_text('{"a": 1}')
    (work / "out" / "b.txt").write_text("b")
    (work / "out" / "sub" / "t.pt.trace.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, work / "out" / "leak.json")
    os.symlink(work / "out" / "b.txt", work / "out" / "inside.json")  # stays inside: fine
    dest = Path(r.artifacts_dir) / "files"
    assert b.collect(r, ["out/*.json"], dest) == ["out/a.json", "out/inside.json"]
    assert (dest / "out" / "a.json").read_text() == '{"a": 1}'
    assert not (dest / "out" / "leak.json").exists()
    assert b.collect(r, ["out/**"], dest) == [
        "out/a.json",
        "out/b.txt",
        "out/inside.json",
        "out/sub/t.pt.trace.json",
    ]
    # The backend's own dir and paths leaving the work dir are never collected.
    assert b.collect(r, [".accelmatrix/**", "../**", "/etc/passwd"], dest) == []


def test_list_managed_sees_every_cell_until_teardown(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r1 = b.provision(_ctx(accel_home, "model=a"))
    r2 = b.provision(_ctx(accel_home, "model=b"))
    managed = {m.name: m for m in b.list_managed()}
    assert set(managed) == {r1.name, r2.name}
    assert managed[r2.name].labels["cell"] == "model=b"
    # What a janitor needs to release it is in the listing.
    b.teardown(managed[r1.name].detail.resource)
    assert [m.name for m in b.list_managed()] == [r2.name]


def test_polls_reuse_one_connection_across_threads(accel_home, spec):
    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    h = b.submit(r, [sys.executable, "-c", "import time; time.sleep(30)"], {})
    transport = ssh_hook.get_host(CONN_ID).client().get_transport()
    with ThreadPoolExecutor(8) as pool:  # the triggerer polls cells from threads
        statuses = list(pool.map(lambda _: b.poll(h), range(24)))
        list(pool.map(lambda _: b.read_logs(h, 0), range(8)))
    assert all(not s.done for s in statuses)
    assert ssh_hook.get_host(CONN_ID).client().get_transport() is transport
    b.cancel(h)
    assert _wait(b, h).done


def test_workload_trigger_streams_an_ssh_cell(accel_home, spec, monkeypatch):
    # The triggerer builds the backend from the machine spec and polls it in threads.
    from accelmatrix.steps.run.trigger import WorkloadTrigger

    b = backend_of(SshBackend, spec)
    r = b.provision(_ctx(accel_home))
    h = b.submit(r, [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], {})
    trigger = WorkloadTrigger(
        machine_spec=spec, handle=h, deadline=time.time() + 30, poll_interval=0.1
    )

    async def first_event():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "exited" and payload["exit_code"] == 3
    assert payload["log_offset"] == len("a\nb\n")


def test_unreachable_host_is_an_infrastructure_failure_after_a_grace(monkeypatch, server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    dead = {**server.connection(), "port": port}
    monkeypatch.setenv("AIRFLOW_CONN_ACCELMATRIX_TEST_DEAD", json.dumps(dead))
    monkeypatch.setattr(ssh_hook, "CONNECT_ATTEMPTS", 1)
    b = backend_of(SshBackend, {"backend": "ssh", "ssh_conn_id": "accelmatrix_test_dead"})
    handle = SshHandle(
        ssh_conn_id="accelmatrix_test_dead",
        host="127.0.0.1",
        work_dir="/nonexistent/w/d/r/c",
        log_dir="/nonexistent",
        status_path="/nonexistent/status.json",
        log_path="/nonexistent/output.log",
        pid=123456,
        pgid=123456,
    )
    st = b.poll(handle)
    assert not st.done and "unreachable" in st.detail
    assert b.read_logs(handle, 7) == ([], 7)
    monkeypatch.setattr(ssh_backend, "UNREACHABLE_GRACE_SECONDS", 0.0)
    st = b.poll(handle)
    assert st.done and st.infrastructure_failure and st.exit_code is None


def test_a_host_with_another_host_key_is_refused(accel_home, spec, server, monkeypatch):
    client_pub = " ".join(server.client_key.with_suffix(".pub").read_text().split()[:2])
    spoofed = server.connection()
    spoofed["extra"]["host_key"] = client_pub  # a valid ed25519 key, but not the server's
    monkeypatch.setenv("AIRFLOW_CONN_ACCELMATRIX_TEST_SPOOFED", json.dumps(spoofed))
    monkeypatch.setattr(ssh_hook, "CONNECT_ATTEMPTS", 1)
    b = backend_of(SshBackend, {**spec, "ssh_conn_id": "accelmatrix_test_spoofed"})
    with pytest.raises(ssh_hook.HostUnavailable, match="does not match") as err:
        b.provision(_ctx(accel_home))
    assert isinstance(err.value.__cause__, paramiko.BadHostKeyException)


def _key_body(server) -> str:
    """A line from the middle of the private key: what a leak would contain."""
    lines = server.private_key.strip().splitlines()
    return lines[len(lines) // 2]


def test_private_key_never_reaches_logs_or_artifacts(
    accel_home, spec, server, tmp_path, caplog, monkeypatch
):
    caplog.set_level("DEBUG")
    # The key_file form of the connection works too.
    key_file_conn = json.dumps(server.connection(key_file=True))
    monkeypatch.setenv("AIRFLOW_CONN_ACCELMATRIX_TEST_SSH_FILE", key_file_conn)
    for conn_id in (CONN_ID, "accelmatrix_test_ssh_file"):
        b = backend_of(SshBackend, {**spec, "ssh_conn_id": conn_id})
        r = b.provision(_ctx(accel_home, f"conn={conn_id}"))
        printed: list[str] = []
        b.setup(r, [["env"]], {}, 30, printed.append)
        h = b.submit(r, [sys.executable, "-c", "import os; print(dict(os.environ))"], {})
        _wait(b, h)
        b.collect(r, ["**"], Path(r.artifacts_dir) / "files")
        b.teardown(r)
        texts = [json.dumps(r.to_json()), json.dumps(h.to_json()), "\n".join(printed), caplog.text]
        texts += [p.read_text(errors="replace") for p in accel_home.rglob("*") if p.is_file()]
        body = _key_body(server)
        assert body and not any(body in t for t in texts)
        assert not any("BEGIN OPENSSH PRIVATE KEY" in t for t in texts)


def test_ssh_machine_spec():
    m = SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "gpu_box"})
    assert (m.python, m.work_root, m.pool_slots, m.hourly_cost) == (
        "python3",
        "~/.accelmatrix/work",
        1,
        0.0,
    )
    assert m.model_dump(mode="json")["resources"]["gpus"] is None
    assert (
        SshMachine.model_validate(
            {"backend": "ssh", "ssh_conn_id": "x", "resources": {"gpus": 2, "gpu_type": "l4"}}
        ).resources.gpus
        == 2
    )
    with pytest.raises(ValidationError, match="Airflow connection"):
        SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "x", "host": "10.0.0.1"})
    with pytest.raises(ValidationError, match="Airflow connection"):
        SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "x", "private_key": "k"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "x", "typo": 1})
    for bad in ("relative/dir", "/a/../b", "/", "~", "~other/w"):
        with pytest.raises(ValidationError):
            SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "x", "work_root": bad})
    for bad_conn in ("", "has space", "a;b"):
        with pytest.raises(ValidationError):
            SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": bad_conn})
    with pytest.raises(ValidationError):
        SshMachine.model_validate({"backend": "ssh", "ssh_conn_id": "x", "python": "py\nrm"})


def test_work_root_expansion_and_work_dir_guard():
    assert expand_work_root("~/.accelmatrix/work", "/home/u") == "/home/u/.accelmatrix/work"
    assert expand_work_root("/srv/w/", "") == "/srv/w"
    with pytest.raises(BackendError):
        expand_work_root("rel", "/home/u")
    for bad in ("/", "/srv", "/srv/w/d/..", "/a/b/c", "relative/a/b/c/d"):
        with pytest.raises(BackendError):
            ssh_backend._checked_work_dir(bad)
