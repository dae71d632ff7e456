"""The warehouse's tables: one typed row record per table, and the functions that build the
rows of a run (and of a suite) from the results store's records.

The BigQuery schema of each table is derived from its row record (``bigquery_fields``): a
field's type gives the column type, ``X | None`` makes it NULLABLE, anything else REQUIRED,
and ``DESCRIPTIONS`` gives the column's description. So the rows written and the schema
created can never disagree, and docs/results-schema.md is checked against the same records
(tests/test_warehouse.py).

Every table carries ``suite`` (the DAG id), ``run_id`` and ``run_date`` (the run's logical
date, UTC; the partitioning column) so any two tables join on them, and ``run_kind``
(``default``, ``pull_request``, ``followup``) so retention can drop the shorter-lived kinds.

Which rows an export replaces (``TableSpec.key``):

* ``run``: runs, cells, metric_points, check_verdicts: every row of an exported run is
  replaced by the run's rows as the store holds them now (a re-run cell's new verdict, a
  retried gate's, a backfilled night's);
* ``suite``: change_points, retest_verdicts: a suite's change points and re-tests change
  after the run that found them (triage, confirmation, a later pass dropping a point), so
  each export of a run of the suite replaces all of the suite's rows with the current set.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from typing import Literal

import msgspec

from accelmatrix.contracts.change_point_records import ChangeGroup, ChangePoint, Confirmation
from accelmatrix.contracts.run_records import CellRecord, CheckRecord, MetricRecord, RunRecord

__all__ = [
    "CellRow",
    "ChangePointRow",
    "CheckVerdictRow",
    "DESCRIPTIONS",
    "MetricPointRow",
    "RetestVerdictRow",
    "RunRow",
    "TABLES",
    "TableSpec",
    "bigquery_fields",
    "cell_rows",
    "change_point_rows",
    "check_rows",
    "metric_rows",
    "retest_rows",
    "run_date",
    "run_row",
    "staging_fields",
    "TABLE_TAG",
]

RunKind = Literal["default", "pull_request", "followup"]
# Each row, encoded, names its table in this field: an export loads the rows of every table
# in one load job into one staging table, and the transaction sorts them out by it.
TABLE_TAG = "_table"


class RunRow(msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="runs"):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
    logical_date: datetime | None = None
    run_type: str | None = None
    state: str | None = None
    git_ref: str | None = None
    runtime_version: str | None = None
    params: str = "{}"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cells_total: int = 0
    cells_passed: int = 0
    cells_failed: int = 0
    cost: float | None = None
    exported_at: datetime


class CellRow(msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="cells"):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
    cell_id: str
    cell_index: int | None = None
    axes: str = "{}"
    machine: str | None = None
    backend: str | None = None
    quarantined: bool = False
    excluded_reason: str | None = None
    state: str
    passed: bool
    message: str = ""
    attempt: int = 0
    exit_code: int | None = None
    provision_started_at: datetime | None = None
    run_started_at: datetime | None = None
    run_ended_at: datetime | None = None
    workload_seconds: float | None = None
    resource_held_seconds: float | None = None
    cost: float | None = None


class MetricPointRow(
    msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="metric_points"
):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
    cell_id: str
    metric: str
    step: int | None = None
    value: float | None = None
    unit: str | None = None
    source: str | None = None


class CheckVerdictRow(
    msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="check_verdicts"
):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
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


class ChangePointRow(
    msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="change_points"
):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
    change_id: int
    cell_id: str
    metric: str
    benchmark: str | None = None
    machine: str | None = None
    backend: str | None = None
    runtime_version: str | None = None
    prev_run_id: str | None = None
    prev_runtime_version: str | None = None
    direction: str
    change: float | None = None
    effect: float | None = None
    p_value: float | None = None
    mean_before: float | None = None
    mean_after: float | None = None
    group_id: int | None = None
    state: str
    confirm_state: str | None = None
    detected_at: datetime | None = None


class RetestVerdictRow(
    msgspec.Struct, frozen=True, kw_only=True, tag_field=TABLE_TAG, tag="retest_verdicts"
):
    suite: str
    run_id: str
    run_date: date
    run_kind: str
    retest_id: int
    group_id: int
    state: str
    good_build: str | None = None
    suspect_build: str | None = None
    culprit: str | None = None
    last_good: str | None = None
    rounds: int = 0
    run_ids: str = "[]"
    decision: str | None = None
    cost: float | None = None
    reason: str | None = None
    created_at: datetime | None = None


class TableSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One warehouse table: its name, row record, what an export replaces, its clustering."""

    name: str
    row: type[msgspec.Struct]
    key: Literal["run", "suite"]
    clustering: tuple[str, ...]
    description: str


