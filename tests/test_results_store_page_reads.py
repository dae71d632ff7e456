"""The results store's reads for the history page and the trend charts, against a real SQLite
file: the UI builds no query of its own (pyproject.toml, the UI's import contract), so what
each page shows rests on these methods returning the right rows of the right runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from accelmatrix.contracts.run_records import CellStateRecord, RunCellTotals
from accelmatrix.results.store import ResultsStore

DAG = "perf_suite"
OTHER = "other_suite"


def day(d: int, hour: int = 0) -> datetime:
    return datetime(2026, 3, d, hour, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResultsStore]:
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    s.ensure_schema()
    yield s
    s.close()


def test_latest_runs_in_build_order_without_followups(store: ResultsStore) -> None:
    """Newest first by logical date (else start, else creation), then build, then start;
    follow-up runs (by run type, params block or run id) and other DAGs' runs left out."""
    # A backfill of two builds, started today: placed by their dates, not their start.
    store.upsert_run(DAG, "backfill_1", logical_date=day(1), started_at=day(20, 2))
    store.upsert_run(DAG, "backfill_2", logical_date=day(2), started_at=day(20, 1))
    # Two runs of one date: the later build first, whichever started first.
    store.upsert_run(
        DAG, "same_a", logical_date=day(5), runtime_version="nightly-a", started_at=day(5, 9)
    )
    store.upsert_run(
        DAG, "same_b", logical_date=day(5), runtime_version="nightly-b", started_at=day(5, 1)
    )
    # No logical date: placed by its start.
    store.upsert_run(DAG, "manual_3", started_at=day(3, 12))
    # Follow-up runs, newer than everything: never a column.
    store.upsert_run(DAG, "confirm_typed", logical_date=day(30), run_type="confirm")
    store.upsert_run(
        DAG, "block", logical_date=day(30), params={"accelmatrix_followup": {"kind": "bisect"}}
    )
    store.upsert_run(DAG, "accelmatrix_compare__x", logical_date=day(30))
    store.upsert_run(OTHER, "elsewhere", logical_date=day(29))

    runs = store.latest_runs(DAG, 10)
    assert [r.run_id for r in runs] == ["same_b", "same_a", "manual_3", "backfill_2", "backfill_1"]
    assert runs[0].runtime_version == "nightly-b"
    assert runs[0].logical_date == day(5)  # whole records, timestamps aware UTC
    assert [r.run_id for r in store.latest_runs(DAG, 2)] == ["same_b", "same_a"]
    assert store.latest_runs("no_such_dag", 5) == []


def test_latest_runs_places_a_run_without_dates_by_its_creation(store: ResultsStore) -> None:
    store.upsert_run(DAG, "dated", logical_date=day(1))
    store.upsert_run(DAG, "undated")  # created now, after day(1): the newest
    assert [r.run_id for r in store.latest_runs(DAG, 5)] == ["undated", "dated"]


def test_cell_states_of_runs(store: ResultsStore) -> None:
    """Each asked run's cells with state, plan index and quarantine; nothing of other runs
    or other DAGs; a cell missing from a run has no record there."""
    for run in ("r1", "r2", "r3"):
        store.upsert_run(DAG, run, logical_date=day(int(run[1])))
    store.upsert_cell(DAG, "r1", "a", cell_index=0, state="passed")
    store.upsert_cell(DAG, "r1", "b", cell_index=1, state="failed", quarantined=True)
    store.upsert_cell(DAG, "r2", "a", cell_index=1, state="infra_failed")
    store.upsert_cell(DAG, "r2", "c")  # planned, no index yet
    store.upsert_cell(DAG, "r3", "a", cell_index=0, state="passed")  # not asked
    store.upsert_run(OTHER, "r1")
    store.upsert_cell(OTHER, "r1", "z", cell_index=0, state="passed")

    got = store.cell_states_of_runs(DAG, ["r1", "r2", "r2"])
    assert all(type(s) is CellStateRecord for s in got)
    assert sorted(got, key=lambda s: (s.run_id, s.cell_id)) == [
        CellStateRecord(run_id="r1", cell_id="a", cell_index=0, state="passed"),
        CellStateRecord(run_id="r1", cell_id="b", cell_index=1, state="failed", quarantined=True),
        CellStateRecord(run_id="r2", cell_id="a", cell_index=1, state="infra_failed"),
        CellStateRecord(run_id="r2", cell_id="c", cell_index=None, state="planned"),
    ]
    assert type(got[0].quarantined) is bool
    assert store.cell_states_of_runs(DAG, []) == []
    assert store.cell_states_of_runs(DAG, ["no_such_run"]) == []


def test_cell_totals_of_runs(store: ResultsStore) -> None:
    """Cells counted and their cost summed per asked run; a cost no cell recorded is None;
    a run without cells has no record."""
    for run in ("r1", "r2", "r3", "r4"):
        store.upsert_run(DAG, run)
    store.upsert_cell(DAG, "r1", "a", cost=1.5)
    store.upsert_cell(DAG, "r1", "b", cost=2.0)
    store.upsert_cell(DAG, "r1", "c")  # no cost recorded: counted, adds nothing
    store.upsert_cell(DAG, "r2", "a")
    store.upsert_cell(DAG, "r4", "a", cost=9.0)  # not asked
    store.upsert_run(OTHER, "r1")
    store.upsert_cell(OTHER, "r1", "a", cost=100.0)

    got = {t.run_id: t for t in store.cell_totals_of_runs(DAG, ["r1", "r2", "r3"])}
    assert got == {
        "r1": RunCellTotals(run_id="r1", cells=3, cost=3.5),
        "r2": RunCellTotals(run_id="r2", cells=1, cost=None),
    }
    assert store.cell_totals_of_runs(DAG, []) == []


def test_builds_of_runs(store: ResultsStore) -> None:
    """run_id -> the build tested, for the asked runs of the DAG that name one."""
    store.upsert_run(DAG, "r1", runtime_version="nightly-2026-03-01")
    store.upsert_run(DAG, "r2", runtime_version="nightly-2026-03-02")
    store.upsert_run(DAG, "r3")  # no build recorded
    store.upsert_run(DAG, "r4", runtime_version="nightly-2026-03-04")  # not asked
    store.upsert_run(OTHER, "r1", runtime_version="elsewhere")

    assert store.builds_of_runs(DAG, {"r1", "r2", "r3", "gone"}) == {
        "r1": "nightly-2026-03-01",
        "r2": "nightly-2026-03-02",
    }
    assert store.builds_of_runs(OTHER, ["r1"]) == {"r1": "elsewhere"}
    assert store.builds_of_runs(DAG, set()) == {}


def test_page_reads_check_the_dag_id(store: ResultsStore) -> None:
    """A bad DAG id is refused like every other read's, before any query."""
    for read in (
        lambda: store.latest_runs("", 5),
        lambda: store.cell_states_of_runs("", ["r1"]),
        lambda: store.cell_totals_of_runs("x" * 251, ["r1"]),
        lambda: store.builds_of_runs("", ["r1"]),
    ):
        with pytest.raises(ValueError, match="dag_id"):
            read()
