"""The export task in a real DAG run (`dag.test()`, the local_smoke demo suite, whose
diverge cell fails): it runs after the gate decided, the run keeps the gate's verdict, and
the warehouse's view gives every cell the verdict the results store holds. Then a green
run while the warehouse is down: the export task fails alone, its log line holds the
re-export command, and the run stays green."""

from __future__ import annotations

import logging
import socket
import uuid
from pathlib import Path

import pytest

from accelmatrix.results.store import ResultsStore
from accelmatrix.warehouse.config import WarehouseConfig
from accelmatrix.warehouse.export import Warehouse
from accelmatrix_testkit.bq_emulator import PROJECT, BigQueryEmulator, EmulatorVenvError
from accelmatrix_testkit.log_capture import logged

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "local_smoke"


@pytest.fixture(scope="module")
def bq():
    try:
        emulator = BigQueryEmulator()
    except EmulatorVenvError as e:
        from needs import missing

        missing("venv", f"the BigQuery emulator's venv: {e}")
    with emulator:
        yield emulator


@pytest.mark.slow(75)
def test_export_runs_after_the_gate_and_the_view_has_the_demos_verdicts(
    airflow_db, accel_home, bq, monkeypatch
):
    dataset = f"dag_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("ACCELMATRIX_WAREHOUSE_DATASET", f"{PROJECT}.{dataset}")
    monkeypatch.setenv("ACCELMATRIX_WAREHOUSE_ENDPOINT", bq.endpoint)
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=str(ROOT / "dags"), safe_mode=False)
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]
    assert dag.get_task("gate").downstream_task_ids == {"export"}
    assert dag.get_task("export").is_teardown
    dr = dag.test()
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=dr.run_id).one()
        tis = {ti.task_id: ti for ti in run.get_task_instances(session=session)}
        gate, export = tis["gate"], tis["export"]
        # The diverge cell fails: the gate fails the run, and the export runs after it.
        assert (str(run.state), gate.state, export.state) == ("failed", "failed", "success")
        assert export.start_date >= gate.end_date

    store = ResultsStore.from_settings()
    cells = {c.cell_id: c.state for c in store.get_cells(DAG_ID, dr.run_id)}
    assert "failed" in cells.values() and "passed" in cells.values()
    wh = Warehouse(WarehouseConfig.from_env())
    rows = wh.client.query(
        f"SELECT cell_id, verdict, run_state FROM `{wh.dataset_id}.cell_nights` "
        f"WHERE suite = '{DAG_ID}' AND run_id = '{dr.run_id}'"
    ).result()
    got = {r.cell_id: (r.verdict, r.run_state) for r in rows}
    assert got == {cid: (state, "failed") for cid, state in cells.items()}
    assert wh.count("metric_points", f"run_id = '{dr.run_id}'") == len(
        store.get_metrics(DAG_ID, dr.run_id)
    )

    # The warehouse down (nothing listens there): a green run stays green.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("ACCELMATRIX_WAREHOUSE_ENDPOINT", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("ACCELMATRIX_WAREHOUSE_DEADLINE_S", "2")
    with logged("accelmatrix.warehouse", logging.ERROR) as errors:
        green = dag.test(run_conf={"cells": ["model=tiny-mlp,config=baseline"]})
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=green.run_id).one()
        tis = {ti.task_id: ti for ti in run.get_task_instances(session=session)}
        assert (str(run.state), tis["gate"].state, tis["export"].state) == (
            "success", "success", "failed",
        )  # fmt: skip
    # A handler on the logger itself: where Airflow's stdout handler writes depends on
    # which test first loaded Airflow's logging config in this worker, so stdout is not
    # where to look.
    command = f"python -m accelmatrix export --dag-id {DAG_ID} --run-id {green.run_id}"
    assert sum(f"Export it again with: {command}" in e for e in errors) == 1, errors
    assert wh.count("runs", f"run_id = '{green.run_id}'") == 0
