"""The cross-run reads perf history and the trend charts are built from."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Table,
    and_,
    or_,
    select,
)
from sqlalchemy.engine import Row

from accelmatrix.contracts.run_records import HistoryRows, PerfPoint
from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore
from accelmatrix.results.row_records import (
    cell_record,
    check_record,
    metric_record,
    perf_point,
    run_record,
)
from accelmatrix.results.runs import suite_runs
from accelmatrix.results.schema import (
    cells,
    checks,
    metrics,
    runs,
)


class HistoryQueries(StoreCore):
    """Reads over many runs of a suite, for accelmatrix.history and the matrix page."""

    # ------------------------------------------------------------------------------- history

    def history_rows(
        self,
        *,
        dag_id: str | None = None,
        suite: str | None = None,
        metric: str | None = None,
        benchmark: str | None = None,
        since: Any = None,
        until: Any = None,
        extra_metrics: Any = (),
    ) -> HistoryRows:
        """The records perf history is built from (see accelmatrix.history.series.frame).

        The runs, cells, metrics and checks, restricted
        to runs of ``dag_id``/``suite`` whose logical date is in [since, until], metric rows
        named ``metric`` (default: every metric a perf check judged) and perf check rows
        (those with a ``metric``), optionally of one ``benchmark``; ``extra_metrics`` adds
        metric rows of those names (the suite's tracked metrics, judged or not). Four indexed queries rather than one wide join: each table is read
        once and pandas does the join.
        """
        since_ = schema.to_utc(since)
        until_ = schema.to_utc(until)
        # Follow-up runs re-test named builds: samples of a confirmation, not nights.
        run_q = select(runs).where(suite_runs(runs))
        if dag_id is not None:
            run_q = run_q.where(runs.c.dag_id == dag_id)
        if suite is not None:
            run_q = run_q.where(runs.c.suite == suite)
        # A run without a logical date (a manual Airflow 3 run) is placed by its start.
        undated = runs.c.logical_date.is_(None)
        if since_ is not None:
            run_q = run_q.where(
                or_(runs.c.logical_date >= since_, and_(undated, runs.c.started_at >= since_))
            )
        if until_ is not None:
            run_q = run_q.where(
                or_(runs.c.logical_date <= until_, and_(undated, runs.c.started_at <= until_))
            )
        with self._reading() as conn:
            run_rows = [run_record(r) for r in conn.execute(run_q)]
            dags = sorted({r.dag_id for r in run_rows})
            run_ids = {(r.dag_id, r.run_id) for r in run_rows}

            def rows_of(table: Table, *extra: Any) -> list[Row]:
                if not dags:
                    return []
                q = select(table).where(table.c.dag_id.in_(dags), *extra)
                return [r for r in conn.execute(q) if (r.dag_id, r.run_id) in run_ids]

            cell_rows = [cell_record(r) for r in rows_of(cells)]
            check_filter = [checks.c.metric.is_not(None)]
            if metric:
                check_filter.append(checks.c.metric == metric)
            if benchmark:
                check_filter.append(checks.c.benchmark == benchmark)
            check_rows = [check_record(r) for r in rows_of(checks, *check_filter)]
            # Without ``metric``: only metrics some perf check judged, not every loss curve.
            names = [metric] if metric else sorted({c.metric for c in check_rows if c.metric})
            names = sorted({*names, *extra_metrics})
            metric_rows = (
                [metric_record(r) for r in rows_of(metrics, metrics.c.name.in_(names))]
                if names
                else []
            )
        return HistoryRows(runs=run_rows, cells=cell_rows, metrics=metric_rows, checks=check_rows)

    def perf_points(self, dag_id: str, *, since: Any = None, until: Any = None) -> list[PerfPoint]:
        """Every perf check verdict of the DAG's runs whose time is in [since, until]: run_id,
        cell_id, benchmark, metric, value (what the check judged), lower_bound, upper_bound,
        and the run's logical_date, started_at and created_at.

        One narrow indexed join, for the matrix page's trend charts: the full
        ``history_rows`` (every cell column of every run) is ~10x more to read for a
        1,024-cell suite. A run without a logical date is placed by its start.
        """
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        since_, until_ = schema.to_utc(since), schema.to_utc(until)
        q = (
            select(
                checks.c.run_id,
                checks.c.cell_id,
                checks.c.benchmark,
                checks.c.metric,
                checks.c.value,
                checks.c.lower_bound,
                checks.c.upper_bound,
                runs.c.logical_date,
                runs.c.started_at,
                runs.c.created_at,
            )
            .select_from(
                checks.join(
                    runs, and_(runs.c.dag_id == checks.c.dag_id, runs.c.run_id == checks.c.run_id)
                )
            )
            .where(
                checks.c.dag_id == dag_id,
                checks.c.metric.is_not(None),
                checks.c.benchmark.is_not(None),
                suite_runs(runs),  # no follow-up run (a re-test) is a point of a series
            )
        )
        undated = runs.c.logical_date.is_(None)
        if since_ is not None:
            q = q.where(
                or_(runs.c.logical_date >= since_, and_(undated, runs.c.started_at >= since_))
            )
        if until_ is not None:
            q = q.where(
                or_(runs.c.logical_date <= until_, and_(undated, runs.c.started_at <= until_))
            )
        with self._reading() as conn:
            return [perf_point(r) for r in conn.execute(q)]
