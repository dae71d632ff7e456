"""Fault matrix v2: Airflow's metadata database restarted mid-run, under the CeleryExecutor.

The deployment docker-compose.yaml describes: one PostgreSQL holding Airflow's metadata DB
and the results store, Redis as the broker, two Celery workers. Two local cells run
tests/fault_workload.py's ``slow`` workload. While both run tasks are deferred (the
triggerer follows the workloads), PostgreSQL is stopped with a fast shutdown (every
connection dropped, new ones refused), kept down 20 s and started again on the same port
and data; then the workloads are released.

Airflow's components may exit when their database goes away. docker-compose restarts a
component that exits (``restart: always``), and so does this test, as that supervisor
would, and it reports which ones. What must hold is accelmatrix's part:

* the run ends (success here: nothing else failed), within minutes of the outage;
* each workload started exactly once (no double run across the outage);
* each cell has one results row, ``passed`` only if every task of the cell succeeded,
  with every metric row the workload printed (none lost, none written twice);
* nothing is left: no managed machine, no work dir, no workload process.

Marked ``reliability``: `make reliability` runs it, `make test` does not (about 3 min).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmatrix import settings
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix_testkit import AirflowStack
from accelmatrix_testkit.fault_matrix import leftover_dirs, processes_running

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

pytest_plugins = ["celery_services"]
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("fault_workload.py")
DAG_ID = "metadata_db_restart"
MACHINES = ("a", "b")  # two local machines: one slow cell each
LOSS_RE = r"^step \d+ loss: ([0-9.]+)$"
DOWN_SECONDS = 20


def suite(signals: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(SCRIPT)]
    return {
        "description": "the metadata DB restarted mid-run (tests only)",
        "owners": ["ml-infra"],
        "schedule": None,
        "retries": 1,
        "retry_delay_seconds": 1,
        "axes": {"machine": list(MACHINES), "fault": ["slow"]},
        "machines": {m: {"backend": "local", "hourly_cost": 0.1} for m in MACHINES},
        "workload": {
            "setup": [[*cmd, "setup", "${axis.fault}", str(signals)]],
            "run": [*cmd, "run", "${axis.fault}", str(signals)],
            "timeout": 240,
            "metrics": [{"type": "log_regex", "name": "loss", "pattern": LOSS_RE, "series": True}],
        },
        "checks": [{"type": "log_contains", "pattern": "Finished training run"}],
    }


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what}: not within {timeout} s")


# `make reliability`: on the worker of the fault matrix's per-cell part, after it
# (tests/test_fault_matrix.py), while the other worker runs the run-level part.
@pytest.mark.xdist_group("fault_matrix_per_cell")
@pytest.mark.slow(200)
def test_metadata_db_restart_mid_run_loses_nothing(tmp_path, postgres, redis, monkeypatch):
    signals = tmp_path / "signals"
    signals.mkdir()
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(yaml.safe_dump(suite(signals), sort_keys=False))
    results_url = postgres.url("accelmatrix")
    revived: list[str] = []
    with AirflowStack(
        home=tmp_path / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=suites,
        parallelism=8,
        executor="CeleryExecutor",
        database_url=postgres.url("airflow"),
        celery_broker_url=redis.url,
        celery_workers=2,
        celery_concurrency=2,
        env_extra={
            "ACCELMATRIX_RESULTS_URL": results_url,
            # As docker-compose sets them (docs/deploy.md "api-server restarts"): a task's
            # Execution API calls wait out an api-server that cannot reach its database.
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "12",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "3",
        },
    ) as stack:
        # The test process looks for leftovers where the components keep their machines.
        monkeypatch.setenv("ACCELMATRIX_HOME", str(stack.accel_home))
        for m in MACHINES:
            stack.create_pool(f"accelmatrix_{m}", 4, include_deferred=True)
        stack.wait_for_dag(DAG_ID)
        run_id = stack.trigger(DAG_ID)
        wait_for(
            lambda: all((signals / f"{m}-slow.run").exists() for m in MACHINES),
            180,
            "both workloads running",
        )
        wait_for(
            lambda: (
                sum(
                    t["task_id"].endswith(".run") and t["state"] == "deferred"
                    for t in stack.task_instances(DAG_ID, run_id)
                )
                == len(MACHINES)
            ),
            90,
            "both run tasks deferred",
        )
        t_down = time.monotonic()
        postgres.take_down()
        try:
            time.sleep(DOWN_SECONDS)
        finally:
            postgres.bring_up()
        down = time.monotonic() - t_down
        (signals / "release").touch()
        # The supervisor's loop: restart what exited, until the run has ended.
        deadline = time.monotonic() + 420
        state = None
        while time.monotonic() < deadline:
            revived += stack.revive_exited()
            try:
                state = stack.get_run(DAG_ID, run_id)["state"]
            except Exception:  # noqa: BLE001 - the api-server may still be reconnecting
                state = None
            if state in ("success", "failed"):
                break
            time.sleep(2)
        tis = stack.task_instances(DAG_ID, run_id)
        summary = "\n".join(
            f"{t['task_id']}[{t.get('rendered_map_index') or t['map_index']}] "
            f"{t['state']} try {t['try_number']}"
            for t in tis
        )
        leftover = {
            "machines": [
                r.name
                for r in get_backend({"backend": "local"}).list_managed()
                if r.detail.identity is not None and r.detail.identity.run_id == run_id
            ]
        }
    print(f"PostgreSQL down {down:.0f} s; revived {revived or 'nothing'}; run {state}\n{summary}")

    assert state == "success", f"run ended {state}; revived {revived}\n{summary}"
    # One start per workload: the outage did not make any cell run twice.
    for m in MACHINES:
        starts = (signals / f"{m}-slow.run").read_text().split()
        assert len(starts) == 1, f"{m}: the workload started {len(starts)} times\n{summary}"

    from accelmatrix.results.store import ResultsStore

    store = ResultsStore(results_url)
    try:
        cells = {c.cell_id: c for c in store.get_cells(DAG_ID, run_id)}
        rows = {
            cid: [r for r in store.get_metrics(DAG_ID, run_id, cid) if r.name == "loss"]
            for cid in cells
        }
    finally:
        store.close()
    assert set(cells) == {f"machine={m},fault=slow" for m in MACHINES}, cells
    for m in MACHINES:
        cid = f"machine={m},fault=slow"
        assert cells[cid].state == "passed", cells[cid]
        printed = int((signals / f"{m}-slow.steps").read_text())
        assert len(rows[cid]) == printed, f"{cid}: {len(rows[cid])} rows stored, {printed} printed"
        assert len({r.step for r in rows[cid]}) == printed, f"{cid}: a row written twice"

    # Nothing left: no machine, no work dir, no workload process.
    assert leftover == {"machines": []}, leftover
    assert (
        leftover_dirs(settings.work_root(), settings.safe_name(DAG_ID), settings.safe_name(run_id))
        == []
    )
    left = processes_running(SCRIPT, signals)  # this test's workloads (its signals dir)
    assert left == [], [p.cmdline() for p in left]
    assert stack.leftovers == []
    # Every process the supervisor restarted is named, so a regression in it shows.
    assert all(re.fullmatch(r"[\w-]+ \(exit -?\d+\)", r) for r in revived), revived
