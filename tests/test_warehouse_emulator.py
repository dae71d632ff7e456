"""The warehouse export against a real BigQuery emulator (bqemulator on loopback, its own
venv: tests/accelmatrix_testkit/bq_emulator.py), from a results store filled with runs the
way the steps write them. Every count is exact: 0 duplicated and 0 missing rows after
re-exports, a re-run cell, a backfill and an outage.

One emulator for the module (about 5 s to start once its venv exists), a dataset per test.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.results.store import ResultsStore
from accelmatrix.warehouse.config import WarehouseConfig
from accelmatrix.warehouse.export import Warehouse, export_after_gate, export_runs
from accelmatrix.warehouse.rows import TABLES, bigquery_fields
from accelmatrix_testkit.bq_emulator import PROJECT, BigQueryEmulator, EmulatorVenvError
from accelmatrix_testkit.warehouse_runs import expected_rows, fill_run

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
NIGHT = datetime(2026, 11, 20, 2, 0, tzinfo=UTC)
PER_RUN = ("runs", "cells", "metric_points", "check_verdicts")
KEYS = {
    "runs": "suite, run_id",
    "cells": "suite, run_id, cell_id",
    "metric_points": "suite, run_id, cell_id, metric, IFNULL(step, -1)",
    "check_verdicts": "suite, run_id, cell_id, check_name",
}


@pytest.fixture(scope="module")
def bq():
    try:
        emulator = BigQueryEmulator()
    except EmulatorVenvError as e:
        from needs import missing

        missing("venv", f"the BigQuery emulator's venv: {e}")
    with emulator:
        yield emulator


@pytest.fixture
def store(tmp_path) -> ResultsStore:
    return ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")


def _env(bq, dataset: str, deadline: float = 10.0) -> dict[str, str]:
    return {
        "ACCELMATRIX_WAREHOUSE_DATASET": f"{PROJECT}.{dataset}",
        "ACCELMATRIX_WAREHOUSE_ENDPOINT": bq.endpoint,
        "ACCELMATRIX_WAREHOUSE_DEADLINE_S": str(deadline),
    }


@pytest.fixture
def config(bq) -> WarehouseConfig:
    return WarehouseConfig.from_env(_env(bq, f"t_{uuid.uuid4().hex[:10]}"))


def counts(wh: Warehouse, dag_id: str, run_id: str) -> dict[str, int]:
    return {t: wh.count(t, f"suite = '{dag_id}' AND run_id = '{run_id}'") for t in PER_RUN}


def duplicates(wh: Warehouse) -> int:
    """Rows beyond the first of each key, over every per-run table."""
    total = 0
    for table, key in KEYS.items():
        q = (
            f"SELECT IFNULL(SUM(n - 1), 0) AS d FROM (SELECT COUNT(*) AS n "
            f"FROM `{wh.table_id(table)}` GROUP BY {key})"
        )
        total += int(next(iter(wh.client.query(q).result())).d)
    return total


def test_tables_are_created_with_the_documented_schema(config):
    wh = Warehouse(config)
    wh.ensure_tables()
    wh.ensure_tables()  # a second time changes nothing
    for spec in TABLES:
        table = wh.client.get_table(wh.table_id(spec.name))
        got = [(f.name, f.field_type, f.mode) for f in table.schema]
        want = [(n, t, m) for n, t, m, _ in bigquery_fields(spec.row)]
        assert [(n, t.replace("INTEGER", "INT64").replace("FLOAT", "FLOAT64")
                 .replace("FLOAT6464", "FLOAT64").replace("BOOLEAN", "BOOL"), m)
                for n, t, m in got] == want, spec.name  # fmt: skip
        assert table.time_partitioning.field == "run_date"
        assert table.clustering_fields == list(spec.clustering)
        assert table.labels == {"accelmatrix_schema": "1"}


def test_exported_twice_is_one_copy_and_a_rerun_cell_replaces_its_rows(store, config):
    fill_run(store, "suite_a", "r1", cells=6, logical_date=NIGHT, failed=frozenset({1}))
    fill_run(store, "suite_a", "r2", cells=3, logical_date=NIGHT + timedelta(days=1))
    wh = Warehouse(config)
    first = export_runs(store, [("suite_a", "r1")], config, warehouse=wh)
    assert first.load_jobs == 1  # every table's rows in one load job
    export_runs(store, [("suite_a", "r1"), ("suite_a", "r2")], config, warehouse=wh)
    export_runs(store, [("suite_a", "r1")], config, warehouse=wh)  # a retried gate
    assert counts(wh, "suite_a", "r1") == expected_rows(6)
    assert counts(wh, "suite_a", "r2") == expected_rows(3)
    assert duplicates(wh) == 0

    # The failed cell is cleared and passes on its re-run, reporting one metric only.
    cell = "model=m1,chips=1"
    store.upsert_cell("suite_a", "r1", cell, state="passed", attempt=2)
    store.replace_metrics("suite_a", "r1", cell, [MetricValue(name="throughput", value=9.0)])
    store.upsert_run("suite_a", "r1", state="passed")
    export_runs(store, [("suite_a", "r1")], config, warehouse=wh)
    want = {**expected_rows(6), "metric_points": expected_rows(6)["metric_points"] - 3}
    assert counts(wh, "suite_a", "r1") == want
    assert counts(wh, "suite_a", "r2") == expected_rows(3)  # another run untouched
    row = next(iter(wh.client.query(
        f"SELECT state, passed, attempt FROM `{wh.table_id('cells')}` "
        f"WHERE run_id = 'r1' AND cell_id = '{cell}'").result()))  # fmt: skip
    assert (row.state, row.passed, row.attempt) == ("passed", True, 2)
    run = next(iter(wh.client.query(
        f"SELECT state, cells_failed FROM `{wh.table_id('runs')}` WHERE run_id = 'r1'"
    ).result()))  # fmt: skip
    assert (run.state, run.cells_failed) == ("passed", 0)
    assert duplicates(wh) == 0


def _cli(args: list[str], env: dict[str, str], store: ResultsStore) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "accelmatrix", "export", *args],
        env={**os.environ, **env, "ACCELMATRIX_RESULTS_URL": store.url},
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.slow(15)
def test_backfill_since_a_day_through_the_cli(bq, store):
    env = _env(bq, f"t_{uuid.uuid4().hex[:10]}")
    for i in range(3):
        fill_run(store, "suite_b", f"n{i}", cells=2, logical_date=NIGHT + timedelta(days=i))
    day1 = (NIGHT + timedelta(days=1)).date().isoformat()
    done = _cli(["--since", day1], env, store)
    assert done.returncode == 0, done.stderr
    assert "exported 2 run(s)" in done.stdout
    done = _cli(["--since", NIGHT.date().isoformat()], env, store)  # overlaps: no copies
    assert "exported 3 run(s)" in done.stdout, done.stderr
    wh = Warehouse(WarehouseConfig.from_env(env))
    for i in range(3):
        assert counts(wh, "suite_b", f"n{i}") == expected_rows(2)
    assert duplicates(wh) == 0
    bad = _cli(["--since", "yesterday"], env, store)
    assert bad.returncode == 2 and "--since 'yesterday': a day as YYYY-MM-DD" in bad.stderr
    bad = _cli(["--dag-id", "suite_b", "--run-id", "nope"], env, store)
    assert bad.returncode == 2 and "no such run" in bad.stderr


@pytest.mark.slow(15)
def test_emulator_stopped_mid_export(bq, store, caplog):
    """Killed after the first load job: the export gives up after its deadline with one
    log line holding the command; the run's verdict is untouched; that command, run once
    the warehouse is back, fills the gap exactly."""
    env = _env(bq, f"t_{uuid.uuid4().hex[:10]}", deadline=3.0)
    config = WarehouseConfig.from_env(env)
    fill_run(store, "suite_c", "r1", cells=8, logical_date=NIGHT, failed=frozenset({0}))
    wh = Warehouse(config)
    wh.ensure_tables()
    uploads = []

    def kill_after_first_upload(response, *args, **kwargs):
        if "/upload/" in response.request.url and not uploads:
            uploads.append(response.request.url)
            bq.stop(signal.SIGKILL)

    wh.client._http.hooks["response"].append(kill_after_first_upload)
    caplog.set_level(logging.INFO, logger="accelmatrix.warehouse")
    try:
        assert export_after_gate(store, "suite_c", "r1", config, warehouse=wh) is None
    finally:
        bq.start()
    assert uploads, "the emulator was never stopped"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    command = errors[0].split("Export it again with: ", 1)[1]
    assert command == "python -m accelmatrix export --dag-id suite_c --run-id r1"
    assert store.get_run("suite_c", "r1").state == "failed"  # the gate's verdict stands
    fresh = Warehouse(config)
    assert counts(fresh, "suite_c", "r1") == dict.fromkeys(PER_RUN, 0)  # nothing half-written

    done = _cli(shlex.split(command)[4:], env, store)
    assert done.returncode == 0, done.stderr
    assert counts(fresh, "suite_c", "r1") == expected_rows(8)
    assert duplicates(fresh) == 0


def test_a_short_outage_is_retried(bq, store):
    """Down for 3 s: the client's own retry (or, past its 30 s, the export's) waits it out."""
    config = WarehouseConfig.from_env(_env(bq, f"t_{uuid.uuid4().hex[:10]}", deadline=60.0))
    fill_run(store, "suite_d", "r1", cells=4, logical_date=NIGHT)
    wh = Warehouse(config)
    wh.ensure_tables()
    bq.stop(signal.SIGKILL)
    back = threading.Timer(3.0, bq.start)
    back.start()
    t0 = time.monotonic()
    try:
        result = export_runs(store, [("suite_d", "r1")], config, warehouse=wh)
    finally:
        back.join()
    assert result.seconds >= 3.0 and time.monotonic() - t0 >= 3.0
    assert counts(wh, "suite_d", "r1") == expected_rows(4)
    assert duplicates(wh) == 0


def test_the_view_has_one_row_per_cell_and_night_with_its_verdict(store, config):
    # Night 1 ran twice (the re-run is the night's verdict); night 2 once; a pull
    # request's run that night is no night of the suite.
    fill_run(store, "suite_e", "n1", cells=4, logical_date=NIGHT, failed=frozenset({1, 2}))
    fill_run(store, "suite_e", "n1_rerun", cells=4, logical_date=NIGHT + timedelta(hours=2),
             failed=frozenset({2}))  # fmt: skip
    fill_run(store, "suite_e", "n2", cells=4, logical_date=NIGHT + timedelta(days=1))
    keys = [("suite_e", r) for r in ("n1", "n1_rerun", "n2")]
    wh = Warehouse(config)
    export_runs(store, keys, config, warehouse=wh)
    rows = list(wh.client.query(
        f"SELECT night, cell_id, run_id, verdict, perf_checks, tracked_metrics "
        f"FROM `{wh.dataset_id}.cell_nights` WHERE suite = 'suite_e' ORDER BY night, cell_id"
    ).result())  # fmt: skip
    assert len(rows) == 8
    want = {(c.cell_id, "n1_rerun"): c.state for c in store.get_cells("suite_e", "n1_rerun")}
    want |= {(c.cell_id, "n2"): c.state for c in store.get_cells("suite_e", "n2")}
    assert {(r.cell_id, r.run_id): r.verdict for r in rows} == want
    assert all(r.perf_checks == 1 and r.tracked_metrics.startswith("step_time=") for r in rows)
    n = next(iter(wh.client.query(
        f"SELECT COUNT(*) AS n FROM `{wh.dataset_id}.cell_night_metrics`").result())).n  # fmt: skip
    assert n == 8


def test_retention_in_the_store_and_the_warehouse(bq, store, monkeypatch):
    """``default=365,pull_request=42``, as of 400 days after NIGHT: the store loses the
    366-day-old run and the 43-day-old pull request's; the warehouse loses that pull
    request's rows by DELETE, and BigQuery's partition expiration (365 days on every table)
    is left the older night (it expires partitions by the wall clock, not by this test's)."""
    from accelmatrix.results.pull_requests import PullRequestRun
    from accelmatrix.warehouse.retention import apply_retention

    now = NIGHT + timedelta(days=400)
    ages = {"old": 366, "kept": 300, "pr_old": 43, "pr_new": 41}
    for run_id, days in ages.items():
        fill_run(store, "suite_f", run_id, cells=2, logical_date=now - timedelta(days=days))
        if run_id.startswith("pr_"):
            store.add_pull_request_run(PullRequestRun(
                dag_id="suite_f", run_id=run_id, kind="verdict", repo="o/r", number=7,
                head_sha="a" * 40, base_ref="main", base_sha="b" * 40, sender="u", fork=False,
            ))  # fmt: skip
    env = {
        **_env(bq, f"t_{uuid.uuid4().hex[:10]}"),
        "ACCELMATRIX_RETENTION": "default=365,pull_request=42",
    }
    for k, v in {**env, "ACCELMATRIX_RESULTS_URL": store.url}.items():
        monkeypatch.setenv(k, v)
    config = WarehouseConfig.from_env()
    wh = Warehouse(config)
    export_runs(store, [("suite_f", r) for r in ages], config, warehouse=wh)

    report = apply_retention(now)
    assert report.store_runs_deleted == {"default": 1, "pull_request": 1}
    assert {r.run_id for r in store.get_runs("suite_f")} == {"kept", "pr_new"}
    assert report.warehouse_error is None
    assert report.warehouse_rows_deleted["cells"] == 2
    assert counts(wh, "suite_f", "pr_old") == dict.fromkeys(PER_RUN, 0)
    assert counts(wh, "suite_f", "pr_new") == expected_rows(2)
    for spec in TABLES:
        tp = wh.client.get_table(wh.table_id(spec.name)).time_partitioning
        assert tp.expiration_ms == 365 * 86_400_000, spec.name
