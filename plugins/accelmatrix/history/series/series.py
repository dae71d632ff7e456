"""Classify a suite's perf series and store the verdicts (the ``series_status`` table).

Run by the gate after every run of a suite (so the page shows the verdict of the run that
just ended) and by the maintenance DAG for every suite (so verdicts age out of the window
even when a suite stops running). A series is (benchmark, cell, metric) of one suite over
its window; each point is judged against the bounds its check used at the time.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from accelmatrix.contracts.series_records import SeriesStatus
from accelmatrix.history.series.frame import history
from accelmatrix.history.series.regression import Rules, classify

if TYPE_CHECKING:
    import pandas as pd

    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite import RegressionRules, Suite

log = logging.getLogger(__name__)

__all__ = ["classify_suite", "rules_of", "tracked_metrics"]


def tracked_metrics(suite: Suite) -> dict[str, str]:
    """metric -> statistic of its steps, for every metric a check of ``suite`` judges and
    every metric its ``history.track`` adds."""
    out: dict[str, str] = {}
    for check in suite.checks:
        metric = getattr(check, "metric", None)
        if isinstance(metric, str) and metric:
            out.setdefault(metric, "median")
    out.update(suite.history.track)
    return out


def rules_of(spec: RegressionRules) -> tuple[Rules, int]:
    """(Rules, window_days) from a suite's ``regression:`` block (spec.suite.RegressionRules)."""
    return (
        Rules(
            min_points=spec.min_points,
            regression_run=spec.regression_run,
            suspicious_run=spec.suspicious_run,
            flaky_flips=spec.flaky_flips,
        ),
        int(spec.window_days),
    )


def classify_suite(
    store: ResultsStore,
    dag_id: str,
    *,
    rules: Rules | None = None,
    window_days: int = 30,
    now: datetime | None = None,
    open_regressions: set[tuple[str, str]] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Classify every bounded series of ``dag_id`` in the window, store and return them.

    ``regression`` means the series has an open regression change point
    (``open_regressions``: (cell, metric) pairs, from ``history.change_points.tracking``);
    points out of bounds at the end without one are ``suspicious``: bounds say "unusual",
    only a change point says "moved". Without ``open_regressions`` the bounds rules alone decide.

    Returns (verdicts, history): one row per series, and the history they came from.
    """
    import pandas as pd

    now = now or datetime.now(UTC)
    since = now - timedelta(days=window_days)
    h = history(store, metric=None, dag_id=dag_id, since=since, until=now)
    h = h[h["benchmark"] != ""]  # a series without bounds has no violations to judge
    verdicts = classify(h, rules or Rules())
    if open_regressions is not None and len(verdicts):
        moved = [
            (c, m) in open_regressions
            for c, m in zip(verdicts["cell_id"], verdicts["metric"], strict=True)
        ]
        status = verdicts["status"].where(verdicts["status"] != "regression", "suspicious")
        verdicts["status"] = status.where(~pd.Series(moved, index=verdicts.index), "regression")
    rows = [
        SeriesStatus(
            dag_id=dag_id,
            benchmark=r.benchmark,
            cell_id=r.cell_id,
            metric=r.metric,
            status=r.status,
            points=int(r.points),
            flips=int(r.flips),
            trailing=int(r.trailing_violations),
            longest_earlier=int(r.longest_earlier_violations),
            last_value=float(r.last_value),
            last_logical_date=_aware(r.last_time),
            window_days=window_days,
        )
        for r in verdicts.itertuples(index=False)
    ]
    store.replace_series_status(dag_id, rows, window_days=window_days)
    counts = verdicts["status"].value_counts().to_dict() if len(verdicts) else {}
    log.info("series of %s over %d day(s): %s", dag_id, window_days, counts or "none")
    return verdicts, h


def _aware(t: Any) -> datetime | None:
    import pandas as pd

    if t is None or t is pd.NaT:
        return None
    ts = pd.Timestamp(t)
    if pd.isna(ts):
        return None
    if ts.tzinfo is None:
        ts = ts.tz_localize("UTC")
    return ts.to_pydatetime()
