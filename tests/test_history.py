"""Perf history against a real SQLite results store: the history frame, dedupe by logical
date, bounds re-centering (stored, the file never written), series verdicts, alerts (to a real HTTP receiver), budget, and
the additive schema migration."""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_tiered_ci import Receiver, _conn

from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.evaluation.bounds import compute_bounds, load_bounds_in_force
from accelmatrix.history.bounds.bounds_job import bounds_table, recenter
from accelmatrix.history.series.frame import HISTORY_COLUMNS, history
from accelmatrix.history.series.regression import Rules
from accelmatrix.history.series.series import classify_suite
from accelmatrix.notifications import dedup as alerts
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.notify import AlertSink
from accelmatrix_testkit import records
from accelmatrix_testkit.records import verdict

DAG = "nightly_perf"
DAY0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
CELLS = {"model=tiny-mlp": "tiny-mlp", "model=tiny-wide": "tiny-wide"}


@pytest.fixture
def store(tmp_path: Path):
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def record(
    store: ResultsStore,
    day: int,
    step_times: dict[str, list[float]],
    *,
    run_id: str | None = None,
    bounds: tuple[float, float] = (0.9, 1.1),
    started: datetime | None = None,
    cost: float = 0.01,
) -> str:
    """One run of DAG as plan/collect/evaluate/teardown would write it."""
    ld = DAY0 + timedelta(days=day)
    run_id = run_id or f"scheduled__{ld.isoformat()}"
    store.upsert_run(
        DAG,
        run_id,
        suite=DAG,
        logical_date=ld,
        run_type="backfill",
        runtime_version=f"nightly-{ld:%Y-%m-%d}",
        git_ref="abc123",
        started_at=started or ld + timedelta(hours=1),
        state="passed",
    )
    for cid, values in step_times.items():
        bench = CELLS[cid]
        median = float(np.median(values))
        ok = bounds[0] <= median <= bounds[1]
        store.upsert_cell(
            DAG,
            run_id,
            cid,
            axes={"model": bench},
            machine="cpu-small",
            backend="local",
            state="passed" if ok else "failed",
            resource_held_seconds=12.5,
            cost=cost,
        )
        store.replace_metrics(
            DAG,
            run_id,
            cid,
            [MetricValue(name="step_time", value=v, step=i) for i, v in enumerate(values)]
            + [MetricValue(name="loss", value=0.1, step=0)],
        )
        store.replace_checks(
            DAG,
            run_id,
            cid,
            [
                verdict("exit_status[0]", True, type="exit_status"),
                verdict(
                    f"step_time_within_bounds[{bench}]",
                    ok,
                    type="step_time_within_bounds",
                    perf={
                        "benchmark": bench,
                        "metric": "step_time",
                        "value": median,
                        "lower_bound": bounds[0],
                        "upper_bound": bounds[1],
                    },
                ),
            ],
        )
    return run_id


def test_history_has_run_metadata_one_row_per_run_cell_and_metric(store):
    for d in range(3):
        record(store, d, {"model=tiny-mlp": [1.0, 1.02, 0.98], "model=tiny-wide": [2.0]})
    h = history(store, metric="step_time", dag_id=DAG)
    assert list(h.columns[: len(HISTORY_COLUMNS)]) == HISTORY_COLUMNS
    assert len(h) == 6
    mlp = h[h["cell_id"] == "model=tiny-mlp"]
    assert list(mlp["logical_date"]) == [DAY0 + timedelta(days=d) for d in range(3)]
    assert list(mlp["runtime_version"]) == [
        "nightly-2026-03-01",
        "nightly-2026-03-02",
        "nightly-2026-03-03",
    ]
    row = mlp.iloc[0]
    assert row["benchmark"] == "tiny-mlp" and row["value"] == pytest.approx(1.0)
    assert row["points"] == 3 and (row["lower"], row["upper"]) == (0.9, 1.1)
    assert row["machine"] == "cpu-small" and row["backend"] == "local"
    assert row["resource_held_seconds"] == 12.5 and row["cost"] == 0.01
    assert row["git_ref"] == "abc123" and row["axis.model"] == "tiny-mlp"
    assert bool(h[h["cell_id"] == "model=tiny-wide"]["passed"].iloc[0]) is False
    # A window on the logical date; another metric; a benchmark filter.
    assert len(history(store, dag_id=DAG, since=DAY0 + timedelta(days=1))) == 4
    loss = history(store, metric="loss", dag_id=DAG)
    assert len(loss) == 6 and set(loss["benchmark"]) == {""}
    assert set(history(store, benchmark="tiny-wide")["cell_id"]) == {"model=tiny-wide"}


