"""Airflow fails a provision task after its machine exists: the run still deletes it.

Airflow skips a cell's teardown when its provision (the setup task) failed, and Airflow
3.3.2 can fail a provision task that already created a machine (its defer/resume race; a
person marking it failed; a lost worker). Real scheduler, triggerer, dag-processor and
api-server; the real gcloud CLI against the Cloud TPU emulator on loopback. A one-cell TPU
suite is triggered; while ``provision`` is deferred (the TPU node exists and is still
CREATING), the task instance is marked failed through REST, as Airflow would fail it.
Then: setup never runs, teardown is skipped, and the gate reaps the node by the run's
labels before the run ends (red), and the results store records what it reaped.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from accelmatrix_testkit import AirflowStack
from accelmatrix_testkit.tpu_emulator import TpuEmulator

# The real gcloud (needs.py group "gcloud") drives the emulator.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("needs_gcloud")]
pytest_plugins = ["tpu_env"]

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "tpu_leftover"
CELL = "x=a"


@pytest.fixture
def slow_tpu(server):
    # Node creation takes 20 s: long enough to fail the deferred provision meanwhile.
    with TpuEmulator(
        op_delay=20, qr_wait=0.3, qr_provision=0.3, authorized_keys=server.authorized_keys
    ) as emu:
        yield emu


@pytest.mark.slow(200)
def test_gate_deletes_the_machine_of_a_provision_airflow_failed(tmp_path, server, slow_tpu):
    suite = {
        "description": "one TPU cell whose provision Airflow fails after the node exists",
        "schedule": None,
        "axes": {"x": ["a"]},
        "machines": {
            "tpu": {
                "backend": "tpu-vm",
                "zone": "us-central2-b",
                "accelerator_type": "v4-8",
                "runtime_version": "tpu-ubuntu2204-base",
                "ssh_user": server.user,
                "ssh_port": server.port,
                "python": sys.executable,
                "work_root": str(tmp_path / "vm"),
                "provision_poll_seconds": 0.5,
                "hourly_cost": 12.0,
            }
        },
        "machine": "tpu",
        "workload": {"run": ["${python}", "-c", "print('Finished training run')"]},
        "checks": [{"type": "log_contains", "pattern": "Finished training run"}],
    }
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    env = {"ACCELMATRIX_GCLOUD_AUTH": "env", **slow_tpu.gcloud_env(tmp_path / "gcloud")}
    with AirflowStack(
        home=tmp_path / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=suites,
        env_extra=env,
        parallelism=4,
    ) as stack:
        stack.create_pool("accelmatrix_tpu", 4, include_deferred=True)
        stack.wait_for_dag(DAG_ID)
        run_id = stack.trigger(DAG_ID)
        ti_path = f"dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/tpu.provision/0"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # provision deferred, the node being created
            ti = stack.api("GET", ti_path, ok=(404,)) or {}  # 404 until plan has expanded
            if ti.get("state") == "deferred" and slow_tpu.state["nodes"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"provision never deferred with a node: {ti}, {slow_tpu.state}")
        node = next(iter(slow_tpu.state["nodes"]))
        stack.api(
            "PATCH", ti_path, json={"new_state": "failed"}, params={"update_mask": "new_state"}
        )
        # Only that create had to be slow: the gate's delete and the second run's create and
        # delete take 5 s each, not 20 (the operation in flight keeps its 20 s).
        slow_tpu.op_delay = 5.0
        state = stack.wait_for_run(DAG_ID, run_id, timeout=300)
        tis = {t["task_id"]: t for t in stack.task_instances(DAG_ID, run_id)}
        gate_log = stack.task_log(DAG_ID, run_id, "gate")
        nodes_after_failed_run = slow_tpu.state["nodes"]

        # The same cell left alone: its provision ends in the triggerer, and the resource
        # record it hands over as XCom (Airflow re-encodes trigger XComs) reaches setup, run,
        # collect and teardown intact.
        ok_run = stack.trigger(DAG_ID)
        ok_state = stack.wait_for_run(DAG_ID, ok_run, timeout=400)
        ok_tis = {t["task_id"]: t for t in stack.task_instances(DAG_ID, ok_run)}
        prov_log = stack.task_log_once_written(
            DAG_ID, ok_run, "tpu.provision", map_index=0, line="Trigger fired event"
        )
        from accelmatrix.results.store import ResultsStore

        store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
        try:
            reaped = store.get_reaped()
            cells = {c.cell_id: c for c in store.get_cells(DAG_ID, run_id)}
            ok_cells = {c.cell_id: c for c in store.get_cells(DAG_ID, ok_run)}
        finally:
            store.close()

    summary = json.dumps({k: v["state"] for k, v in tis.items()})
    assert state == "failed", summary
    assert tis["tpu.provision"]["state"] == "failed", summary
    assert tis["tpu.teardown"]["state"] in ("skipped", "upstream_failed"), summary
    assert tis["gate"]["state"] == "failed", summary
    # The node the failed provision left is gone, deleted by the gate, which says so.
    assert nodes_after_failed_run == {}, nodes_after_failed_run
    assert "reaped tpu-vm" in gate_log and node.rsplit("/", 1)[-1] in gate_log, gate_log[-3000:]
    assert "no teardown deleted it" in gate_log, gate_log[-3000:]
    assert any(r.run_id == run_id for r in reaped), reaped
    # Not "failed" checks on outputs that never existed: the machine never ran the workload.
    assert cells[CELL].state == "infra_failed", (cells[CELL].state, cells[CELL].message)
    assert "the workload never ran" in cells[CELL].message, cells[CELL].message

    ok_summary = json.dumps({k: (v["state"], v["try_number"]) for k, v in ok_tis.items()})
    assert ok_state == "success", ok_summary
    assert {v["state"] for v in ok_tis.values()} == {"success"}, ok_summary
    assert "Pausing task as DEFERRED" in prov_log and "Trigger fired event" in prov_log
    assert prov_log.count("::group::Pre Execute") == 1, prov_log[-3000:]  # no resume
    assert ok_cells[CELL].state == "passed", ok_cells
    assert slow_tpu.state["nodes"] == {}, slow_tpu.state["nodes"]  # torn down