TABLES: tuple[TableSpec, ...] = (
    TableSpec(
        name="runs", row=RunRow, key="run", clustering=("suite", "run_id"),
        description="One row per exported run of a suite: its verdict and cell counts.",
    ),
    TableSpec(
        name="cells", row=CellRow, key="run", clustering=("suite", "cell_id"),
        description="One row per cell of a run, excluded cells included.",
    ),
    TableSpec(
        name="metric_points", row=MetricPointRow, key="run", clustering=("suite", "cell_id"),
        description="One row per (metric, step) a cell reported; step NULL for a scalar.",
    ),
    TableSpec(
        name="check_verdicts", row=CheckVerdictRow, key="run", clustering=("suite", "cell_id"),
        description="One row per check of a cell; perf checks add the value and bounds.",
    ),
    TableSpec(
        name="change_points", row=ChangePointRow, key="suite", clustering=("suite", "cell_id"),
        description="Where a perf series moved to a new level; run_id is the first run at it.",
    ),
    TableSpec(
        name="retest_verdicts", row=RetestVerdictRow, key="suite", clustering=("suite",),
        description="The re-test (confirm, bisect) of a change group and its verdict.",
    ),
)  # fmt: skip

# Every column's description (BigQuery's schema and docs/results-schema.md).
DESCRIPTIONS: dict[str, str] = {
    "suite": "the suite's DAG id",
    "run_id": "Airflow's run id (change_points: the first run at the new level; retest_verdicts: the re-test's latest run)",
    "run_date": "the run's logical date (UTC); the partitioning column",
    "run_kind": "default, pull_request or followup: which retention applies",
    "logical_date": "Airflow's logical date of the run",
    "run_type": "scheduled, manual, backfill, or a follow-up's kind",
    "state": "runs: passed or failed (the gate's verdict); cells: the cell's final state; change_points and retest_verdicts: triage or re-test state",
    "git_ref": "the git ref the run tested, when given",
    "runtime_version": "the build tested (change_points: the suspect build)",
    "params": "the run's params as JSON text",
    "started_at": "when the run started",
    "finished_at": "when the gate decided",
    "cells_total": "planned cells",
    "cells_passed": "cells that passed",
    "cells_failed": "cells that did not pass (quarantined ones included)",
    "cost": "cost of the run or cell, where the machines are priced",
    "exported_at": "when this row set was written",
    "cell_id": "the cell's id (its axis labels)",
    "cell_index": "the cell's position in the plan",
    "axes": "the cell's axis values as JSON text",
    "machine": "the machine kind",
    "backend": "the backend that ran the cell",
    "quarantined": "a quarantined cell never fails the run",
    "excluded_reason": "why the plan excluded the cell, if it did",
    "passed": "the cell passed / the check passed",
    "message": "the cell's or check's message",
    "attempt": "how many times the cell's workload ran",
    "exit_code": "the workload's exit code",
    "provision_started_at": "when the cell's machine was asked for",
    "run_started_at": "when the workload started",
    "run_ended_at": "when the workload ended",
    "workload_seconds": "the workload's wall time",
    "resource_held_seconds": "how long the cell held its machine",
    "metric": "the metric's name",
    "step": "the training step; NULL for a scalar metric",
    "value": "the metric's value (NULL for NaN); check_verdicts: the value a perf check judged",
    "unit": "the metric's unit",
    "source": "where the metric came from (a log line, a JUnit file, a profile)",
    "check_name": "the suite's check name",
    "check_type": "the suite's check type",
    "expected": "what the check expected",
    "observed": "what the check saw",
    "benchmark": "the perf benchmark key",
    "lower_bound": "the perf check's lower bound in force",
    "upper_bound": "the perf check's upper bound in force",
    "change_id": "the change point's id in the results store",
    "prev_run_id": "the last run before the change",
    "prev_runtime_version": "the last good build",
    "direction": "regression or improvement",
    "change": "mean_after / mean_before - 1",
    "effect": "the shift in the series' noise sigmas",
    "p_value": "the detector's p-value",
    "mean_before": "the series' mean before the change",
    "mean_after": "the series' mean after the change",
    "group_id": "the change group (cause) the point belongs to",
    "confirm_state": "the point's re-test outcome",
    "detected_at": "when the change point was found",
    "retest_id": "the re-test's id in the results store",
    "good_build": "the last good build re-tested",
    "suspect_build": "the suspect build re-tested",
    "culprit": "the build a bisect named",
    "last_good": "the last good build a bisect found",
    "rounds": "confirm rounds run",
    "run_ids": "the re-test's runs as a JSON array",
    "decision": "the verdict per target as JSON text",
    "reason": "why the re-test ended as it did",
    "created_at": "when the re-test started",
}