def test_a_logical_date_tested_twice_keeps_the_latest_run(store):
    record(store, 0, {"model=tiny-mlp": [1.0]})
    record(store, 1, {"model=tiny-mlp": [1.0]})
    # A manual re-test of day 1 under another run id, started later, measured 1.05.
    record(
        store,
        1,
        {"model=tiny-mlp": [1.05]},
        run_id="manual__retest",
        started=DAY0 + timedelta(days=5),
    )
    h = history(store, dag_id=DAG)
    assert len(h) == 2
    assert h.iloc[1]["run_id"] == "manual__retest" and h.iloc[1]["value"] == 1.05
    assert len(history(store, dag_id=DAG, dedupe=False)) == 3


def test_reset_run_replaces_a_reruns_rows(store):
    rid = record(store, 0, {"model=tiny-mlp": [1.0], "model=tiny-wide": [2.0]})
    assert store.reset_run(DAG, rid) == 4 + 4 + 2  # metrics, checks, cells
    assert store.get_cells(DAG, rid) == [] and store.get_metrics(DAG, rid) == []
    assert store.get_run(DAG, rid) is not None


def test_recenter_stores_perf_fields_leaves_the_file_and_refuses_few_samples(
    store, tmp_path, caplog
):
    rng = np.random.default_rng(0)
    mlp = [float(x) for x in rng.normal(1.0, 0.01, 12)]
    for d, v in enumerate(mlp):
        cells = {"model=tiny-mlp": [v]}
        if d < 3:
            cells["model=tiny-wide"] = [2.0 + d / 100]
        record(store, d, cells)
    record(store, -40, {"model=tiny-mlp": [50.0]})  # outside the window: ignored
    include = tmp_path / "include"
    (include / "bounds").mkdir(parents=True)
    path = include / "bounds" / "bounds.yaml"
    path.write_text(
        "# kept by hand: accelmatrix never writes this file\n"
        + yaml.safe_dump(
            {
                "benchmarks": {
                    "tiny-mlp": {
                        "name": "Tiny MLP",
                        "step_time_lower_bound": 0.0,
                        "step_time_upper_bound": 0.5,
                        "target_loss": 0.15,
                        "loss_tolerance": 0.1,
                        "owner_team": "perf",
                    },
                    "tiny-wide": {
                        "name": "Wide",
                        "step_time_lower_bound": 0.0,
                        "step_time_upper_bound": 9.0,
                        "target_loss": 0.6,
                    },
                },
                "metadata": {"source": "other-system"},
                "top_level_extra": [1, 2],
            },
            sort_keys=False,
        )
    )
    before = path.read_bytes()
    caplog.set_level("INFO")
    now = DAY0 + timedelta(days=20)
    rep = recenter(
        path,
        store=store,
        window_days=30,
        confidence_level=0.9,
        min_samples=10,
        now=now,
        include_dir=include,
    )
    assert rep.stored and rep.updated == ["tiny-mlp"] and rep.kept == ["tiny-wide"]
    assert rep.key == "bounds/bounds.yaml"
    assert path.read_bytes() == before  # include/ is git's: never written
    (row,) = store.get_bounds_history(["bounds/bounds.yaml"])
    want = compute_bounds(mlp, 0.9)
    for k in ("step_time_lower_bound", "step_time_upper_bound", "average", "confidence_interval"):
        assert getattr(row, k) == pytest.approx(want[k])
    assert row.benchmark == "tiny-mlp" and row.sample_size == 12
    assert (row.reason, row.by) == ("maintenance", "accelmatrix-maintenance")
    assert (row.file_lower_bound, row.file_upper_bound) == (0.0, 0.5)
    d = row.detail
    assert d["confidence_level"] == 0.9 and d["window_days"] == 30 and d["min_samples"] == 10
    assert d["samples"] == {"tiny-mlp": 12} and d["query_end"] == now.isoformat()
    assert d["query_start"] == (now - timedelta(days=30)).isoformat()
    # Every reader sees the file with the stored bounds applied; the other fields are the
    # file's.
    b = load_bounds_in_force(path, include_dir=include, stored=store.bounds_in_force)
    mlp_b = b.benchmarks["tiny-mlp"]
    assert mlp_b.step_time_upper_bound == pytest.approx(want["step_time_upper_bound"])
    assert (mlp_b.name, mlp_b.target_loss, mlp_b.owner_team) == ("Tiny MLP", 0.15, "perf")
    assert b.benchmarks["tiny-wide"].step_time_upper_bound == 9.0
    text = caplog.text
    assert "tiny-mlp: [0, 0.5] -> [" in text and "(n=12)" in text
    assert "tiny-wide: kept [0, 9]: only 3 sample(s)" in text and "min_samples is 10" in text

    # The next re-centering starts from the stored bounds; nothing with enough samples:
    # nothing stored.
    caplog.clear()
    rep = recenter(path, store=store, min_samples=50, now=now, include_dir=include)
    assert not rep.stored and len(store.get_bounds_history(["bounds/bounds.yaml"])) == 1
    assert f"tiny-mlp: kept [{want['step_time_lower_bound']:.6g}, " in caplog.text
    assert path.read_bytes() == before


