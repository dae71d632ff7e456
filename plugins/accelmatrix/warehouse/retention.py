"""Retention, like Perfherder's data cycling: a run is kept for its kind's days
(``ACCELMATRIX_RETENTION``, e.g. ``default=365,pull_request=42``: 365 days for a suite's
runs, 42 for pull-request runs), in the results store and in the warehouse alike. Unset,
nothing is deleted anywhere: deleting history is a deployment's decision.

* The store: the maintenance DAG deletes every run older than its kind's days, with its
  cells, cell specs, step tries, metrics and check verdicts. Change points, change groups
  and re-tests stay: they are the perf history's decisions, small, and a person may have
  triaged them.
* The warehouse: each table's partition expiration is the longest retention (BigQuery drops
  whole partitions by itself, no job needed); the kinds kept for less are deleted by
  ``run_kind`` and ``run_date``, one DML statement per table.

A run's date is its logical date, else its start, else when it was recorded (the same day
``rows.run_date`` partitions it by).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec

from accelmatrix.warehouse.config import RUN_KINDS, Retention, WarehouseConfig, retention_from_env
from accelmatrix.warehouse.rows import TABLES

if TYPE_CHECKING:  # pragma: no cover
    from accelmatrix.results.store import ResultsStore
    from accelmatrix.warehouse.export import Warehouse

__all__ = ["RetentionReport", "apply_retention", "prune_store", "prune_warehouse"]

log = logging.getLogger("accelmatrix.warehouse")


class RetentionReport(msgspec.Struct, frozen=True, kw_only=True):
    store_runs_deleted: dict[str, int]
    warehouse_rows_deleted: dict[str, int] | None = None
    warehouse_error: str | None = None


def prune_store(store: ResultsStore, retention: Retention, now: datetime) -> dict[str, int]:
    """Delete the runs older than their kind's retention; runs deleted by kind."""
    from sqlalchemy import delete, func, select, tuple_

    from accelmatrix.results import schema
    from accelmatrix.warehouse.export import run_kind

    if not retention.days:
        return {}
    runs = schema.runs
    when = func.coalesce(runs.c.logical_date, runs.c.started_at, runs.c.created_at)
    oldest_kept = now - timedelta(days=min(retention.days.values()))
    store.ensure_schema()
    engine = store._get_engine()  # the store has no bulk delete of runs; its engine does it
    with engine.connect() as conn:
        candidates = conn.execute(
            select(runs.c.dag_id, runs.c.run_id).where(when < schema.to_utc(oldest_kept))
        ).all()
    doomed: list[tuple[str, str]] = []
    by_kind: dict[str, int] = {}
    for dag_id, run_id in candidates:
        run = store.get_run(dag_id, run_id)
        if run is None:
            continue
        kind = run_kind(store, run)
        days = retention.for_kind(kind)
        day = run.logical_date or run.started_at or run.created_at
        if days is not None and day is not None and day < now - timedelta(days=days):
            doomed.append((dag_id, run_id))
            by_kind[kind] = by_kind.get(kind, 0) + 1
    tables = [schema.metrics, schema.checks, schema.cell_specs, schema.step_tries, schema.cells]
    for i in range(0, len(doomed), 500):
        part = doomed[i : i + 500]
        with engine.begin() as conn:
            for table in [*tables, runs]:
                conn.execute(delete(table).where(tuple_(table.c.dag_id, table.c.run_id).in_(part)))
    return by_kind


def prune_warehouse(wh: Warehouse, retention: Retention, now: datetime) -> dict[str, int]:
    """Delete the rows of the kinds kept for less than the longest retention (partition
    expiration drops the rest); rows deleted by table. Makes the tables first, so their
    partition expiration follows a changed setting."""
    wh.ensure_tables()
    longest = retention.longest
    short = {
        k: d
        for k in RUN_KINDS
        if (d := retention.for_kind(k)) is not None and (longest is None or d < longest)
    }
    deleted: dict[str, int] = {}
    for spec in TABLES:
        for kind, days in sorted(short.items()):
            cutoff = (now - timedelta(days=days)).date().isoformat()
            job = wh.client.query(
                f"DELETE FROM `{wh.table_id(spec.name)}` "
                f"WHERE run_kind = '{kind}' AND run_date < DATE '{cutoff}'"
            )
            job.result()
            deleted[spec.name] = deleted.get(spec.name, 0) + int(job.num_dml_affected_rows or 0)
    return deleted


def apply_retention(now: datetime | None = None) -> RetentionReport:
    """The maintenance DAG's step: the store first, then the warehouse when one is set; a
    warehouse error is reported (and logged), the store's pruning stands."""
    from accelmatrix.results import results_store
    from accelmatrix.warehouse.export import Warehouse

    now = now or datetime.now(UTC)
    retention = retention_from_env()
    store_deleted = prune_store(results_store(), retention, now)
    log.info(
        "retention %s: store runs deleted by kind: %s", retention.days, store_deleted or "none"
    )
    config = WarehouseConfig.from_env()
    if config is None:
        return RetentionReport(store_runs_deleted=store_deleted)
    try:
        rows = prune_warehouse(Warehouse(config), config.retention, now)
    except Exception as e:  # noqa: BLE001 - partition expiration still runs in BigQuery
        log.error("warehouse retention not applied: %s: %s", type(e).__name__, e)
        return RetentionReport(store_runs_deleted=store_deleted, warehouse_error=str(e))
    log.info("warehouse rows deleted by table: %s", rows)
    return RetentionReport(store_runs_deleted=store_deleted, warehouse_rows_deleted=rows)
