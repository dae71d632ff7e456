"""The records of a suite run as the results store returns them: the run, its cells, their
metrics and check verdicts, a perf point of a trend, and a janitor decision; and the metric
value a cell's collect step hands the store (``MetricValue``). Two narrow records are the
cross-run reads of the history page: a cell's state in one run (``CellStateRecord``) and a
run's cell count and cost (``RunCellTotals``).

Each is a frozen ``msgspec.Struct`` whose fields are the columns of its table in
``accelmatrix.results.schema`` (same names, same order; a test keeps them in step), built
from a row by one function in ``accelmatrix.results.row_records``. msgspec rather than
dataclasses: a history read builds tens of thousands of these (1,024 cells x a month of
nights), and a Struct is built several times faster and smaller than a frozen dataclass;
``msgspec.structs.astuple`` hands them to pandas without a dict per row. Frozen: a record
is what the database held when it was read; a change goes back through the store.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from accelmatrix.contracts.json_types import JsonObject

__all__ = [
    "FOLLOWUP_RUN_TYPES",
    "CellRecord",
    "CellStateRecord",
    "CheckRecord",
    "HistoryRows",
    "MetricRecord",
    "MetricValue",
    "PerfPoint",
    "ReapedRecord",
    "RunCellTotals",
    "RunRecord",
]

# The run types (``RunRecord.run_type``) of a suite's follow-up runs: re-tests of named builds
# for a confirmation or a bisect step. They are never points of the suite's perf series.
# Stated here, beside the record, so a page can name them without the database schema.
FOLLOWUP_RUN_TYPES = ("confirm", "bisect", "compare")


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One run of a suite's DAG (``runs``). ``runtime_version`` is the build tested (the
    suite's runtime/image version with ``${run.ds}`` resolved); pages may label it "build"."""

    dag_id: str
    run_id: str
    suite: str | None = None
    logical_date: datetime | None = None
    run_type: str | None = None
    params: JsonObject = msgspec.field(default_factory=dict)
    git_ref: str | None = None
    runtime_version: str | None = None
    state: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CellRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One cell of a run (``cells``): where it ran, its state and its timings."""

    dag_id: str
    run_id: str
    cell_id: str
    cell_index: int | None = None
    axes: JsonObject = msgspec.field(default_factory=dict)
    machine: str | None = None
    backend: str | None = None
    quarantined: bool = False
    excluded_reason: str | None = None
    state: str = "planned"
    message: str = ""
    attempt: int = 0
    exit_code: int | None = None
    provision_started_at: datetime | None = None
    provisioned_at: datetime | None = None
    run_started_at: datetime | None = None
    run_ended_at: datetime | None = None
    teardown_at: datetime | None = None
    resource_held_seconds: float | None = None
    workload_seconds: float | None = None
    cost: float | None = None
    data_docs: str | None = None
    updated_at: datetime | None = None


class CellStateRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A cell's state in one run: the four columns of ``cells`` a grid of cells x runs needs
    (``ResultsStore.cell_states_of_runs``). Not a ``CellRecord``: a month of nights of a
    1,024-cell suite is 30,000 rows, read for each history page, and the whole row
    (axes JSON, messages, timings) is several times more to read and decode."""

    run_id: str
    cell_id: str
    cell_index: int | None = None
    state: str = "planned"
    quarantined: bool = False


class RunCellTotals(msgspec.Struct, frozen=True, kw_only=True):
    """How many cells a run has and what they cost together (``cells``, summed by the
    database: ``ResultsStore.cell_totals_of_runs``). ``cost`` is None when no cell of the
    run recorded one."""

    run_id: str
    cells: int
    cost: float | None = None


class MetricRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One metric value of a cell (``metrics``); ``step`` None for a scalar."""

    dag_id: str
    run_id: str
    cell_id: str
    name: str
    step: int | None = None
    value: float | None = None
    unit: str | None = None
    source: str | None = None


class MetricValue(msgspec.Struct, frozen=True, kw_only=True):
    """One metric value a cell's collect step measured, as ``replace_metrics`` takes it: a
    ``MetricRecord`` without the cell's key. ``step`` None for a scalar; ``value`` None is
    stored as NaN (NaN and inf are kept: a loss that became NaN is a finding)."""

    name: str
    value: float | None
    step: int | None = None
    unit: str | None = None
    source: str | None = None


class CheckRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One check verdict of a cell (``checks``). ``check_name``/``check_type`` are the
    suite's check ``name``/``type``; the perf fields are set for a bounded perf check only."""

    dag_id: str
    run_id: str
    cell_id: str
    check_name: str
    check_type: str = ""
    passed: bool
    expected: str | None = None
    observed: str | None = None
    message: str | None = None
    benchmark: str | None = None
    metric: str | None = None
    value: float | None = None
    lower_bound: float | None = None
    upper_bound: float | None = None


class PerfPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One perf check verdict placed in time: a point of a trend chart."""

    run_id: str
    cell_id: str
    benchmark: str
    metric: str
    value: float | None
    lower_bound: float | None
    upper_bound: float | None
    logical_date: datetime | None
    started_at: datetime | None
    created_at: datetime | None


class HistoryRows(msgspec.Struct, frozen=True, kw_only=True):
    """What perf history is built from (``ResultsStore.history_rows``): the runs of a
    window, their cells, the metrics named and the perf checks."""

    runs: list[RunRecord]
    cells: list[CellRecord]
    metrics: list[MetricRecord]
    checks: list[CheckRecord]


class ReapedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One janitor decision (``reaped``): what was (or in a dry run would be) deleted."""

    id: int
    backend: str
    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    dag_id: str | None = None
    run_id: str | None = None
    cell_id: str | None = None
    reason: str
    dry_run: bool
    error: str | None = None
    at: datetime
