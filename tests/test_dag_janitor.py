"""The janitor DAG under `dag.test()`: the Task SDK owner lookup against real DAG runs.

First a manual run with no conf: a dry run (the default for a person clicking trigger),
which records what it would reap and deletes nothing. Then an orphan is planted whose DAG
run exists and is finished (that first janitor run), and a run with ``dry_run: false``
reaps both orphans, keeps the fresh and the unmanaged resource, and records why.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import CellContext
from accelmatrix.backends.local.backend import LocalBackend
from accelmatrix.contracts.machine_records import LocalResource

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "accelmatrix_janitor"


def _plant(home: Path, dag: str, run: str, cell: str, ttl: int) -> LocalResource:
    ctx = CellContext(dag, run, cell, home / "artifacts" / cell, ttl_seconds=ttl)
    ctx.labels = {"task-group": "cpu", "map-index": "0"}
    return backend_of(LocalBackend, {"backend": "local"}).provision(ctx)


def test_janitor_dag_dry_run_then_reaps(airflow_db, accel_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from accelmatrix import settings
    from accelmatrix.results.store import ResultsStore

    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "tiny_local.yaml").write_text(
        textwrap.dedent(
            """
            axes: {n: [1]}
            machines: {cpu: {backend: local}}
            workload: {run: [python, -c, pass]}
            """
        )
    )
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    orphan = _plant(accel_home, "gone_suite", "manual__2026-01-01T00:00:00+00:00", "a=1", -60)
    fresh = _plant(accel_home, "gone_suite", "manual__2026-01-02T00:00:00+00:00", "a=2", 3600)
    stranger = settings.work_root() / "x" / "y" / "z"
    stranger.mkdir(parents=True)
    (stranger / "resource.json").write_text(json.dumps({"labels": {"ttl": "1"}}))

    bag = DagBag(dag_folder=str(ROOT / "dags"), safe_mode=False)
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]

    first = dag.test()
    assert str(first.state) == "success"
    store = ResultsStore.from_settings()
    rows = store.get_reaped(backend="local")
    assert [(r.name, r.dry_run) for r in rows] == [(orphan.name, True)]
    assert Path(orphan.work_dir).is_dir()  # a dry run deletes nothing

    # An orphan of a run that exists and has finished: the first janitor run itself.
    finished = _plant(accel_home, DAG_ID, first.run_id, "b=1", -60)
    second = dag.test(run_conf={"dry_run": False})
    assert str(second.state) == "success"
    assert not Path(orphan.work_dir).exists()
    assert not Path(finished.work_dir).exists()
    assert Path(fresh.work_dir, "resource.json").is_file()
    assert (stranger / "resource.json").is_file()
    rows = {r.name: r for r in store.get_reaped(backend="local") if not r.dry_run}
    assert set(rows) == {orphan.name, finished.name}
    assert "does not exist" in rows[orphan.name].reason
    assert f"{first.run_id} is success" in rows[finished.name].reason
