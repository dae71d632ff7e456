"""Whole cells through the DAG (`dag.test()`) on the SSH and Cloud TPU VM backends.

Every task runs for real: ProvisionOperator (deferring to ProvisionTrigger for the TPU),
setup over SSH, RunWorkloadOperator streaming the remote log through WorkloadTrigger,
collect, Great Expectations, teardown, gate. The SSH host is the loopback sshd; the TPU is
the emulator driven by the real gcloud, its "VM" the same sshd.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from test_dag_local import ROOT, run_dag, store

from accelmatrix import settings
from accelmatrix.backends.tpu_vm import ssh_keys

pytest_plugins = ["tpu_env"]
pytestmark = pytest.mark.integration


def test_ssh_example_suite_end_to_end(airflow_db, server, tmp_path, monkeypatch):
    """include/suites/ssh_localhost.yaml as shipped, only its work root moved into tmp."""
    suite = yaml.safe_load((ROOT / "include" / "suites" / "ssh_localhost.yaml").read_text())
    suite["machines"]["localhost"]["work_root"] = str(tmp_path / "remote")
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "ssh_localhost.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    monkeypatch.setenv("AIRFLOW_CONN_ACCELMATRIX_LOCALHOST", json.dumps(server.connection()))

    state, run_id, tis = run_dag("ssh_localhost")
    cells = {c.cell_id: c for c in store().get_cells("ssh_localhost", run_id)}
    assert state == "success", cells
    assert set(cells) == {"optimizer=sgd,batch=b64", "optimizer=slow-sgd,batch=b64"}
    for cid, row in cells.items():
        assert row.state == "passed" and row.backend == "ssh", row
        for step in ("provision", "setup", "run", "collect", "evaluate", "teardown"):
            assert tis[(f"localhost.{step}", cid)] == "success", (step, cid)
        art = settings.cell_artifacts_dir("ssh_localhost", run_id, cid)
        assert "Finished training run" in (art / "output.log").read_text()
        assert (art / "files" / "out" / "summary.json").exists()
    assert not list((tmp_path / "remote").glob("*/*/*"))  # every cell's dir removed


TPU_SUITE = {
    "description": "cells on a Cloud TPU VM (the emulator), run over SSH",
    "axes": {"mode": {"ok": {"code": 0}, "crash": {"code": 3}}},
    "machines": {},
    "machine": "v4",
    "workload": {
        "setup": [["${python}", "-c", "print('setup on', '${num_workers}', 'worker(s)')"]],
        "run": [
            "${python}",
            "-c",
            "import sys; print('step 1 loss: 0.5', flush=True); print('Finished training run');"
            " sys.exit(${axis.mode.code})",
        ],
        "timeout": 60,
    },
    "checks": [{"type": "log_contains", "pattern": "Finished training run"}],
}


@pytest.mark.slow(90)
def test_tpu_cells_end_to_end_and_an_infrastructure_failure(
    airflow_db, server, emu, gcloud_in_environ, tmp_path, monkeypatch
):
    machine = {
        "backend": "tpu-vm",
        "zone": "us-central2-b",
        "accelerator_type": "v4-16",  # two workers: setup and run on both
        "runtime_version": "tpu-ubuntu2204-base",
        "capacity": "spot",
        "ssh_user": server.user,
        "ssh_port": server.port,
        "python": sys.executable,
        "work_root": str(tmp_path / "vm"),
        "provision_poll_seconds": 0.3,
        "node_check_seconds": 2,
        "hourly_cost": 36.0,
    }
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "tpu_cells.yaml").write_text(
        yaml.safe_dump({**TPU_SUITE, "machines": {"v4": machine}}, sort_keys=False)
    )
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))

    state, run_id, tis = run_dag("tpu_cells")
    cells = {c.cell_id: c for c in store().get_cells("tpu_cells", run_id)}
    assert state == "failed"  # the crash cell is a test failure: the gate fails the run
    ok, crash = cells["mode=ok"], cells["mode=crash"]
    assert ok.state == "passed" and ok.backend == "tpu-vm"
    assert crash.state == "run_failed" and crash.exit_code == 3
    assert tis[("v4.run", "mode=crash")] == "failed"
    for cid in cells:
        assert tis[("v4.provision", cid)] == "success"
        assert tis[("v4.teardown", cid)] == "success"
        assert cells[cid].cost > 0  # resource-held seconds x the machine's hourly cost
        art = settings.cell_artifacts_dir("tpu_cells", run_id, cid)
        assert "setup on 2 worker(s)" in (art / "setup.log").read_text()
        assert (art / "workers" / "1" / "output.log").exists()
    assert emu.state["nodes"] == {}  # every node deleted by its teardown
    keys = ssh_keys.key_dir()
    assert not (keys.exists() and any(keys.iterdir()))  # each node's key went with it
    created = [r for r in emu.requests("POST") if r["path"].endswith("/nodes")]
    assert len(created) == 2  # one node per cell, none created twice

    # Quota exhausted: provision fails as infrastructure, nothing is left, no teardown needed.
    emu.reset()
    emu.set_faults(quota_exceeded=True)
    state, run_id, tis = run_dag("tpu_cells")
    cells = {c.cell_id: c for c in store().get_cells("tpu_cells", run_id)}
    assert state == "failed"
    for cid, row in cells.items():
        assert row.state == "infra_failed" and "quota" in row.message.lower(), row
        assert tis[("v4.provision", cid)] == "failed"
        assert tis[("v4.run", cid)] == "upstream_failed"
    assert emu.state["nodes"] == {}


@pytest.mark.slow(100)
def test_preempted_tpu_is_replaced_and_the_run_retried(
    airflow_db, server, emu, gcloud_in_environ, tmp_path, monkeypatch
):
    """Preemption mid-run: an infrastructure failure, retried on a fresh node of the same
    name (setup again, workload again), never counted as a test failure."""
    import threading
    import time

    machine = {
        "backend": "tpu-vm",
        "zone": "us-central2-b",
        "accelerator_type": "v4-8",
        "runtime_version": "tpu-ubuntu2204-base",
        "capacity": "preemptible",
        "ssh_user": server.user,
        "ssh_port": server.port,
        "python": sys.executable,
        "work_root": str(tmp_path / "vm"),
        "provision_poll_seconds": 0.3,
        "node_check_seconds": 1,
    }
    suite = {
        **TPU_SUITE,
        "axes": {"mode": {"ok": {"code": 0}}},
        "machines": {"v4": machine},
        "retries": 1,
        "retry_delay_seconds": 1,
    }
    suite["workload"] = {
        **TPU_SUITE["workload"],
        "run": [
            "${python}",
            "-c",
            "import time; print('step 1 loss: 0.5', flush=True); time.sleep(6);"
            " print('Finished training run')",
        ],
    }
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "tpu_preempt.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))

    preempted: list[str] = []

    def preempt_first_node_once_running() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not preempted:
            for full, node in emu.state["nodes"].items():
                status = list((tmp_path / "vm").glob("**/.accelmatrix/logs/status.json"))
                if node["state"] == "READY" and status:
                    emu.preempt(full.rsplit("/", 1)[-1])
                    preempted.append(full)
                    return
            time.sleep(0.2)

    watcher = threading.Thread(target=preempt_first_node_once_running, daemon=True)
    watcher.start()
    state, run_id, tis = run_dag("tpu_preempt")
    watcher.join(timeout=5)
    assert preempted, "the workload never started on a READY node"
    (cell,) = store().get_cells("tpu_preempt", run_id)
    assert state == "success" and cell.state == "passed", cell
    assert tis[("v4.run", "mode=ok")] == "success"
    created = [r for r in emu.requests("POST") if r["path"].endswith("/nodes")]
    assert len(created) == 2  # the preempted node, then its replacement (same name)
    art = settings.cell_artifacts_dir("tpu_preempt", run_id, "mode=ok")
    assert "Finished training run" in (art / "output.log").read_text()
    assert emu.state["nodes"] == {}
