"""local_smoke under the CeleryExecutor: PostgreSQL metadata DB, Redis broker, two workers.

The configuration docker-compose.yaml deploys (CeleryExecutor, ``redis://`` broker,
``db+postgresql://`` result backend, results store on PostgreSQL), started here from
Debian's postgresql and redis-server packages on loopback. Proves what the LocalExecutor
test cannot: tasks of one run spread over two workers that share nothing but the log
folder, the broker and the databases; a deferred ``run`` resumed on whichever worker is
free still gets its workload's log; the results rows land in PostgreSQL (upserts and
advisory locks of the store's PostgreSQL path) and agree with Airflow.
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest

from accelmatrix_testkit import AirflowStack

pytest_plugins = ["celery_services"]
ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "local_smoke"
GOOD = "model=tiny-mlp,config=baseline"
BAD = "model=tiny-mlp,config=diverge"


def test_stack_executor_settings(tmp_path):
    """The default stack is unchanged; the Celery one drops the SQLite-only settings."""
    local = AirflowStack(home=tmp_path / "a", dags_folder=ROOT / "dags")
    assert local.env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert local.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:///")
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" in local.env
    assert not any(k.startswith("AIRFLOW__CELERY__") for k in local.env)
    assert local.celery_worker_names == ()

    db = "postgresql+psycopg2://u:p@127.0.0.1:5999/airflow"
    celery = AirflowStack(
        home=tmp_path / "b",
        dags_folder=ROOT / "dags",
        executor="CeleryExecutor",
        database_url=db,
        celery_broker_url="redis://127.0.0.1:6999/0",
        celery_workers=3,
    )
    assert celery.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert celery.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == db
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in celery.env
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC" not in celery.env
    assert celery.env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6999/0"
    assert celery.env["AIRFLOW__CELERY__RESULT_BACKEND"] == f"db+{db}"
    assert celery.celery_worker_names == ("celery-1", "celery-2", "celery-3")
    # docker-compose.yaml's Celery config: Airflow's default plus the preloading worker hook.
    assert (
        celery.env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"]
        == "accelmatrix.deploy.celery_config.CELERY_CONFIG"
    )
    with pytest.raises(ValueError, match="celery_broker_url"):
        AirflowStack(
            home=tmp_path / "c",
            dags_folder=ROOT / "dags",
            executor="CeleryExecutor",
            database_url=db,
        )
    with pytest.raises(ValueError, match="PostgreSQL"):
        AirflowStack(
            home=tmp_path / "d",
            dags_folder=ROOT / "dags",
            executor="CeleryExecutor",
            celery_broker_url="redis://127.0.0.1:6999/0",
        )
    with pytest.raises(ValueError, match="executor"):
        AirflowStack(home=tmp_path / "e", dags_folder=ROOT / "dags", executor="KubernetesExecutor")


def test_services_start_on_loopback_and_stop_by_pid(postgres, redis):
    import psycopg2

    pids = {postgres.proc.pid, redis.proc.pid}
    assert redis.ping()
    conn = psycopg2.connect(postgres.url("accelmatrix").replace("+psycopg2", ""))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('listen_addresses')")
            assert cur.fetchone()[0] == "127.0.0.1"
            cur.execute("SELECT datname FROM pg_database")
            assert {"airflow", "accelmatrix"} <= {r[0] for r in cur.fetchall()}
    finally:
        conn.close()
    for server in (postgres, redis):
        listening = {
            c.laddr.ip
            for c in psutil.Process(server.proc.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, listening
    data_dir = postgres.dir
    postgres.stop()
    redis.stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
    assert data_dir is not None and not data_dir.exists()
    assert postgres.killed == [] and redis.killed == []  # both left on the polite signal


@pytest.mark.integration
@pytest.mark.slow(130)
def test_local_smoke_on_celery_with_two_workers(tmp_path, postgres, redis):
    results_url = postgres.url("accelmatrix")
    with AirflowStack(
        home=tmp_path / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=ROOT / "include" / "suites",
        parallelism=8,
        executor="CeleryExecutor",
        database_url=postgres.url("airflow"),
        celery_broker_url=redis.url,
        celery_workers=2,
        celery_concurrency=2,
        env_extra={"ACCELMATRIX_RESULTS_URL": results_url},
    ) as stack:
        assert stack.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert stack.env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
        assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in stack.env  # SQLite only
        workers = set(stack.celery_worker_names)
        assert workers == {"celery-1", "celery-2"}
        stack.create_pool("accelmatrix_cpu_small", 3, include_deferred=True)
        run_id = stack.trigger(DAG_ID, conf={"cells": ["model=tiny-mlp,*"]})
        state = stack.wait_for_run(DAG_ID, run_id, timeout=150)
        tis = stack.task_instances(DAG_ID, run_id)
        by_cell = {
            (ti["task_id"].rsplit(".", 1)[-1], ti["rendered_map_index"]): ti
            for ti in tis
            if ti["map_index"] >= 0
        }
        raced = stack.stale_success_failures()
        good_run = by_cell[("run", GOOD)]
        run_log = stack.task_log_once_written(
            DAG_ID,
            run_id,
            "cpu-small.run",
            map_index=good_run["map_index"],
            try_number=good_run["try_number"],
            line="Trigger fired event",
            after="Pausing task as DEFERRED",
        )
        worker_pids = {name: stack.procs[name].pid for name in workers}
        worker_logs = {
            n: (stack.logs_dir / f"{n}.log").read_text(errors="replace") for n in workers
        }
        evaluate_logs = {
            cell: stack.task_log(
                DAG_ID,
                run_id,
                "cpu-small.evaluate",
                map_index=by_cell[("evaluate", cell)]["map_index"],
                try_number=by_cell[("evaluate", cell)]["try_number"],
            )
            for cell in (GOOD, BAD)
        }
        print(
            f"migrate {stack.migrate_seconds:.1f} s, startup {stack.startup_seconds:.1f} s, "
            f"run {good_run['start_date']} .. {stack.get_run(DAG_ID, run_id)['end_date']}"
        )
    assert stack.leftovers == []
    assert stack.procs == {}  # workers included: every component was stopped

    states = {
        (ti["task_id"], ti["rendered_map_index"] or ti["map_index"]): ti["state"] for ti in tis
    }
    summary = "\n".join(f"{k}: {v}" for k, v in sorted(states.items(), key=str))
    # Airflow 3.3.2's defer/resume race (see tests/test_real_scheduler.py): named, never
    # tolerated.
    summary += f"\nscheduler's stale-success failures (defer/resume race): {sorted(raced)}"

    def expect(ti: dict, state: str) -> None:
        assert ti["state"] == state, f"{ti['task_id']} {ti['rendered_map_index']}\n{summary}"

    assert state == "failed", summary  # the diverge cell fails its checks by design
    assert states[("plan", -1)] == "success", summary
    assert states[("gate", -1)] == "failed", summary
    mapped = [ti for ti in tis if ti["map_index"] >= 0]
    assert {ti["rendered_map_index"] for ti in mapped} == {GOOD, BAD}, summary
    assert len(mapped) == 2 * 6, summary
    for cell in (GOOD, BAD):
        expect(by_cell[("teardown", cell)], "success")
        expect(by_cell[("run", cell)], "success")
    expect(by_cell[("evaluate", GOOD)], "success")
    expect(by_cell[("evaluate", BAD)], "failed")

    # Every task ran on a Celery worker of this stack, and both workers took tasks.
    hosts = {ti["hostname"] for ti in tis if ti["state"] in ("success", "failed")}
    names = {h.split("@", 1)[0] for h in hosts}
    assert names == workers, f"task hostnames {sorted(hosts)} (worker pids {worker_pids})"

    # The run task deferred to the triggerer and its workload's lines reached its log.
    assert good_run["try_number"] == 1
    # The workload's lines reach the run task's log live: from the run task's own
    # first seconds of watching or, once it deferred, from WorkloadTrigger (which then
    # ends the task: no resume).
    if "Pausing task as DEFERRED" in run_log:
        assert "Trigger fired event" in run_log, run_log[-3000:]
        assert run_log.count("::group::Pre Execute") == 1, run_log[-3000:]
    assert re.search(r"(RunWorkloadOperator|WorkloadTrigger)\] step 5 loss:", run_log), run_log
    assert "Finished training run" in run_log, run_log

    # Each worker preloaded the task side before forking its pool (accelmatrix.deploy.celery_config),
    # so evaluate judged its cell in its own task process: one start, no deferral.
    for name, text in worker_logs.items():
        assert "preloaded the accelmatrix task side" in text, f"{name}: {text[-3000:]}"
    for log in evaluate_logs.values():
        assert log.count("::group::Pre Execute") == 1, log[-3000:]
        assert "Pausing task as DEFERRED" not in log, log[-3000:]
        assert "evaluating in this task process" in log, log[-3000:]
    assert "check(s) failed" in evaluate_logs[BAD], evaluate_logs[BAD][-3000:]

    # The results are in PostgreSQL, not in a SQLite file in the accelmatrix home.
    assert not (tmp_path / "airflow" / "accelmatrix" / "results.db").exists()
    from accelmatrix.results.store import ResultsStore

    store = ResultsStore(results_url)
    try:
        assert store.dialect == "postgresql"
        cells = {c.cell_id: c for c in store.get_cells(DAG_ID, run_id)}
    finally:
        store.close()
    # The plan records every cell of the suite; only the two selected ones ran.
    assert {GOOD, BAD} <= set(cells), cells
    others = {c: v.state for c, v in cells.items() if c not in (GOOD, BAD)}
    assert not {"passed", "failed"} & set(others.values()), others
    assert cells[BAD].state == "failed", cells[BAD]
    assert cells[GOOD].resource_held_seconds is not None
    assert cells[GOOD].state == "passed", (cells[GOOD], summary)