def test_bounds_table_matches_compute_bounds_exactly():
    rng = np.random.default_rng(1)
    rows = [
        {"benchmark": f"b{i}", "value": float(v)}
        for i in range(5)
        for v in rng.normal(1 + i, 0.05 * (i + 1), 4 + 3 * i)
    ]
    rows += [{"benchmark": "b0", "value": math.nan}, {"benchmark": "one", "value": 1.0}]
    table = bounds_table(pd.DataFrame(rows), 0.95)
    assert list(table.index) == [f"b{i}" for i in range(5)]  # "one" has a single sample
    for name, got in table.iterrows():
        want = compute_bounds(
            [r["value"] for r in rows if r["benchmark"] == name and r["value"] == r["value"]], 0.95
        )
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-12), (name, k)


def test_series_status_stored_per_suite(store):
    # tiny-mlp: in bounds then two violations at the end -> regression; tiny-wide: 2 points.
    for d, v in enumerate([1.0, 1.0, 1.0, 1.5, 1.6]):
        cells = {"model=tiny-mlp": [v]}
        if d < 2:
            cells["model=tiny-wide"] = [1.0]
        record(store, d, cells)
    verdicts, _ = classify_suite(
        store, DAG, rules=Rules(), window_days=30, now=DAY0 + timedelta(days=6)
    )
    got = {r.cell_id: r for r in store.get_series_status(DAG)}
    assert got["model=tiny-mlp"].status == "regression"
    assert got["model=tiny-mlp"].trailing == 2 and got["model=tiny-mlp"].points == 5
    assert got["model=tiny-mlp"].last_value == 1.6
    assert got["model=tiny-mlp"].last_logical_date == DAY0 + timedelta(days=4)
    assert got["model=tiny-wide"].status == "insufficient_data"
    assert {r.window_days for r in got.values()} == {30}
    # Replaced, not appended: a later classification over a window without those runs.
    classify_suite(store, DAG, window_days=1, now=DAY0 + timedelta(days=100))
    assert store.get_series_status(DAG) == []


def _cell(cid: str, quarantined: bool = False) -> dict:
    return {"id": cid, "quarantined": quarantined}


