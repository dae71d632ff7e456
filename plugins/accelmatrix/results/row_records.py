"""Rows of the results database as the typed records of ``accelmatrix.contracts``: one
function per record, the only place a row becomes a record.

A record's fields are its table's columns (tests/test_results_store.py keeps them in step),
so each function hands the row's mapping over as it is; the one translation is a scalar
metric's step, stored as ``SCALAR_STEP`` and returned as None. ``records_frame`` is the one
way back to a table, for analysis in pandas: a column per field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy.engine import Row

from accelmatrix.contracts.change_point_records import ChangeGroup, ChangePoint, Confirmation
from accelmatrix.contracts.run_records import (
    CellRecord,
    CellStateRecord,
    CheckRecord,
    MetricRecord,
    PerfPoint,
    ReapedRecord,
    RunCellTotals,
    RunRecord,
)
from accelmatrix.contracts.series_records import AlertRecord, BoundsRecord, SeriesStatus
from accelmatrix.results.schema import SCALAR_STEP

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "alert_record",
    "bounds_record",
    "cell_record",
    "cell_state_record",
    "change_group",
    "change_point",
    "check_record",
    "confirmation",
    "metric_record",
    "perf_point",
    "records_frame",
    "reaped_record",
    "run_cell_totals",
    "run_record",
    "series_status_record",
]


def run_record(row: Row) -> RunRecord:
    return RunRecord(**row._mapping)


def cell_record(row: Row) -> CellRecord:
    return CellRecord(**row._mapping)


def cell_state_record(row: Row) -> CellStateRecord:
    """From a row of (run_id, cell_id, cell_index, state, quarantined)."""
    run_id, cell_id, cell_index, state, quarantined = row
    return CellStateRecord(
        run_id=run_id,
        cell_id=cell_id,
        cell_index=cell_index,
        state=state,
        quarantined=bool(quarantined),
    )


def run_cell_totals(row: Row) -> RunCellTotals:
    """From a row of (run_id, count of cells, sum of their cost)."""
    run_id, n, cost = row
    return RunCellTotals(run_id=run_id, cells=int(n), cost=cost)


def metric_record(row: Row) -> MetricRecord:
    m = row._mapping
    return MetricRecord(
        dag_id=m["dag_id"],
        run_id=m["run_id"],
        cell_id=m["cell_id"],
        name=m["name"],
        step=None if m["step"] == SCALAR_STEP else m["step"],
        value=m["value"],
        unit=m["unit"],
        source=m["source"],
    )


def check_record(row: Row) -> CheckRecord:
    return CheckRecord(**row._mapping)


def perf_point(row: Row) -> PerfPoint:
    return PerfPoint(**row._mapping)


def reaped_record(row: Row) -> ReapedRecord:
    return ReapedRecord(**row._mapping)


def change_point(row: Row) -> ChangePoint:
    return ChangePoint(**row._mapping)


def change_group(row: Row) -> ChangeGroup:
    return ChangeGroup(**row._mapping)


def confirmation(row: Row) -> Confirmation:
    return Confirmation(**row._mapping)


def series_status_record(row: Row) -> SeriesStatus:
    return SeriesStatus(**row._mapping)


def alert_record(row: Row) -> AlertRecord:
    return AlertRecord(**row._mapping)


def bounds_record(row: Row) -> BoundsRecord:
    return BoundsRecord(**row._mapping)


def records_frame(
    records: Sequence[msgspec.Struct], record_type: type[msgspec.Struct]
) -> pd.DataFrame:
    """A pandas frame of records of one type: a column per field, in the record's order."""
    import pandas as pd  # only here: the store's readers never need pandas otherwise

    return pd.DataFrame.from_records(
        [msgspec.structs.astuple(r) for r in records], columns=list(record_type.__struct_fields__)
    )
