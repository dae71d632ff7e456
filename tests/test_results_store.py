"""The results store against real SQLite files: idempotency, round-trips, concurrency.

No mocks: the properties that matter (a retry never duplicates a row, NaN survives SQLite,
four processes do not trip over "database is locked") only exist in a real database.
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.reports.text_table import run_table
from accelmatrix.results.store import SCALAR_STEP, ResultsStore
from accelmatrix_testkit.records import verdict

DAG = "accelmatrix__demo"
RUN = "manual__2026-01-01T00:00:00+00:00"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "results.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[ResultsStore]:
    s = ResultsStore(f"sqlite:///{db_path}")
    s.ensure_schema()
    yield s
    s.close()


def raw(db_path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read the file behind the store's back, to count physical rows."""
    with sqlite3.connect(db_path) as conn:
        return conn.execute(sql, args).fetchall()


# ------------------------------------------------------------------------------------ schema


def test_schema_twice_and_parent_dir_created(db_path: Path) -> None:
    s = ResultsStore(f"sqlite:///{db_path}")
    s.ensure_schema()
    s.ensure_schema()
    ResultsStore(f"sqlite:///{db_path}").ensure_schema()  # another handle, same file
    tables = {r[0] for r in raw(db_path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "cells", "metrics", "checks"} <= tables
    assert raw(db_path, "PRAGMA journal_mode") == [("wal",)]
    # Per connection, so asked on the store's own: NORMAL (1), not the default FULL (2).
    from sqlalchemy import text

    with s._get_engine().connect() as conn:
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1
    s.close()


def test_open_at_head_takes_no_write_lock(db_path: Path) -> None:
    """A second process opening a database at head checks the schema with a read: it gets
    through while another connection holds SQLite's write lock."""

    ResultsStore(f"sqlite:///{db_path}").ensure_schema()
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        s = ResultsStore(f"sqlite:///{db_path}", busy_timeout_s=30)
        t = time.monotonic()
        s.ensure_schema()
        assert time.monotonic() - t < 5  # the write path would wait out the 30 s timeout
        assert s.get_cell(DAG, RUN, "nobody") is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    s.close()


def test_schema_created_on_first_use(db_path: Path) -> None:
    s = ResultsStore(f"sqlite:///{db_path}")
    s.upsert_cell(DAG, RUN, "c", state="planned")  # no explicit ensure_schema()
    assert s.get_cell(DAG, RUN, "c").state == "planned"
    s.close()


def test_constructor_does_not_touch_disk(tmp_path: Path) -> None:
    ResultsStore(f"sqlite:///{tmp_path / 'later' / 'r.db'}")
    assert not (tmp_path / "later").exists()


def test_older_database_missing_a_column_is_reported(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE runs (dag_id TEXT, run_id TEXT, PRIMARY KEY (dag_id, run_id))")
    with pytest.raises(RuntimeError, match=r"runs: suite, .*git_ref"):
        ResultsStore(f"sqlite:///{db_path}").ensure_schema()


def test_package_import_is_light() -> None:
    code = (
        "import sys, accelmatrix.results as r; "
        "assert 'sqlalchemy' not in sys.modules and 'pandas' not in sys.modules; "
        "r.ResultsStore; assert 'sqlalchemy' in sys.modules; print('ok')"
    )
    plugins = Path(__file__).resolve().parents[1] / "plugins"
    out = subprocess.run(  # noqa: S603 - fixed argv, our own interpreter
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(plugins)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_from_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ACCELMATRIX_RESULTS_URL", f"sqlite:///{tmp_path / 'x.db'}")
    assert ResultsStore.from_settings().url == f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.delenv("ACCELMATRIX_RESULTS_URL")
    monkeypatch.delenv("ACCELMATRIX_HOME", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "af"))
    s = ResultsStore.from_settings()
    assert s.url == f"sqlite:///{tmp_path / 'af' / 'accelmatrix' / 'results.db'}"
    s.ensure_schema()
    assert (tmp_path / "af" / "accelmatrix" / "results.db").is_file()
    s.close()


def test_repr_hides_password() -> None:
    assert "s3cret" not in repr(ResultsStore("postgresql://u:s3cret@db/results"))


# -------------------------------------------------------------------------------------- runs


def test_upsert_run_twice_one_row_later_wins_rest_kept(store: ResultsStore, db_path: Path) -> None:
    logical = datetime(2026, 1, 1, 12, tzinfo=UTC)
    store.upsert_run(
        DAG,
        RUN,
        suite="demo",
        logical_date=logical,
        run_type="manual",
        params={"cells": ["*"], "n": 3},
        git_ref="abc123",
        state="running",
    )
    first = store.get_run(DAG, RUN)
    time.sleep(0.01)
    store.upsert_run(DAG, RUN, state="success", finished_at=logical + timedelta(hours=1))

    assert raw(db_path, "SELECT count(*) FROM runs") == [(1,)]
    run = store.get_run(DAG, RUN)
    assert run.state == "success"
    assert run.suite == "demo" and run.git_ref == "abc123" and run.run_type == "manual"
    assert run.params == {"cells": ["*"], "n": 3}
    assert run.logical_date == logical and run.logical_date.tzinfo is not None
    assert run.finished_at == logical + timedelta(hours=1)
    assert run.started_at is None
    assert run.created_at == first.created_at
    assert run.updated_at > first.updated_at


def test_timestamps_are_normalised_to_utc(store: ResultsStore) -> None:
    cet = timezone(timedelta(hours=1))
    store.upsert_run(DAG, RUN, started_at=datetime(2026, 3, 1, 13, 0, tzinfo=cet))
    store.upsert_run(DAG, "r2", started_at="2026-03-01T12:00:00Z", logical_date=None)
    a = store.get_run(DAG, RUN).started_at
    b = store.get_run(DAG, "r2").started_at
    assert a == b == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert a.utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="started_at.*no time zone"):
        store.upsert_run(DAG, RUN, started_at=datetime(2026, 3, 1, 12, 0))


def test_unknown_run_field_lists_allowed(store: ResultsStore) -> None:
    with pytest.raises(ValueError, match="unknown run field.*colour.*allowed:.*suite.*git_ref"):
        store.upsert_run(DAG, RUN, colour="red")


# ------------------------------------------------------------------------------------- cells


def test_upsert_cell_partial_update(store: ResultsStore, db_path: Path) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.upsert_cell(
        DAG,
        RUN,
        "model=a,cfg=x",
        cell_index=0,
        axes={"model": "a", "cfg": "x"},
        machine="cpu-small",
        backend="local",
        quarantined=True,
        state="provisioning",
        attempt=1,
        provision_started_at=t0,
    )
    store.upsert_cell(
        DAG,
        RUN,
        "model=a,cfg=x",
        state="passed",
        exit_code=0,
        run_ended_at=t0 + timedelta(seconds=90),
        workload_seconds=80.5,
        data_docs=Path("/artifacts/dd/index.html"),
    )
    store.upsert_cell(DAG, RUN, "model=a,cfg=x", attempt=2)

    assert raw(db_path, "SELECT count(*) FROM cells") == [(1,)]
    c = store.get_cell(DAG, RUN, "model=a,cfg=x")
    assert c.state == "passed" and c.exit_code == 0 and c.attempt == 2
    assert c.axes == {"model": "a", "cfg": "x"}
    assert c.machine == "cpu-small" and c.backend == "local"
    assert c.quarantined is True
    assert c.provision_started_at == t0
    assert c.run_ended_at == t0 + timedelta(seconds=90)
    assert c.workload_seconds == 80.5
    assert c.data_docs == "/artifacts/dd/index.html"
    assert c.resource_held_seconds is None and c.cost is None


def test_cell_defaults_and_excluded_cells(store: ResultsStore) -> None:
    store.upsert_cell(DAG, RUN, "b", cell_index=1)
    store.upsert_cell(DAG, RUN, "x", state="excluded", excluded_reason="no GPU for fp8")
    store.upsert_cell(DAG, RUN, "a", cell_index=0)
    b = store.get_cell(DAG, RUN, "b")
    assert (b.state, b.message, b.attempt, b.quarantined, b.axes) == (
        "planned",
        "",
        0,
        False,
        {},
    )
    assert [c.cell_id for c in store.get_cells(DAG, RUN)] == ["a", "b", "x"]
    assert store.get_cell(DAG, RUN, "x").excluded_reason == "no GPU for fp8"
    assert store.get_cell(DAG, RUN, "missing") is None
    assert store.get_cells(DAG, "other-run") == []


def test_cell_validation(store: ResultsStore) -> None:
    with pytest.raises(ValueError, match=r"unknown cell field.*exitcode.*allowed:.*exit_code"):
        store.upsert_cell(DAG, RUN, "c", exitcode=1)
    with pytest.raises(ValueError, match="cells.exit_code"):
        store.upsert_cell(DAG, RUN, "c", exit_code=1.5)
    with pytest.raises(ValueError, match="cells.quarantined"):
        store.upsert_cell(DAG, RUN, "c", quarantined="false")
    with pytest.raises(ValueError, match="cells.state cannot be None"):
        store.upsert_cell(DAG, RUN, "c", state=None)
    with pytest.raises(ValueError, match="cell_id is 2000 characters long"):
        store.upsert_cell(DAG, RUN, "c" * 2000, state="x")
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        store.upsert_cell(DAG, "", "c")
    assert store.get_cell(DAG, RUN, "c") is None  # nothing half-written


# ----------------------------------------------------------------------------------- metrics


def test_cell_specs_replace_read_and_reset(store: ResultsStore, db_path: Path) -> None:
    """plan writes every cell's spec once; a task reads its own; a re-plan replaces them and
    ``reset_run`` deletes them with the run's other rows."""
    a = {"id": "m=a", "workload": {"run": ["x", "${python}"]}, "axes": {"m": "a"}}
    b = {"id": "m=b", "workload": {"run": ["y"]}, "axes": {"m": "b"}}
    store.put_cell_specs(DAG, RUN, {"m=a": a, "m=b": b})
    assert store.get_cell_specs(DAG, RUN, ["m=b"]) == {"m=b": b}
    assert store.get_cell_specs(DAG, RUN) == {"m=a": a, "m=b": b}
    assert store.get_cell_specs(DAG, "other-run") == {}
    store.put_cell_specs(DAG, RUN, {"m=a": {**a, "index": 1}})  # re-plan: replaced whole
    assert store.get_cell_specs(DAG, RUN) == {"m=a": {**a, "index": 1}}
    assert raw(db_path, "SELECT COUNT(*) FROM cell_specs") == [(1,)]
    assert store.reset_run(DAG, RUN) == 1
    assert store.get_cell_specs(DAG, RUN) == {}


def test_replace_metrics_retry_second_set_wins(store: ResultsStore, db_path: Path) -> None:
    first = [
        MetricValue(name="loss", value=2.0, step=0),
        MetricValue(name="loss", value=1.0, step=1),
        MetricValue(name="stale", value=9.0),
    ]
    second = [
        MetricValue(name="loss", value=1.5, step=0),
        MetricValue(name="loss", value=0.5, step=1),
        MetricValue(name="loss", value=0.25, step=2),
        MetricValue(name="throughput", value=123.4, step=None, unit="samples/s", source="log"),
    ]
    assert store.replace_metrics(DAG, RUN, "c", first) == 3
    assert store.replace_metrics(DAG, RUN, "c", second) == 4
    assert store.replace_metrics(DAG, RUN, "c", second) == 4  # the retry of the retry

    assert raw(db_path, "SELECT count(*) FROM metrics") == [(4,)]
    got = {(m.name, m.step): m for m in store.get_metrics(DAG, RUN, "c")}
    assert set(got) == {("loss", 0), ("loss", 1), ("loss", 2), ("throughput", None)}
    assert got[("loss", 0)].value == 1.5
    assert got[("throughput", None)].unit == "samples/s"
    assert got[("throughput", None)].source == "log"
    # The scalar sentinel is what the unique key sees on disk, never what the API returns.
    assert raw(db_path, "SELECT step FROM metrics WHERE name='throughput'") == [(SCALAR_STEP,)]


def test_metrics_of_other_cells_untouched(store: ResultsStore) -> None:
    store.replace_metrics(DAG, RUN, "a", [MetricValue(name="m", value=1)])
    store.replace_metrics(DAG, RUN, "b", [MetricValue(name="m", value=2)])
    store.replace_metrics(DAG, RUN, "a", [])
    assert store.get_metrics(DAG, RUN, "a") == []
    assert [m.value for m in store.get_metrics(DAG, RUN, "b")] == [2.0]


def test_nan_and_inf_round_trip(store: ResultsStore) -> None:
    store.replace_metrics(
        DAG,
        RUN,
        "c",
        [
            MetricValue(name="nan", value=float("nan")),
            MetricValue(name="none", value=None),
            MetricValue(name="pinf", value=math.inf),
            MetricValue(name="ninf", value=-math.inf, step=3),
            MetricValue(name="tiny", value=5e-324),
        ],
    )
    vals = {(m.name, m.step): m.value for m in store.get_metrics(DAG, RUN, "c")}
    assert math.isnan(vals[("nan", None)]) and math.isnan(vals[("none", None)])
    assert vals[("pinf", None)] == math.inf
    assert vals[("ninf", 3)] == -math.inf
    assert vals[("tiny", None)] == 5e-324

    df = store.metrics_frame(DAG, RUN, "c")
    assert str(df["step"].dtype) == "Int64" and str(df["value"].dtype) == "float64"
    by_name = df.set_index("name")
    assert math.isnan(by_name.loc["nan", "value"])
    assert by_name.loc["pinf", "value"] == math.inf
    assert by_name["step"].isna().sum() == 4 and by_name.loc["ninf", "step"] == 3


def test_metric_row_validation(store: ResultsStore) -> None:
    with pytest.raises(TypeError, match="value"):
        MetricValue(name="m")  # a value is required
    with pytest.raises(TypeError, match="row 0 must be a MetricValue"):
        store.replace_metrics(DAG, RUN, "c", [{"name": "m", "value": 1}])
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        store.replace_metrics(DAG, RUN, "c", [MetricValue(name="", value=1)])
    with pytest.raises(ValueError, match="step must be an int"):
        store.replace_metrics(DAG, RUN, "c", [MetricValue(name="m", value=1, step=1.5)])
    with pytest.raises(ValueError, match="step must be >= 0"):
        store.replace_metrics(DAG, RUN, "c", [MetricValue(name="m", value=1, step=-1)])
    with pytest.raises(ValueError, match="appears twice"):
        store.replace_metrics(
            DAG,
            RUN,
            "c",
            [MetricValue(name="m", value=1), MetricValue(name="m", value=2, step=None)],
        )
    with pytest.raises(ValueError, match="is not a number"):
        store.replace_metrics(DAG, RUN, "c", [MetricValue(name="m", value="fast")])


def test_failed_replace_keeps_previous_rows(store: ResultsStore) -> None:
    store.replace_metrics(DAG, RUN, "c", [MetricValue(name="m", value=1)])
    with pytest.raises(ValueError):
        store.replace_metrics(
            DAG, RUN, "c", [MetricValue(name="m", value=2), MetricValue(name="", value=3)]
        )
    assert [m.value for m in store.get_metrics(DAG, RUN, "c")] == [1.0]


def test_metrics_frame_filters_and_empty(store: ResultsStore) -> None:
    empty = store.metrics_frame()
    assert list(empty.columns) == [
        "dag_id",
        "run_id",
        "cell_id",
        "name",
        "step",
        "value",
        "unit",
        "source",
    ]
    assert len(empty) == 0
    store.replace_metrics(DAG, RUN, "a", [MetricValue(name="m", value=1)])
    store.replace_metrics(DAG, "r2", "a", [MetricValue(name="m", value=2)])
    store.replace_metrics("other_dag", RUN, "a", [MetricValue(name="m", value=3)])
    assert len(store.metrics_frame()) == 3
    assert store.metrics_frame(dag_id=DAG)["value"].tolist() == [1.0, 2.0]
    assert store.metrics_frame(run_id="r2")["value"].tolist() == [2.0]


# ------------------------------------------------------------------------------------ checks


def _verdicts(loss_passed: bool) -> list[CheckVerdict]:
    return [
        verdict(
            "loss_below",
            loss_passed,
            type="threshold",
            expected={"max": 1.0},
            observed=1.5,
            message="loss 1.5 > 1.0",
        ),
        verdict("exit_zero", True, type="exit_code", expected="0", observed="0", message=""),
    ]


def test_replace_checks_idempotent(store: ResultsStore, db_path: Path) -> None:
    assert store.replace_checks(DAG, RUN, "c", _verdicts(False)) == 2
    assert store.replace_checks(DAG, RUN, "c", _verdicts(True)) == 2
    assert store.replace_checks(DAG, RUN, "c", _verdicts(True)) == 2
    assert raw(db_path, "SELECT count(*) FROM checks") == [(2,)]
    got = {c.check_name: c for c in store.get_checks(DAG, RUN, "c")}
    assert got["loss_below"].passed is True
    assert got["loss_below"].expected == '{"max": 1.0}'
    assert got["loss_below"].observed == "1.5"
    df = store.checks_frame(DAG, RUN)
    assert str(df["passed"].dtype) == "bool" and df["passed"].all()
    assert set(df["check_name"]) == {"loss_below", "exit_zero"}


def test_check_validation(store: ResultsStore) -> None:
    with pytest.raises(ValueError, match=r"unknown check perf.*severity.*allowed: benchmark"):
        store.replace_checks(DAG, RUN, "c", [verdict("a", True, perf={"severity": 1})])
    with pytest.raises(TypeError, match="row 0 must be a CheckVerdict"):
        store.replace_checks(DAG, RUN, "c", [{"check_name": "a", "passed": True}])
    with pytest.raises(ValueError, match="check_name must be a non-empty string"):
        store.replace_checks(DAG, RUN, "c", [verdict("", True)])
    with pytest.raises(ValueError, match="checks.passed cannot be None"):
        store.replace_checks(DAG, RUN, "c", [verdict("a", None)])
    with pytest.raises(ValueError, match="appears twice"):
        store.replace_checks(DAG, RUN, "c", [verdict("a", True), verdict("a", 0)])


# --------------------------------------------------------------------------------- run_table


def test_run_table(store: ResultsStore) -> None:
    store.upsert_cell(
        DAG,
        RUN,
        "model=a,cfg=x",
        cell_index=0,
        state="failed",
        exit_code=0,
        resource_held_seconds=123.45,
        workload_seconds=100,
        message="checks failed:\n  loss_below",
    )
    store.upsert_cell(DAG, RUN, "model=b,cfg=x", cell_index=1, state="passed", exit_code=0)
    store.upsert_cell(DAG, RUN, "model=c,cfg=x", state="excluded", excluded_reason="no fp8")
    store.replace_checks(DAG, RUN, "model=a,cfg=x", _verdicts(False))
    store.replace_checks(DAG, RUN, "model=b,cfg=x", _verdicts(True))
    # A cell with verdicts but no cell row still shows up.
    store.replace_checks(DAG, RUN, "model=d,cfg=x", [verdict("orphan_check", False)])

    out = run_table(store, DAG, RUN)
    for cid in ("model=a,cfg=x", "model=b,cfg=x", "model=c,cfg=x", "model=d,cfg=x"):
        assert cid in out
    assert "loss_below" in out and "orphan_check" in out
    assert "exit_zero" not in out  # passed checks are not listed
    assert "123.5" in out and "100.0" in out
    assert "no fp8" in out
    assert "checks failed: loss_below" in out  # message flattened to one line
    lines = out.splitlines()
    assert lines[1].split() == [
        "cell",
        "state",
        "exit",
        "held",
        "s",
        "workload",
        "s",
        "failed",
        "checks",
        "message",
    ]
    assert lines[0].startswith(f"Results of {DAG} / {RUN}: 4 cell(s)")
    assert run_table(store, DAG, "nothing") == f"No cells recorded for {DAG} / nothing"


def test_run_table_truncates_many_failed_checks(store: ResultsStore) -> None:
    store.upsert_cell(DAG, RUN, "c", state="failed")
    names = [f"check_number_{i:02d}" for i in range(20)]
    store.replace_checks(DAG, RUN, "c", [verdict(n, False) for n in names])
    out = run_table(store, DAG, RUN)
    assert "check_number_00" in out and "more)" in out


# ---------------------------------------------------------------------------- process safety


def test_pickled_store_still_works(store: ResultsStore) -> None:
    store.upsert_cell(DAG, RUN, "c", state="running")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get_cell(DAG, RUN, "c").state == "running"
    clone.close()


ITERATIONS = 50
WORKERS = 4


def _hammer(url: str, worker: int, barrier: Any, results: Any) -> None:
    """One task process: every iteration is a retried task rewriting its cell."""
    try:
        store = ResultsStore(url)
        barrier.wait(timeout=60)
        cell = f"cell={worker}"
        for n in range(ITERATIONS):
            store.upsert_run(DAG, RUN, state="running", params={"last_writer": worker})
            store.upsert_cell(
                DAG,
                RUN,
                cell,
                cell_index=worker,
                attempt=n,
                state="running" if n < ITERATIONS - 1 else "passed",
            )
            store.replace_metrics(
                DAG,
                RUN,
                cell,
                [MetricValue(name="loss", value=n + s / 10, step=s) for s in range(5)]
                + [MetricValue(name="wall", value=float(n), step=None)],
            )
            store.replace_checks(DAG, RUN, cell, [verdict("ok", n % 2 == 0, type="t")])
        store.close()
        results.put((worker, "ok"))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((worker, traceback.format_exc()))


def test_concurrent_writers_same_sqlite_file(db_path: Path) -> None:
    # The file does not exist yet: the workers also race on creating the schema and on
    # switching the fresh file to WAL.
    url = f"sqlite:///{db_path}"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(url, w, barrier, results)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    failures = {w: tb for w, tb in outcomes.items() if tb != "ok"}
    assert not failures, "\n".join(failures.values())
    assert all(p.exitcode == 0 for p in procs)

    store = ResultsStore(url)
    assert raw(db_path, "SELECT count(*) FROM runs") == [(1,)]
    cells = store.get_cells(DAG, RUN)
    assert [c.cell_id for c in cells] == [f"cell={w}" for w in range(WORKERS)]
    assert all(c.attempt == ITERATIONS - 1 and c.state == "passed" for c in cells)
    assert raw(db_path, "SELECT count(*) FROM metrics") == [(WORKERS * 6,)]
    assert raw(
        db_path,
        "SELECT count(*) FROM (SELECT DISTINCT dag_id, run_id, cell_id, name, step FROM metrics)",
    ) == [(WORKERS * 6,)]
    last = float(ITERATIONS - 1)
    assert set(store.metrics_frame(DAG, RUN).query("name == 'wall'")["value"]) == {last}
    assert raw(db_path, "SELECT count(*) FROM checks") == [(WORKERS,)]
    store.close()


class _GenericDialectStore(ResultsStore):
    """Takes the portable UPDATE-then-INSERT path, as MySQL or any other dialect would."""

    @property
    def dialect(self) -> str:
        return "generic"


def test_generic_dialect_fallback_upserts(db_path: Path) -> None:
    s = _GenericDialectStore(f"sqlite:///{db_path}")
    s.ensure_schema()
    s.upsert_cell(DAG, RUN, "c", state="running", machine="m1", axes={"a": "1"})
    s.upsert_cell(DAG, RUN, "c", state="passed")
    s.upsert_run(DAG, RUN, suite="demo")
    s.upsert_run(DAG, RUN, state="success")
    assert raw(db_path, "SELECT count(*) FROM cells") == [(1,)]
    c = s.get_cell(DAG, RUN, "c")
    assert (c.state, c.machine, c.axes) == ("passed", "m1", {"a": "1"})
    run = s.get_run(DAG, RUN)
    assert (run.suite, run.state) == ("demo", "success")
    s.close()


def test_records_are_their_tables_columns() -> None:
    """Each typed record of the store is its table's columns, same names and order: the
    row becomes the record as it is (results/row_records.py), and nothing re-maps it."""
    from accelmatrix.contracts import change_point_records, run_records, series_records
    from accelmatrix.results import schema

    pairs = [
        (run_records.RunRecord, schema.runs),
        (run_records.CellRecord, schema.cells),
        (run_records.MetricRecord, schema.metrics),
        (run_records.CheckRecord, schema.checks),
        (run_records.ReapedRecord, schema.reaped),
        (change_point_records.ChangePoint, schema.change_points),
        (change_point_records.ChangeGroup, schema.change_groups),
        (change_point_records.Confirmation, schema.confirmations),
        (series_records.SeriesStatus, schema.series_status),
        (series_records.AlertRecord, schema.alerts),
        (series_records.BoundsRecord, schema.bounds),
    ]
    for record, table in pairs:
        assert record.__struct_fields__ == tuple(c.name for c in table.columns), table.name
    # What a writer hands the store: a row less what the call names once (the cell's key;
    # the file and the who/when/why of a re-centering).
    metric = set(run_records.MetricValue.__struct_fields__)
    assert metric == {c.name for c in schema.metrics.columns} - {"dag_id", "run_id", "cell_id"}
    bounds = set(series_records.BoundsValues.__struct_fields__)
    per_call = {"id", "file", "reason", "detail", "by", "at", "note"}
    assert bounds == {c.name for c in schema.bounds.columns} - per_call
