"""The records of a suite's standing as the results store returns them: a series' perf
verdict, a cell's alert, and a re-centering of a benchmark's bounds; and the new bounds of
one benchmark as a re-centering hands them to the store (``BoundsValues``).

Frozen ``msgspec.Struct``s whose fields are the columns of ``series_status``, ``alerts``
and ``bounds`` (accelmatrix.results.schema; a test keeps them in step), built from rows in
``accelmatrix.results.row_records``; msgspec for the reason given in ``run_records``.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from accelmatrix.contracts.json_types import JsonObject

__all__ = ["AlertRecord", "BoundsRecord", "BoundsValues", "SeriesStatus"]


class SeriesStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The perf verdict of one series (benchmark, cell, metric) over the window
    (``series_status``): regression | flaky | suspicious | ok | insufficient_data."""

    dag_id: str
    benchmark: str
    cell_id: str
    metric: str
    status: str
    points: int
    flips: int
    trailing: int
    longest_earlier: int = 0
    last_value: float | None = None
    last_logical_date: datetime | None = None
    window_days: int = 0
    computed_at: datetime | None = None


class AlertRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The alert of one (suite, cell) (``alerts``): opened by a failure, its recurrences
    counted, resolved by a pass. ``issues``: its GitHub issues, "<conn_id>:<owner>/<repo>"
    -> number."""

    dag_id: str
    cell_id: str
    status: str  # open | resolved
    kind: str  # failure | regression
    recurrences: int = 1
    opened_at: datetime
    last_seen_at: datetime
    resolved_at: datetime | None = None
    first_run_id: str
    last_run_id: str
    last_state: str | None = None
    message: str = ""
    updated_at: datetime | None = None
    issues: dict[str, int] | None = None


class BoundsRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One re-centering of a benchmark's step-time bounds in a bounds file (``bounds``);
    ``file_*_bound``: the file's bounds it was made over. ``detail``: why (the change, or
    the maintenance window)."""

    id: int
    file: str
    benchmark: str
    step_time_lower_bound: float | None = None
    step_time_upper_bound: float | None = None
    average: float | None = None
    confidence_interval: float | None = None
    sample_size: int | None = None
    file_lower_bound: float | None = None
    file_upper_bound: float | None = None
    reason: str
    detail: JsonObject = msgspec.field(default_factory=dict)
    by: str
    at: datetime
    note: str | None = None


class BoundsValues(msgspec.Struct, frozen=True, kw_only=True):
    """The new step-time bounds of one benchmark, as ``add_bounds`` takes them: the
    per-benchmark fields of a ``BoundsRecord`` (file, reason, detail, by, at and note are the
    same for every benchmark of one re-centering and passed once). ``file_*_bound``: the
    bounds file's own values they were made over."""

    benchmark: str
    step_time_lower_bound: float | None = None
    step_time_upper_bound: float | None = None
    average: float | None = None
    confidence_interval: float | None = None
    sample_size: int | None = None
    file_lower_bound: float | None = None
    file_upper_bound: float | None = None
