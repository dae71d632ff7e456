"""End to end with `dag.test()`: real processes, real Great Expectations, real results store.

Every task of every cell runs (plan, provision, setup, run with its trigger, collect,
evaluate, teardown, gate); the assertions read Airflow's metadata DB and the results store.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from accelmatrix import settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_dag(dag_id: str, conf: dict | None = None):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"), safe_mode=False)
    assert bag.import_errors == {}
    dr = bag.dags[dag_id].test(run_conf=conf)
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=dr.run_id).one()
        raw = {
            (ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances(session=session)
        }
    # Name mapped task instances by cell id (a task that never ran has no rendered name).
    index_to_cell = {
        c.cell_index: c.cell_id
        for c in store().get_cells(dag_id, dr.run_id)
        if c.cell_index is not None
    }
    tis = {(t, index_to_cell.get(i, str(i))): st for (t, i), st in raw.items()}
    return str(dr.state), dr.run_id, tis


def store():
    from accelmatrix.results.store import ResultsStore

    return ResultsStore.from_settings()


@pytest.mark.slow(50)
def test_local_smoke_end_to_end(airflow_db):
    state, run_id, tis = run_dag("local_smoke")
    s = store()
    cells = {c.cell_id: c for c in s.get_cells("local_smoke", run_id)}

    good = ["model=tiny-mlp,config=baseline", "model=tiny-wide,config=baseline"]
    bad = "model=tiny-mlp,config=diverge"
    excluded = "model=tiny-wide,config=diverge"

    # The gate turns the run red because one non-quarantined cell failed.
    assert state == "failed"
    assert tis[("gate", "-1")] == "failed"
    assert tis[("plan", "-1")] == "success"

    for cid in good:
        assert cells[cid].state == "passed", cells[cid]
        for step in ("provision", "setup", "run", "collect", "evaluate", "teardown"):
            assert tis[(f"cpu-small.{step}", cid)] == "success", (step, cid)
    assert cells[bad].state == "failed"
    assert tis[("cpu-small.evaluate", bad)] == "failed"
    assert tis[("cpu-small.teardown", bad)] == "success"
    assert cells[excluded].state == "excluded"
    assert "one diverging cell" in cells[excluded].excluded_reason

    checks = s.checks_frame("local_smoke", run_id)
    failed = set(checks[(checks.cell_id == bad) & (~checks.passed)].check_name)
    assert "final loss below 1.5" in failed
    assert checks[checks.cell_id.isin(good)].passed.all()
    assert {"exit_status", "log_contains", "artifact_count", "step_time_within_bounds"} <= set(
        checks.check_type
    )

    metrics = s.metrics_frame("local_smoke", run_id)
    for cid in good:
        m = metrics[metrics.cell_id == cid]
        assert len(m[m.name == "loss"]) == 20  # one point per training step
        step_time = m[m.name == "step_time"].value.iloc[0]
        assert 0 < step_time < 0.5

    run_dir = settings.artifacts_dir() / "local_smoke" / settings.safe_name(run_id)
    index = (run_dir / "index.html").read_text()
    assert all(cid in index for cid in [*good, bad, excluded])
    assert "final loss below 1.5" in index and "data_docs/index.html" in index

    for cid in [*good, bad]:
        row = cells[cid]
        assert row.teardown_at is not None  # teardown ran for every provisioned cell
        assert row.resource_held_seconds >= row.workload_seconds > 0
        art = settings.cell_artifacts_dir("local_smoke", run_id, cid)
        status = json.loads((art / "status.json").read_text())
        assert status["exit_code"] == 0 and not _alive(status["pid"])
        assert (art / "data_docs" / "index.html").exists()
        assert (art / "files" / "out").is_dir()
        tm = json.loads((art / "train_metrics.json").read_text())
        assert tm["step_execution_time"] > 0
        work = settings.work_root() / "local_smoke" / settings.safe_name(run_id) / cid
        assert not work.exists()


FAILING_SUITE = """
description: cells that fail in different ways
axes:
  mode:
    ok: {code: "print('fine'); print('Finished training run')"}
    crash: {code: "import sys; print('about to fail', flush=True); sys.exit(3)"}
    hang: {code: "import time; print('started', flush=True); time.sleep(600)"}
    forever: {code: "import time\\nwhile True: print('tick', flush=True); time.sleep(0.5)"}
    badsetup: {code: "print('never runs')"}
machines:
  cpu:
    backend: local
machine: cpu
quarantine:
  - cells: mode=ok
    reason: quarantined cells still run and report
workload:
  setup:
    - ["${python}", "-c", "import sys; sys.exit(0 if '${axis.mode}' != 'badsetup' else 5)"]
  run: ["${python}", "-c", "${axis.mode.code}"]
  timeout: 8
  hang_detection: {pattern: "^tick$", start_within: 3, recur_within: 3}
checks:
  - {type: log_contains, pattern: Finished training run}
"""


@pytest.mark.slow(40)
def test_failing_workloads_timeouts_and_setup(airflow_db, tmp_path, monkeypatch):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "failing_cells.yaml").write_text(textwrap.dedent(FAILING_SUITE))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))

    state, run_id, tis = run_dag("failing_cells")
    cells = {c.cell_id: c for c in store().get_cells("failing_cells", run_id)}
    assert state == "failed"

    # Non-zero exit: the run task fails with the exit code; checks still evaluated.
    assert tis[("cpu.run", "mode=crash")] == "failed"
    assert cells["mode=crash"].state == "run_failed"
    assert cells["mode=crash"].exit_code == 3
    assert "exited with 3" in cells["mode=crash"].message

    # Silent past the hang-detection window: killed early, teardown ran, nothing left.
    assert tis[("cpu.run", "mode=hang")] == "failed"
    assert cells["mode=hang"].state == "hung"
    assert "no log line matched /^tick$/" in cells["mode=hang"].message

    # Alive (ticking) but past the timeout: killed at the timeout.
    assert cells["mode=forever"].state == "timed_out"
    forever = settings.cell_artifacts_dir("failing_cells", run_id, "mode=forever")
    assert not _alive(json.loads((forever / "status.json").read_text())["pid"])
    assert tis[("cpu.teardown", "mode=forever")] == "success"
    art = settings.cell_artifacts_dir("failing_cells", run_id, "mode=hang")
    status = json.loads((art / "status.json").read_text())
    assert not _alive(status["pid"])
    assert "started" in (art / "output.log").read_text()
    assert tis[("cpu.teardown", "mode=hang")] == "success"

    # Setup failure: run never starts, teardown still runs, the cell says why.
    assert tis[("cpu.setup", "mode=badsetup")] == "failed"
    assert tis[("cpu.run", "mode=badsetup")] == "upstream_failed"
    assert tis[("cpu.teardown", "mode=badsetup")] == "success"
    assert cells["mode=badsetup"].state == "setup_failed"

    # The quarantined cell passed here; a quarantined failure would not fail the gate.
    assert cells["mode=ok"].state == "passed"
    for cid in cells:
        assert cells[cid].teardown_at is not None, cid
    assert sys.executable  # keep the interpreter import used above honest
