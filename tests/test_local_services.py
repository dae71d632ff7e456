"""workload.services on the local backend: started by setup, ready by probe, stopped by teardown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import CellContext, SetupFailed
from accelmatrix.backends.local.backend import LocalBackend
from accelmatrix.backends.local.processes import pid_alive as _pid_alive
from accelmatrix.contracts.machine_records import ServiceSpec

SERVER = Path(__file__).resolve().parents[1] / "include" / "workloads" / "inference" / "server.py"


def _svc(run, timeout=20):
    return ServiceSpec.model_validate(
        {
            "name": "server",
            "run": run,
            "ready": {"port_file": "server.port", "http_path": "/health", "timeout": timeout},
        }
    )


@pytest.fixture
def resource(accel_home, tmp_path):
    b = backend_of(LocalBackend, {"backend": "local"})
    ctx = CellContext("d", "r", "c", artifacts_dir=tmp_path / "art")
    return b, b.provision(ctx)


def test_service_is_recorded_and_killed_by_teardown_after_a_crash(resource):
    b, res = resource
    lines = []
    argv = [
        sys.executable,
        str(SERVER),
        "--model",
        "m",
        "--port-file",
        f"{res.work_dir}/server.port",
    ]
    started = b.start_services(res, [_svc(argv)], {"CUDA_VISIBLE_DEVICES": "-1"}, lines.append)
    pid = started[0].pid
    assert _pid_alive(pid) and started[0].port > 0
    assert any("ready on 127.0.0.1:" in x for x in lines)
    # The record on disk knows the service: a teardown from a fresh worker (only the XCom
    # copy of the resource, which predates the service) still stops it.
    record = json.loads((Path(res.work_dir) / "resource.json").read_text())
    assert record["services"][0]["pgid"] == pid
    b.teardown(res.model_copy())
    assert not _pid_alive(pid)
    assert "server stopped" in (Path(res.artifacts_dir) / "service-server.log").read_text()


def test_service_that_dies_fails_setup_with_its_log(resource):
    b, res = resource
    argv = [sys.executable, "-c", "import sys; print('bad model path'); sys.exit(2)"]
    with pytest.raises(SetupFailed, match="exited before it was ready(.|\n)*bad model path"):
        b.start_services(res, [_svc(argv)], {}, lambda _: None)


def test_service_never_ready_is_killed(resource):
    b, res = resource
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(SetupFailed, match="not ready after 1 s"):
        b.start_services(res, [_svc(argv, timeout=1)], {}, lambda _: None)
    pid = json.loads((Path(res.work_dir) / "resource.json").read_text())["services"][0]["pid"]
    assert not _pid_alive(pid)
    b.teardown(res)


def test_backends_without_services_refuse():
    from accelmatrix.backends.ssh.backend import SshBackend

    b = SshBackend.__new__(SshBackend)
    with pytest.raises(SetupFailed, match="does not support workload.services"):
        b.start_services(None, [_svc(["x"])], {}, lambda _: None)