def test_alerts_dedupe_recur_resolve_and_never_for_quarantined(store, monkeypatch):
    planned = [_cell("a"), _cell("q", quarantined=True)]
    failed = {
        "a": records.cell("a", state="failed", message="loss: too high"),
        "q": records.cell("q", state="failed"),
    }
    passed = {"a": records.cell("a", state="passed"), "q": records.cell("q", state="failed")}
    t = DAY0
    ev = alerts.update_alerts(store, DAG, "r1", planned, failed, run_url="http://x/r1", now=t)
    assert [(e["event"], e["cell_id"], e["recurrences"]) for e in ev] == [("opened", "a", 1)]
    # The same run's gate again (cleared): no second count, no second notification.
    assert alerts.update_alerts(store, DAG, "r1", planned, failed, now=t) == []
    assert store.get_alert(DAG, "a").recurrences == 1
    assert alerts.update_alerts(store, DAG, "r2", planned, failed, now=t) == []
    assert alerts.update_alerts(store, DAG, "r3", planned, failed, now=t) == []
    a = store.get_alert(DAG, "a")
    assert (a.status, a.recurrences, a.first_run_id, a.last_run_id) == (
        "open",
        3,
        "r1",
        "r3",
    )
    # A regression escalates the open alert, with its trend.
    trend = {
        "a": [
            {
                "benchmark": "tiny-mlp",
                "metric": "step_time",
                "lower": 0.9,
                "upper": 1.1,
                "points": [{"value": 1.5, "violated": True}, {"value": 1.6, "violated": True}],
            }
        ]
    }
    ev = alerts.update_alerts(store, DAG, "r4", planned, failed, regressions=trend, now=t)
    assert [(e["event"], e["kind"], e["recurrences"]) for e in ev] == [
        ("recurred", "regression", 4)
    ]
    ev = alerts.update_alerts(store, DAG, "r5", planned, passed, now=t + timedelta(days=1))
    assert [(e["event"], e["cell_id"]) for e in ev] == [("resolved", "a")]
    a = store.get_alert(DAG, "a")
    assert a.status == "resolved" and a.resolved_at == t + timedelta(days=1)
    assert store.get_alert(DAG, "q") is None  # quarantined: never an alert
    # Failing again opens a fresh alert.
    ev = alerts.update_alerts(store, DAG, "r6", planned, failed, now=t)
    assert [(e["event"], e["recurrences"]) for e in ev] == [("opened", 1)]
    assert len(store.get_alerts(DAG)) == 1


def test_alert_sinks_slack_and_github_payloads_reach_a_local_receiver(store, monkeypatch):
    with Receiver() as rx:
        monkeypatch.setenv("AIRFLOW_CONN_SLACK_PERF", _conn(rx.port, extra={"endpoint": "/slack"}))
        monkeypatch.setenv(
            "AIRFLOW_CONN_GH_ISSUES",
            _conn(rx.port, password="ghp_token", extra={"endpoint": "/repos/acme/ml/issues"}),
        )
        trend = {
            "a": [
                {
                    "benchmark": "tiny-mlp",
                    "metric": "step_time",
                    "lower": 0.9,
                    "upper": 1.1,
                    "points": [{"value": 1.0, "violated": False}, {"value": 1.5, "violated": True}],
                }
            ]
        }
        ev = alerts.update_alerts(
            store,
            DAG,
            "r1",
            [_cell("a")],
            {"a": records.cell("a", state="failed")},
            regressions=trend,
            run_url="http://airflow/dags/x/runs/r1",
        )
        sinks = [
            AlertSink(conn_id="slack_perf", format="slack"),
            AlertSink(conn_id="gh_issues", format="github", labels=["perf"]),
        ]
        assert alerts.deliver(sinks, ev) == 2
        # An unreachable sink is logged, not raised.
        monkeypatch.setenv("AIRFLOW_CONN_DEAD", _conn(1))
        assert alerts.deliver([AlertSink(conn_id="dead")], ev) == 0
    by_path = {p: (h, body) for p, h, body in rx.received}
    _, slack = by_path["/slack"]
    assert slack["text"].startswith("[accelmatrix] nightly_perf a: perf regression")
    assert [b["type"] for b in slack["blocks"]] == ["header", "section", "context"]
    section = slack["blocks"][1]["text"]["text"]
    assert "tiny-mlp step_time: 1, 1.5 (out) vs bounds [0.9, 1.1]" in section
    assert "http://airflow/dags/x/runs/r1" in slack["blocks"][2]["elements"][0]["text"]
    headers, gh = by_path["/repos/acme/ml/issues"]
    assert set(gh) == {"title", "body", "labels"}
    assert gh["labels"] == ["perf", "regression", "opened"]
    assert "1.5 (out)" in gh["body"] and headers["Authorization"] == "Bearer ghp_token"