_BQ_TYPES: dict[type, str] = {
    str: "STRING",
    int: "INT64",
    float: "FLOAT64",
    bool: "BOOL",
    datetime: "TIMESTAMP",
    date: "DATE",
}


def staging_fields() -> list[tuple[str, str, str, str]]:
    """The staging table's columns: the table tag, then every table's columns (NULLABLE:
    each row fills its own table's). A column two tables share has one type in both."""
    out: dict[str, tuple[str, str, str, str]] = {
        TABLE_TAG: (TABLE_TAG, "STRING", "REQUIRED", "the table the row belongs to")
    }
    for spec in TABLES:
        for name, kind, _mode, text in bigquery_fields(spec.row):
            if name in out and out[name][1] != kind:
                raise TypeError(f"column {name} is {out[name][1]} and {kind} in {spec.name}")
            out.setdefault(name, (name, kind, "NULLABLE", text))
    return list(out.values())


def bigquery_fields(row: type[msgspec.Struct]) -> list[tuple[str, str, str, str]]:
    """(name, type, mode, description) of each column of a row record, in field order."""
    hints = typing.get_type_hints(row)
    out = []
    for name in row.__struct_fields__:
        hint = hints[name]
        mode = "REQUIRED"
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint, mode = args[0], "NULLABLE"
        out.append((name, _BQ_TYPES[hint], mode, DESCRIPTIONS[name]))
    return out


# -- rows from the store's records -------------------------------------------------------

_JSON = msgspec.json.Encoder(order="sorted")


def _json(value: object) -> str:
    return _JSON.encode(value).decode()


