"""cluster_validation end to end with `dag.test()`: preflight, success indicators, and the
broken variants (a hang killed early, a rising loss, a collective timeout in the log, a
failed preflight that provisions nothing).

The suite is the shipped include/suites/cluster_validation.yaml with shorter durations and
a `fail_mode` per job value, so each failure is real (a stuck worker, gradient ascent, a
gloo timeout) and the test stays fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from test_dag_local import run_dag, store

from accelmatrix import settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CONN = "AIRFLOW_CONN_ACCELMATRIX_LOCAL_CLUSTER"


def write_suite(
    tmp_path: Path, monkeypatch, jobs: dict[str, str], recur_within: int = 4, **changes
) -> None:
    suite = yaml.safe_load((ROOT / "include" / "suites" / "cluster_validation.yaml").read_text())
    suite["axes"]["job"] = {
        name: {"workers": 2, "batch_size": 64, "fail_mode": mode} for name, mode in jobs.items()
    }
    run = suite["workload"]["run"]
    run[run.index("--quick-seconds") + 1] = "6"
    run[run.index("--checkpoint-every") + 1] = "2"
    run += ["--fail-mode", "${axis.job.fail_mode}"]
    suite["workload"]["hang_detection"]["recur_within"] = recur_within
    suite.update(changes)
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "cluster_validation.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))


def failed_checks(run_id: str, cell: str) -> dict[str, str]:
    checks = store().checks_frame("cluster_validation", run_id)
    bad = checks[(checks.cell_id == cell) & (~checks.passed)]
    return dict(zip(bad.check_name, bad.message, strict=True))


@pytest.mark.slow(40)
def test_healthy_job_passes_and_a_hang_is_killed_early(airflow_db, tmp_path, monkeypatch):
    monkeypatch.setenv(CONN, json.dumps({"conn_type": "generic", "host": "localhost"}))
    write_suite(tmp_path, monkeypatch, {"ok": "none", "hang": "hang"})
    state, run_id, tis = run_dag("cluster_validation")
    cells = {c.cell_id: c for c in store().get_cells("cluster_validation", run_id)}
    assert state == "failed"
    assert tis[("preflight", "-1")] == "success"

    ok = cells["job=ok"]
    assert ok.state == "passed", ok
    checks = store().checks_frame("cluster_validation", run_id)
    passed = set(checks[(checks.cell_id == "job=ok") & checks.passed].check_name)
    assert {
        "all workers started within 30 s",
        "loss decreasing",
        "no collective-communication timeout",
        "throughput per worker above 1000 samples/s",
        "checkpoints saved",
        "job status JSON",
    } <= passed
    art = settings.cell_artifacts_dir("cluster_validation", run_id, "job=ok")
    status = json.loads((art / "files" / "out" / "job_status.json").read_text())
    assert status["job_exists"] is True and status["job_status"]["masterAddr"] == "127.0.0.1"
    assert [c["type"] for c in status["job_status"]["conditions"]] == [
        "Created",
        "PodsRunning",
        "Succeeded",
    ]
    assert [p["phase"] for p in status["pods_info"]] == ["Succeeded", "Succeeded"]
    report = json.loads((art.parent / "preflight.json").read_text())
    assert report["passed"] and len(report["results"]) == 4

    # The hang: worker 1 stops at ~2 s; the step line stops recurring; killed after 4 s of
    # silence, long before the 240 s timeout.
    hang = cells["job=hang"]
    assert hang.state == "hung"
    assert "no log line matched /^step \\d+ loss:/ for" in hang.message
    assert tis[("local-node.run", "job=hang")] == "failed"
    assert tis[("local-node.teardown", "job=hang")] == "success"
    hang_status = json.loads(
        (
            settings.cell_artifacts_dir("cluster_validation", run_id, "job=hang") / "status.json"
        ).read_text()
    )
    assert hang_status["ended_at"] - hang_status["started_at"] < 30


@pytest.mark.slow(40)
def test_rising_loss_and_collective_timeout_fail_their_checks(airflow_db, tmp_path, monkeypatch):
    monkeypatch.setenv(CONN, json.dumps({"conn_type": "generic", "host": "localhost"}))
    # The collective timeout takes 3 s of silence to surface: on a loaded machine a 4 s hang
    # window could call it a hang first, so this test gives the heartbeat more room.
    write_suite(
        tmp_path,
        monkeypatch,
        {"diverge": "diverge", "late": "collective-timeout"},
        recur_within=20,
    )
    state, run_id, _ = run_dag("cluster_validation")
    cells = {c.cell_id: c for c in store().get_cells("cluster_validation", run_id)}
    assert state == "failed"

    assert cells["job=diverge"].state == "failed"
    diverge = failed_checks(run_id, "job=diverge")
    assert set(diverge) == {"loss decreasing"}
    assert "loss did not decrease: mean of the last 3 point(s)" in diverge["loss decreasing"]

    assert cells["job=late"].state == "run_failed"
    late = failed_checks(run_id, "job=late")
    assert (
        "Timed out waiting 3000ms for recv operation" in late["no collective-communication timeout"]
    )
    assert "first at line" in late["no collective-communication timeout"]


def test_failed_preflight_provisions_nothing(airflow_db, tmp_path, monkeypatch):
    monkeypatch.delenv(CONN, raising=False)
    suite = yaml.safe_load((ROOT / "include" / "suites" / "cluster_validation.yaml").read_text())
    write_suite(
        tmp_path,
        monkeypatch,
        {"ok": "none"},
        preflight=[
            *suite["preflight"][:2],
            {
                "name": "storage available",
                "type": "disk_free",
                "path": "${work_root}",
                "min_gb": 1e9,
            },
            {
                "name": "service account",
                "type": "connection",
                "conn_id": "accelmatrix_local_cluster",
            },
        ],
    )
    t0 = time.monotonic()
    state, run_id, tis = run_dag("cluster_validation")
    assert time.monotonic() - t0 < 60
    assert state == "failed"
    assert tis[("preflight", "-1")] == "failed"
    # Nothing was provisioned: no provision, setup, run or collect ran, no work dir exists.
    # (evaluate still runs, like after a failed setup, and keeps the preflight state.)
    for step in ("provision", "setup", "run", "collect", "teardown"):
        states = {st for (task, _), st in tis.items() if task == f"local-node.{step}"}
        assert states <= {"upstream_failed", "skipped", None}, (step, states)
    assert tis[("gate", "-1")] == "failed"
    assert not (settings.work_root() / "cluster_validation" / settings.safe_name(run_id)).exists()
    cell = store().get_cell("cluster_validation", run_id, "job=ok")
    assert cell.state == "preflight_failed" and cell.provisioned_at is None
    assert "storage available: expected >= 1e+09 GB free" in cell.message
    assert "service account: expected Airflow connection 'accelmatrix_local_cluster' defined" in (
        cell.message
    )
    report = json.loads(
        (
            settings.artifacts_dir()
            / "cluster_validation"
            / settings.safe_name(run_id)
            / "preflight.json"
        ).read_text()
    )
    assert [r["passed"] for r in report["results"]] == [True, True, False, False]
