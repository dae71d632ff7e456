"""Tables of the results store, as SQLAlchemy Core objects on one ``MetaData``.

Core (not the ORM) because every write is a single keyed upsert or a delete+insert of one
cell's rows: there is no object graph to track, and Core lets the store pick the dialect's
native ``INSERT ... ON CONFLICT`` statement. The column types below hide three portability
problems from callers, so the API behaves the same on the SQLite dev file and on PostgreSQL:

* timestamps: SQLite has no time zones, so values are normalised to UTC on the way in and
  come back as aware UTC datetimes on every dialect;
* JSON: stored as canonical text (sorted keys), not a native JSON type, so the same
  ``params``/``axes`` compare equal as strings on every database;
* NaN: SQLite silently turns a bound NaN into NULL, so a metric value NULL *means* NaN on
  every dialect (and SQL aggregates skip it, which is what a NaN sample deserves).

`docs/results-schema.md` documents every column; keep it in sync with this file.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from accelmatrix.cell_state import CellState
from accelmatrix.contracts.run_records import FOLLOWUP_RUN_TYPES as FOLLOWUP_RUN_TYPES

# Airflow caps dag_id/run_id at 250 characters; cell ids join every axis label, so they get
# more room. Lengths are enforced in Python too (see store.py) so an over-long id fails the
# same way on SQLite, which ignores VARCHAR lengths, as on PostgreSQL, which does not.
ID_LEN = 250
CELL_ID_LEN = 1024
NAME_LEN = 250
LABEL_LEN = 250

# `metrics.step` of a scalar metric. A NULL step would make the unique key useless (NULLs
# never collide in a unique index), so scalars get a sentinel; the API maps it to None.
SCALAR_STEP = -1


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_utc(value: Any) -> datetime | None:
    """An aware UTC stdlib datetime from a datetime or ISO-8601 string; naive input rejected.

    Naive datetimes are refused rather than assumed UTC: a worker's local time silently
    stored as UTC would shift durations and perf history by hours with no error anywhere.
    Strings are accepted because Jinja-templated operator fields arrive rendered as text.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"not an ISO-8601 timestamp: {value!r}") from exc
    if not isinstance(value, datetime):
        raise ValueError(f"expected a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"timestamp {value.isoformat()} has no time zone: pass an aware UTC one")
    v = value.astimezone(UTC)
    # Rebuild as a plain datetime: pendulum (Airflow's) subclasses carry extra behaviour that
    # some drivers format differently.
    return datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, whatever the dialect stores."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        v = to_utc(value)
        if v is not None and dialect.name == "sqlite":
            # SQLite's DATETIME is text without an offset: store the UTC wall time.
            return v.replace(tzinfo=None)
        return v

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JsonText(TypeDecorator[Any]):
    """JSON documents stored as canonical text; dicts in, dicts out."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        # default=str: Airflow params can hold datetimes and the like; a lossy string beats
        # failing the task that only wanted to record its run.
        return json.dumps(value, sort_keys=True, default=str)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        return json.loads(value)


class MetricValue(TypeDecorator[float]):
    """Floats where NaN is stored as NULL (SQLite cannot hold NaN) and read back as NaN.

    +/-inf need nothing special: SQLite REAL and PostgreSQL double precision both keep them.
    """

    impl = Float(precision=53)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> float | None:
        if value is None:
            return None
        v = float(value)
        return None if math.isnan(v) else v

    def process_result_value(self, value: Any, dialect: Dialect) -> float:
        return math.nan if value is None else float(value)


metadata = MetaData()


def _key_columns(*, with_cell: bool) -> list[Column[Any]]:
    cols: list[Column[Any]] = [
        Column("dag_id", String(ID_LEN), nullable=False),
        Column("run_id", String(ID_LEN), nullable=False),
    ]
    if with_cell:
        cols.append(Column("cell_id", String(CELL_ID_LEN), nullable=False))
    return cols


runs = Table(
    "runs",
    metadata,
    *_key_columns(with_cell=False),
    Column("suite", String(LABEL_LEN), nullable=True),
    Column("logical_date", UtcDateTime, nullable=True),
    Column("run_type", String(LABEL_LEN), nullable=True),
    Column("params", JsonText, nullable=False, default=lambda: {}),
    Column("git_ref", String(LABEL_LEN), nullable=True),
    # The suite's runtime/image version with ${run.ds} resolved: which build was tested.
    Column("runtime_version", String(LABEL_LEN), nullable=True),
    Column("state", String(LABEL_LEN), nullable=True),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False, default=utcnow),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    PrimaryKeyConstraint("dag_id", "run_id", name="pk_runs"),
    # Perf history is read per suite over time.
    Index("ix_runs_suite_logical_date", "suite", "logical_date"),
)

cells = Table(
    "cells",
    metadata,
    *_key_columns(with_cell=True),
    Column("cell_index", Integer, nullable=True),
    Column("axes", JsonText, nullable=False, default=lambda: {}),
    Column("machine", String(LABEL_LEN), nullable=True),
    Column("backend", String(LABEL_LEN), nullable=True),
    Column("quarantined", Boolean, nullable=False, default=False),
    Column("excluded_reason", Text, nullable=True),
    Column("state", String(LABEL_LEN), nullable=False, default=CellState.PLANNED.value),
    Column("message", Text, nullable=False, default=""),
    Column("attempt", Integer, nullable=False, default=0),
    Column("exit_code", Integer, nullable=True),
    Column("provision_started_at", UtcDateTime, nullable=True),
    Column("provisioned_at", UtcDateTime, nullable=True),
    Column("run_started_at", UtcDateTime, nullable=True),
    Column("run_ended_at", UtcDateTime, nullable=True),
    Column("teardown_at", UtcDateTime, nullable=True),
    Column("resource_held_seconds", Float(precision=53), nullable=True),
    Column("workload_seconds", Float(precision=53), nullable=True),
    Column("cost", Float(precision=53), nullable=True),
    Column("data_docs", Text, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    PrimaryKeyConstraint("dag_id", "run_id", "cell_id", name="pk_cells"),
)

# The newest try of each task that has written a cell's row (results/fence.py): a write
# from an older try of the same task is refused, so a stale try cannot move the row back.
step_tries = Table(
    "step_tries",
    metadata,
    *_key_columns(with_cell=True),
    Column("task_id", String(ID_LEN), nullable=False),
    Column("try_number", Integer, nullable=False),
    PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "task_id", name="pk_step_tries"),
)

# What plan decided for each cell of a run (the expanded cell: workload, machine, checks),
# written once by plan and read by each of the cell's tasks. The mapped tasks are expanded
# over small cell references, not these, because Airflow hands every mapped task instance
# the whole list it is mapped over: N cells of ~1 KB each per task start would make a run's
# traffic grow with N squared (lifecycle/plan_step.py).
cell_specs = Table(
    "cell_specs",
    metadata,
    *_key_columns(with_cell=True),
    Column("spec", JsonText, nullable=False),
    PrimaryKeyConstraint("dag_id", "run_id", "cell_id", name="pk_cell_specs"),
)

metrics = Table(
    "metrics",
    metadata,
    *_key_columns(with_cell=True),
    Column("name", String(NAME_LEN), nullable=False),
    Column("step", Integer, nullable=False, default=SCALAR_STEP),
    Column("value", MetricValue, nullable=True),
    Column("unit", String(LABEL_LEN), nullable=True),
    Column("source", String(LABEL_LEN), nullable=True),
    # The unique key doubles as the primary key: no surrogate id is needed, and the index it
    # creates also serves "all metrics of a cell" (its prefix).
    PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "name", "step", name="pk_metrics"),
    # Perf tracking reads one metric of one DAG across many runs.
    Index("ix_metrics_dag_name", "dag_id", "name"),
)

checks = Table(
    "checks",
    metadata,
    *_key_columns(with_cell=True),
    Column("check_name", String(NAME_LEN), nullable=False),
    Column("check_type", String(LABEL_LEN), nullable=False, default=""),
    Column("passed", Boolean, nullable=False),
    Column("expected", Text, nullable=True),
    Column("observed", Text, nullable=True),
    Column("message", Text, nullable=True),
    # Perf checks only (step_time_within_bounds): the resolved benchmark key (the
    # ``${axis.model}`` of the suite, rendered), the metric judged, the value the check saw
    # and the bounds in force at the time. Perf history groups by these; NULL elsewhere.
    Column("benchmark", String(NAME_LEN), nullable=True),
    Column("metric", String(NAME_LEN), nullable=True),
    Column("value", Float(precision=53), nullable=True),
    Column("lower_bound", Float(precision=53), nullable=True),
    Column("upper_bound", Float(precision=53), nullable=True),
    PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "check_name", name="pk_checks"),
    Index("ix_checks_benchmark", "benchmark"),
)

series_status = Table(
    "series_status",
    metadata,
    # One verdict per (suite, benchmark, cell, metric) series, replaced per suite each time
    # the suite's history is classified (accelmatrix.history.series.series).
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("benchmark", String(NAME_LEN), nullable=False),
    Column("cell_id", String(CELL_ID_LEN), nullable=False),
    Column("metric", String(NAME_LEN), nullable=False),
    Column("status", String(LABEL_LEN), nullable=False),
    Column("points", Integer, nullable=False),
    Column("flips", Integer, nullable=False),
    Column("trailing", Integer, nullable=False),
    Column("longest_earlier", Integer, nullable=False, default=0),
    Column("last_value", MetricValue, nullable=True),
    Column("last_logical_date", UtcDateTime, nullable=True),
    Column("window_days", Integer, nullable=False),
    Column("computed_at", UtcDateTime, nullable=False, default=utcnow),
    PrimaryKeyConstraint("dag_id", "benchmark", "cell_id", "metric", name="pk_series_status"),
)

alerts = Table(
    "alerts",
    metadata,
    # At most one alert per (suite, cell): a failure opens it, later failures count as
    # recurrences, a pass resolves it, a failure after that re-opens it (see history.alerts).
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("cell_id", String(CELL_ID_LEN), nullable=False),
    Column("status", String(LABEL_LEN), nullable=False),  # open | resolved
    Column("kind", String(LABEL_LEN), nullable=False),  # failure | regression
    Column("recurrences", Integer, nullable=False, default=1),
    Column("opened_at", UtcDateTime, nullable=False),
    Column("last_seen_at", UtcDateTime, nullable=False),
    Column("resolved_at", UtcDateTime, nullable=True),
    Column("first_run_id", String(ID_LEN), nullable=False),
    Column("last_run_id", String(ID_LEN), nullable=False),
    Column("last_state", String(LABEL_LEN), nullable=True),
    Column("message", Text, nullable=False, default=""),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    # GitHub issues of this alert, {"<conn_id>:<owner>/<repo>": number}: so a recurrence
    # comments on and a resolution closes the issue the opening created (notifications/transport.py).
    Column("issues", JsonText, nullable=True),
    PrimaryKeyConstraint("dag_id", "cell_id", name="pk_alerts"),
)

# A change point of a perf series (accelmatrix.history.change_points.tracking): where one
# metric of one cell moved to a new level, found by the detector over the series ordered by
# logical date.
# Keyed by the series and the first run at the new level; the detector may move that run by
# one point as more nights arrive (the row is updated, its triage kept).
change_points = Table(
    "change_points",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("cell_id", String(CELL_ID_LEN), nullable=False),
    Column("metric", String(NAME_LEN), nullable=False),
    Column("benchmark", String(NAME_LEN), nullable=True),
    Column("machine", String(LABEL_LEN), nullable=True),
    Column("backend", String(LABEL_LEN), nullable=True),
    # The first run at the new level (the suspect build) and the last run before it (the
    # last good build): what a bisect searches between.
    Column("run_id", String(ID_LEN), nullable=False),
    Column("logical_date", UtcDateTime, nullable=False),
    Column("runtime_version", String(LABEL_LEN), nullable=True),
    Column("prev_run_id", String(ID_LEN), nullable=True),
    Column("prev_logical_date", UtcDateTime, nullable=True),
    Column("prev_runtime_version", String(LABEL_LEN), nullable=True),
    Column("position", Integer, nullable=False),  # 0-based index in the analysed series
    Column("n_before", Integer, nullable=False),
    Column("n_after", Integer, nullable=False),
    Column("mean_before", MetricValue, nullable=True),
    Column("mean_after", MetricValue, nullable=True),
    Column("median_before", MetricValue, nullable=True),
    Column("median_after", MetricValue, nullable=True),
    Column("std_before", MetricValue, nullable=True),
    Column("std_after", MetricValue, nullable=True),
    Column("change", MetricValue, nullable=True),  # mean_after / mean_before - 1
    Column("effect", MetricValue, nullable=True),  # shift in the series' noise sigmas
    Column("p_value", MetricValue, nullable=True),
    Column("direction", String(LABEL_LEN), nullable=False),  # regression | improvement
    Column("group_id", Integer, nullable=True),  # change_groups.id
    Column("state", String(LABEL_LEN), nullable=False, default="untriaged"),
    Column("state_by", String(LABEL_LEN), nullable=True),
    Column("state_at", UtcDateTime, nullable=True),
    Column("note", Text, nullable=True),
    # Passes in a row that analysed its series without finding it again: a report is taken
    # back only after two (history.change_points.tracking.RETRACT_MISSES), so a change at the
    # edge of significance does not flicker out and back in, losing its group and its triage.
    Column("missing", Integer, nullable=False, default=0),
    # The re-test of this change (accelmatrix.history.retests.followup): confirmed | not_reproduced |
    # undecided | failed | refused, and the decision (both samples' medians, spread, p).
    Column("confirm_state", String(LABEL_LEN), nullable=True),
    Column("confirm", JsonText, nullable=True),
    # Who placed the change on its night: None, the detector; "retest", the re-test that
    # proved its first bad build (history.retests.placement), with the detector's own placement
    # kept beside it for audit (detected_*; the detector's latest, as it re-finds it).
    Column("placed_by", String(LABEL_LEN), nullable=True),
    Column("detected_run_id", String(ID_LEN), nullable=True),
    Column("detected_logical_date", UtcDateTime, nullable=True),
    Column("detected_runtime_version", String(LABEL_LEN), nullable=True),
    Column("detected_at", UtcDateTime, nullable=False, default=utcnow),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    UniqueConstraint("dag_id", "cell_id", "metric", "logical_date", name="uq_change_points"),
    Index("ix_change_points_group", "group_id"),
    # SQLite would hand a deleted row's id to the next insert: a re-test keyed by a group
    # id, or naming its change points by id, would then answer for a stranger's change.
    sqlite_autoincrement=True,
)

# One cause behind the change points of one night (accelmatrix.history.series.grouping): a build
# that moved many cells, a machine kind that moved while the others stayed flat, or a
# single series. One notification per group; triage of a group applies to its members.
change_groups = Table(
    "change_groups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("kind", String(LABEL_LEN), nullable=False),  # build | infrastructure | series
    Column("direction", String(LABEL_LEN), nullable=False),
    Column("run_id", String(ID_LEN), nullable=True),
    Column("logical_date", UtcDateTime, nullable=False),
    Column("runtime_version", String(LABEL_LEN), nullable=True),
    Column("prev_logical_date", UtcDateTime, nullable=True),
    Column("prev_runtime_version", String(LABEL_LEN), nullable=True),
    Column("machine", String(LABEL_LEN), nullable=True),  # the machine kind of an infra group
    Column("summary", Text, nullable=False, default=""),  # one line naming the cause
    Column("series_count", Integer, nullable=False, default=0),
    Column("cells", JsonText, nullable=False, default=lambda: []),
    Column("machines", JsonText, nullable=False, default=lambda: []),
    Column("metrics", JsonText, nullable=False, default=lambda: []),
    Column("change_median", MetricValue, nullable=True),
    Column("change_min", MetricValue, nullable=True),
    Column("change_max", MetricValue, nullable=True),
    Column("state", String(LABEL_LEN), nullable=False, default="untriaged"),
    Column("state_by", String(LABEL_LEN), nullable=True),
    Column("state_at", UtcDateTime, nullable=True),
    Column("note", Text, nullable=True),
    Column("notified_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False, default=utcnow),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    Index("ix_change_groups_dag", "dag_id", "logical_date"),
    # SQLite would hand a deleted row's id to the next insert: a re-test keyed by a group
    # id, or naming its change points by id, would then answer for a stranger's change.
    sqlite_autoincrement=True,
)

# FOLLOWUP_RUN_TYPES (imported above): the run types (runs.run_type) of a suite's follow-up
# runs, stated with the run record (contracts/run_records.py).

# The re-test of one suspect group (accelmatrix.history.retests.followup): a confirm run of the suite
# (last good and suspect build, interleaved, repeated), more rounds while undecided, then a
# bisect of the builds in between, one suite run per step. One row per group at most: the
# unique key is what keeps a re-run gate or a restarted scheduler from starting a second.
confirmations = Table(
    "confirmations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("group_id", Integer, nullable=False),  # change_groups.id
    # confirming | bisecting | confirmed | not_reproduced | undecided | failed | refused |
    # found | ambiguous (the last seven are final)
    Column("state", String(LABEL_LEN), nullable=False),
    # What is re-tested: [{change_id, cell_id, metric, statistic, higher_is_better, claimed}]
    Column("targets", JsonText, nullable=False, default=lambda: []),
    Column("good_build", String(LABEL_LEN), nullable=True),
    Column("suspect_build", String(LABEL_LEN), nullable=True),
    Column("builds", JsonText, nullable=False, default=lambda: []),  # the bisect's range
    Column("round", Integer, nullable=False, default=0),  # runs started so far
    Column("run_id", String(ID_LEN), nullable=True),  # the follow-up run in flight
    Column("run_ids", JsonText, nullable=False, default=lambda: []),
    Column("samples", JsonText, nullable=False, default=lambda: {}),  # current comparison
    Column("decision", JsonText, nullable=True),  # the confirmation's verdict, per target
    Column("steps", JsonText, nullable=False, default=lambda: []),  # the bisect's steps
    Column("culprit", String(LABEL_LEN), nullable=True),
    Column("last_good", String(LABEL_LEN), nullable=True),
    Column("cost", MetricValue, nullable=True),
    Column("reason", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False, default=utcnow),
    Column("updated_at", UtcDateTime, nullable=False, default=utcnow),
    UniqueConstraint("dag_id", "group_id", name="uq_confirmations_group"),
    # SQLite would hand a deleted row's id to the next insert: a re-test keyed by a group
    # id, or naming its change points by id, would then answer for a stranger's change.
    sqlite_autoincrement=True,
)

# Columns callers may set through upsert_run / upsert_cell: everything but the key and the
# bookkeeping timestamps the store maintains itself.
_MANAGED = {"dag_id", "run_id", "cell_id", "created_at", "updated_at"}
RUN_FIELDS: tuple[str, ...] = tuple(c.name for c in runs.columns if c.name not in _MANAGED)
CELL_FIELDS: tuple[str, ...] = tuple(c.name for c in cells.columns if c.name not in _MANAGED)
# The columns of ``checks`` a bounded perf check's verdict fills (``CheckVerdict.perf``).
CHECK_PERF_FIELDS: tuple[str, ...] = ("benchmark", "metric", "value", "lower_bound", "upper_bound")

# What the janitor deleted (or, in a dry run, would have deleted) and why. Append-only: one
# row per resource per janitor decision, so an on-call can tell who removed a machine.
reaped = Table(
    "reaped",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("backend", String(LABEL_LEN), nullable=False),
    Column("name", Text, nullable=False),
    Column("labels", JsonText, nullable=False, default=lambda: {}),
    Column("dag_id", String(ID_LEN), nullable=True),
    Column("run_id", String(ID_LEN), nullable=True),
    Column("cell_id", String(CELL_ID_LEN), nullable=True),
    Column("reason", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("error", Text, nullable=True),
    Column("at", UtcDateTime, nullable=False, default=utcnow),
    Index("ix_reaped_at", "at"),
)

# Step-time bounds re-centered by accelmatrix (history.bounds.bounds_job): the bounds files under
# include/ are the initial baseline and are never written (a deployment's include/ comes
# from git). Append-only: each re-centering adds one row per benchmark; the newest row of a
# (file, benchmark), by id, is in force while the file still holds the values it was made
# over (file_lower_bound, file_upper_bound): a file changed since (a merged PR) wins.
bounds = Table(
    "bounds",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # The bounds file, relative to the include dir (posix), as a suite's check names it.
    Column("file", String(NAME_LEN), nullable=False),
    Column("benchmark", String(NAME_LEN), nullable=False),
    Column("step_time_lower_bound", Float(precision=53), nullable=True),
    Column("step_time_upper_bound", Float(precision=53), nullable=True),
    Column("average", Float(precision=53), nullable=True),
    Column("confidence_interval", Float(precision=53), nullable=True),
    Column("sample_size", Integer, nullable=True),
    # The file's bounds when the row was written: the baseline it replaces.
    Column("file_lower_bound", Float(precision=53), nullable=True),
    Column("file_upper_bound", Float(precision=53), nullable=True),
    Column("reason", String(LABEL_LEN), nullable=False),  # accepted change | maintenance
    # Why, in detail: the change (dag_id, group_id or change_id, level) or the window
    # (query_start, query_end, window_days, confidence_level, min_samples, samples).
    Column("detail", JsonText, nullable=False, default=lambda: {}),
    Column("by", String(LABEL_LEN), nullable=False),  # the Airflow user, or the maintenance
    Column("at", UtcDateTime, nullable=False, default=utcnow),
    Column("note", Text, nullable=True),
    Index("ix_bounds_file_benchmark", "file", "benchmark", "id"),
)

# GitHub webhook deliveries already acted on (accelmatrix.ui.github_webhook): a replayed
# delivery (the same X-GitHub-Delivery id) starts nothing. One row per delivery id.
github_deliveries = Table(
    "github_deliveries",
    metadata,
    Column("delivery_id", String(ID_LEN), primary_key=True),
    Column("event", String(LABEL_LEN), nullable=False),
    Column("at", UtcDateTime, nullable=False, default=utcnow),
)

# A suite run started for a pull request's head commit: what its gate reports back to (a
# commit status and one comment per pull request and suite, edited in place). ``kind`` is
# "verdict" (the suite's cells on the head) or "compare" (the head's perf against the base
# commit on one machine per cell); ``comment_id`` is the pull request's comment, the same on
# every row of (dag_id, repo, number) once posted.
pull_request_runs = Table(
    "pull_request_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dag_id", String(ID_LEN), nullable=False),
    Column("run_id", String(ID_LEN), nullable=False),
    Column("kind", String(LABEL_LEN), nullable=False),
    Column("repo", String(NAME_LEN), nullable=False),
    Column("number", Integer, nullable=False),
    Column("head_sha", String(LABEL_LEN), nullable=False),
    Column("base_ref", String(NAME_LEN), nullable=False),
    Column("base_sha", String(LABEL_LEN), nullable=False),
    Column("sender", String(NAME_LEN), nullable=False),
    Column("fork", Boolean, nullable=False),
    Column("comment_id", BigInteger, nullable=True),
    Column("created_at", UtcDateTime, nullable=False, default=utcnow),
    UniqueConstraint("dag_id", "run_id", name="uq_pull_request_runs_run"),
    Index("ix_pull_request_runs_pr", "dag_id", "repo", "number", "id"),
)
