"""Alembic migrations of the results store, on real SQLite files.

The database of c367b2a (the last accelmatrix before Alembic) is a SQL dump in tests/data;
opening it with today's store must stamp it, leave every row as it was and make it match
``schema.py`` exactly, as Alembic's own model/database comparison sees it.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from accelmatrix.contracts.series_records import BoundsValues
from accelmatrix.results import migrate, schema
from accelmatrix.results.store import ResultsStore

DUMP = Path(__file__).parent / "data" / "results_c367b2a.sql"
DAG, RUN = "nightly_perf", "scheduled__2026-03-01"
T0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


def _diff_against_schema(url: str) -> list:
    """What Alembic's autogenerate would change to make the database match schema.py."""
    engine = create_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, schema.metadata)
        version = migrate.current(conn)
    engine.dispose()
    return [
        d for d in diff if not (d[0] == "remove_table" and d[1].name == "alembic_version")
    ], version


def test_fresh_database_is_at_head_and_equals_schema_py(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    ResultsStore(url).ensure_schema()
    diff, version = _diff_against_schema(url)
    # A column added to schema.py without a revision fails here.
    assert diff == []
    assert version == migrate.head()


def test_database_of_c367b2a_is_upgraded_with_its_rows_intact(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(DUMP.read_text())
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "alembic_version" not in tables and "runs" in tables
    with sqlite3.connect(db) as conn:  # c367b2a had no alerts.issues (revision 0002)
        assert "issues" not in {r[1] for r in conn.execute("PRAGMA table_info(alerts)")}

    store = ResultsStore(f"sqlite:///{db}")
    store.ensure_schema()

    diff, version = _diff_against_schema(f"sqlite:///{db}")
    assert diff == [] and version == migrate.head()
    insp = inspect(create_engine(f"sqlite:///{db}"))
    for table in schema.metadata.sorted_tables:
        assert {c["name"] for c in insp.get_columns(table.name)} == set(table.columns.keys())
        assert {i["name"] for i in insp.get_indexes(table.name)} == {i.name for i in table.indexes}

    run = store.get_run(DAG, RUN)
    assert run.params == {"steps": 20} and run.logical_date == T0
    assert (run.runtime_version, run.state, run.git_ref) == (
        "nightly-2026-03-01",
        "failed",
        "abc123",
    )
    cells = store.get_cells(DAG, RUN)
    assert [(c.cell_id, c.state, c.exit_code) for c in cells] == [
        ("model=tiny-mlp", "passed", 0),
        ("model=tiny-wide", "run_failed", 3),
    ]
    assert cells[0].axes == {"model": "tiny-mlp"} and cells[0].cost == 0.0012
    metrics = store.get_metrics(DAG, RUN)
    assert [(m.name, m.step) for m in metrics] == [
        ("loss", 0),
        ("loss", 1),
        ("loss", 2),
        ("step_time", None),
    ]
    assert math.isnan(metrics[-1].value)
    (check,) = store.get_checks(DAG, RUN)
    assert (check.benchmark, check.lower_bound, check.upper_bound) == (
        "tiny-mlp",
        0.9,
        1.1,
    )
    assert store.get_series_status(DAG)[0].last_logical_date == T0
    alert = store.get_alert(DAG, "model=tiny-wide")
    assert (alert.status, alert.recurrences) == ("open", 2)
    assert alert.issues is None  # 0002's column, added to the old row as NULL
    (reaped,) = store.get_reaped()
    assert reaped.labels == {"accelmatrix-dag": "nightly_perf"}

    # And the upgraded database takes today's writes.
    store.upsert_cell(DAG, RUN, "model=tiny-wide", state="cancelled")
    assert store.get_cell(DAG, RUN, "model=tiny-wide").state == "cancelled"
    store.close()


def test_second_open_runs_no_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    ResultsStore(url).ensure_schema()
    engine = create_engine(url)
    with engine.begin() as conn:
        assert migrate.upgrade(conn) is False  # at head: only the version was read
    engine.dispose()


def test_database_lacking_a_not_null_column_is_refused_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "bad.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(DUMP.read_text())
        conn.execute("ALTER TABLE alerts DROP COLUMN kind")
    with pytest.raises(RuntimeError, match=r"alerts: kind"):
        ResultsStore(f"sqlite:///{db}").ensure_schema()
    with sqlite3.connect(db) as conn:  # the failed migration rolled back: still unversioned
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "alembic_version" not in names


def test_is_at_head_agrees_with_alembic_on_every_kind_of_database(tmp_path: Path) -> None:
    """The one-SELECT check a task process runs when it opens the store says what Alembic
    says: no for an empty database and for one a revision behind, yes at head."""
    engine = create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.connect() as conn:
        assert not migrate.is_at_head(conn)  # no alembic_version table at all
    ResultsStore(f"sqlite:///{tmp_path / 'r.db'}").ensure_schema()
    with engine.connect() as conn:
        assert migrate.is_at_head(conn) and migrate.at_head(conn)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0002'")
    with engine.connect() as conn:
        assert not migrate.is_at_head(conn) and not migrate.at_head(conn)
    engine.dispose()


def test_database_at_0006_is_upgraded_to_0007_with_the_bounds_table(tmp_path: Path) -> None:
    """An existing store of revision 0006 (before bounds lived in the store) keeps its rows
    and gets the ``bounds`` table when it is opened; it then takes stored bounds."""
    db = tmp_path / "at0006.db"
    url = f"sqlite:///{db}"
    old = ResultsStore(url)
    old.ensure_schema()
    old.upsert_run(DAG, RUN, suite=DAG, logical_date=T0, runtime_version="nightly-2026-03-01")
    old.close()
    with sqlite3.connect(db) as conn:  # back to 0006, as a deployment of last week left it
        conn.execute("DROP INDEX ix_bounds_file_benchmark")
        conn.execute("DROP TABLE bounds")
        conn.execute("UPDATE alembic_version SET version_num = '0006'")
    engine = create_engine(url)
    with engine.connect() as conn:
        assert migrate.current(conn) == "0006" and not inspect(conn).has_table("bounds")
    engine.dispose()

    store = ResultsStore(url)
    store.ensure_schema()
    diff, version = _diff_against_schema(url)
    assert diff == [] and version == migrate.head()
    assert store.get_run(DAG, RUN).runtime_version == "nightly-2026-03-01"
    (rid,) = store.add_bounds(
        "bounds/nightly_perf_bounds.yaml",
        [BoundsValues(benchmark="nightly-small", step_time_lower_bound=0.0038)],
        reason="accepted change",
        by="ann",
        detail={"group_id": 1},
    )
    row = store.bounds_in_force("bounds/nightly_perf_bounds.yaml")["nightly-small"]
    assert row.id == rid and row.by == "ann" and row.step_time_upper_bound is None
    store.close()