def run_date(run: RunRecord) -> date:
    """The partition of a run's rows: its logical date, else when it started or was made."""
    when = run.logical_date or run.started_at or run.created_at or datetime.now(UTC)
    return when.astimezone(UTC).date()


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: they become NULL (the store keeps NaN as NULL too)."""
    return x if x is not None and x == x and abs(x) != float("inf") else None


def run_row(
    run: RunRecord, cells: Sequence[CellRecord], kind: str, exported_at: datetime
) -> RunRow:
    costs = [c.cost for c in cells if c.cost is not None]
    passed = sum(1 for c in cells if c.state == "passed")
    return RunRow(
        suite=run.dag_id,
        run_id=run.run_id,
        run_date=run_date(run),
        run_kind=kind,
        logical_date=run.logical_date,
        run_type=run.run_type,
        state=run.state,
        git_ref=run.git_ref,
        runtime_version=run.runtime_version,
        params=_json(run.params),
        started_at=run.started_at,
        finished_at=run.finished_at,
        cells_total=len(cells),
        cells_passed=passed,
        cells_failed=len(cells) - passed,
        cost=sum(costs) if costs else None,
        exported_at=exported_at,
    )


def cell_rows(run: RunRecord, cells: Iterable[CellRecord], kind: str) -> list[CellRow]:
    day = run_date(run)
    return [
        CellRow(
            suite=run.dag_id,
            run_id=run.run_id,
            run_date=day,
            run_kind=kind,
            cell_id=c.cell_id,
            cell_index=c.cell_index,
            axes=_json(c.axes),
            machine=c.machine,
            backend=c.backend,
            quarantined=c.quarantined,
            excluded_reason=c.excluded_reason,
            state=c.state,
            passed=c.state == "passed",
            message=c.message,
            attempt=c.attempt,
            exit_code=c.exit_code,
            provision_started_at=c.provision_started_at,
            run_started_at=c.run_started_at,
            run_ended_at=c.run_ended_at,
            workload_seconds=_finite(c.workload_seconds),
            resource_held_seconds=_finite(c.resource_held_seconds),
            cost=_finite(c.cost),
        )
        for c in cells
    ]


def metric_rows(run: RunRecord, metrics: Iterable[MetricRecord], kind: str) -> list[MetricPointRow]:
    day = run_date(run)
    return [
        MetricPointRow(
            suite=run.dag_id,
            run_id=run.run_id,
            run_date=day,
            run_kind=kind,
            cell_id=m.cell_id,
            metric=m.name,
            step=m.step,
            value=_finite(m.value),
            unit=m.unit,
            source=m.source,
        )
        for m in metrics
    ]


def check_rows(run: RunRecord, checks: Iterable[CheckRecord], kind: str) -> list[CheckVerdictRow]:
    day = run_date(run)
    return [
        CheckVerdictRow(
            suite=run.dag_id,
            run_id=run.run_id,
            run_date=day,
            run_kind=kind,
            cell_id=c.cell_id,
            check_name=c.check_name,
            check_type=c.check_type,
            passed=c.passed,
            expected=c.expected,
            observed=c.observed,
            message=c.message,
            benchmark=c.benchmark,
            metric=c.metric,
            value=_finite(c.value),
            lower_bound=_finite(c.lower_bound),
            upper_bound=_finite(c.upper_bound),
        )
        for c in checks
    ]


def change_point_rows(points: Iterable[ChangePoint], kinds: dict[str, str]) -> list[ChangePointRow]:
    """``kinds``: run id -> run kind (a point of a run the store no longer has: default)."""
    return [
        ChangePointRow(
            suite=p.dag_id,
            run_id=p.run_id,
            run_date=p.logical_date.astimezone(UTC).date(),
            run_kind=kinds.get(p.run_id, "default"),
            change_id=p.id,
            cell_id=p.cell_id,
            metric=p.metric,
            benchmark=p.benchmark,
            machine=p.machine,
            backend=p.backend,
            runtime_version=p.runtime_version,
            prev_run_id=p.prev_run_id,
            prev_runtime_version=p.prev_runtime_version,
            direction=p.direction,
            change=_finite(p.change),
            effect=_finite(p.effect),
            p_value=_finite(p.p_value),
            mean_before=_finite(p.mean_before),
            mean_after=_finite(p.mean_after),
            group_id=p.group_id,
            state=p.state,
            confirm_state=p.confirm_state,
            detected_at=p.detected_at,
        )
        for p in points
    ]


def retest_rows(
    retests: Iterable[Confirmation], groups: dict[int, ChangeGroup]
) -> list[RetestVerdictRow]:
    """A re-test's row sits in its group's night (the group's logical date)."""
    out = []
    for r in retests:
        group = groups.get(r.group_id)
        when = group.logical_date if group is not None else (r.created_at or datetime.now(UTC))
        out.append(
            RetestVerdictRow(
                suite=r.dag_id,
                run_id=r.run_id or (r.run_ids[-1] if r.run_ids else ""),
                run_date=when.astimezone(UTC).date(),
                run_kind="followup",
                retest_id=r.id,
                group_id=r.group_id,
                state=r.state,
                good_build=r.good_build,
                suspect_build=r.suspect_build,
                culprit=r.culprit,
                last_good=r.last_good,
                rounds=r.round,
                run_ids=_json(r.run_ids),
                decision=_json(r.decision) if r.decision is not None else None,
                cost=_finite(r.cost),
                reason=r.reason,
                created_at=r.created_at,
            )
        )
    return out