def test_an_older_database_gets_the_new_nullable_columns(tmp_path):
    db = tmp_path / "old.db"
    s = ResultsStore(f"sqlite:///{db}")
    s.ensure_schema()
    s.upsert_run(DAG, "r0", suite=DAG)
    s.close()
    with sqlite3.connect(db) as conn:  # as an accelmatrix before this change left it
        conn.execute("DROP TABLE alembic_version")  # (which also predates Alembic)
        conn.execute("ALTER TABLE runs DROP COLUMN runtime_version")
        conn.execute("DROP INDEX ix_checks_benchmark")
        conn.execute("ALTER TABLE checks DROP COLUMN benchmark")
    s = ResultsStore(f"sqlite:///{db}")
    s.upsert_run(DAG, "r1", runtime_version="nightly-2026-03-01")
    assert s.get_run(DAG, "r0").runtime_version is None
    assert s.get_run(DAG, "r1").runtime_version == "nightly-2026-03-01"
    s.close()
    with sqlite3.connect(db) as conn:
        idx = conn.execute("SELECT name FROM sqlite_master WHERE type='index'").fetchall()
    assert ("ix_checks_benchmark",) in idx


@pytest.mark.integration
def test_maintenance_dag_recenters_and_classifies(airflow_db, accel_home, tmp_path, monkeypatch):
    """The maintenance DAG with dag.test(): the bounds of the file under the include dir are
    re-centered from the history window ending at the run's logical date and stored in the
    results store (the file stays as it was), and the suite's series verdicts are stored."""
    from airflow.dag_processing.dagbag import DagBag

    from accelmatrix.lifecycle import results_store

    include = tmp_path / "include"
    (include / "bounds").mkdir(parents=True)
    (include / "bounds" / "b.yaml").write_text(
        "benchmarks:\n  tiny-mlp: {name: Tiny, step_time_lower_bound: 0.0,"
        " step_time_upper_bound: 5.0, target_loss: 0.15}\n"
    )
    before = (include / "bounds" / "b.yaml").read_text()
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(include))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "no-suites"))
    s = results_store()
    for d, v in enumerate([1.0, 1.01, 0.99, 1.0, 1.5, 1.6]):
        record(s, d, {"model=tiny-mlp": [v]})
    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags"), safe_mode=False)
    dag = bag.dags["accelmatrix_maintenance"]
    dr = dag.test(
        logical_date=DAY0 + timedelta(days=7),
        run_conf={"bounds_files": ["bounds/b.yaml"], "min_samples": 5, "window_days": 30},
    )
    assert str(dr.state) == "success"
    # The file is git's: never written; the re-centered bounds are stored.
    assert (include / "bounds" / "b.yaml").read_text() == before
    (row,) = s.get_bounds_history(["bounds/b.yaml"])
    assert row.sample_size == 6 and row.by == "accelmatrix-maintenance"
    assert row.step_time_upper_bound == pytest.approx(
        compute_bounds([1.0, 1.01, 0.99, 1.0, 1.5, 1.6], 0.95)["step_time_upper_bound"]
    )
    assert row.detail["query_end"] == (DAY0 + timedelta(days=7)).isoformat()
    (status,) = s.get_series_status(DAG)
    assert (status.cell_id, status.status) == ("model=tiny-mlp", "regression")
