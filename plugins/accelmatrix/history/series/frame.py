"""Perf history as one pandas table: every cell's metric per run, with its run metadata.

One row per (run, cell, metric): the value (the median over steps, the same statistic the
step-time check judges; a scalar metric as is), the benchmark and bounds the cell's perf
check used at the time (``benchmark``/``lower``/``upper``; empty benchmark and NaN bounds for
a metric no perf check judged), the check's verdict, the cell's axes, machine, backend,
resource-held seconds and cost, and the run's suite, logical date, runtime version, git
ref and run type. ``time`` is the logical date (the run's start for a run without one).

Keyed by logical date: a logical date tested twice under different run ids (a manual
re-test of a nightly, a second backfill) keeps only the latest run's rows, so a re-run
replaces the history point instead of adding a second one. The columns SERIES_KEY, time,
value, lower and upper are what ``history.series.regression.classify`` reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from accelmatrix.contracts.run_records import CellRecord, CheckRecord, MetricRecord, RunRecord
from accelmatrix.results import results_store
from accelmatrix.results.row_records import records_frame

if TYPE_CHECKING:
    import pandas as pd

    from accelmatrix.results.store import ResultsStore

__all__ = ["HISTORY_COLUMNS", "history"]

HISTORY_COLUMNS = [
    "suite",
    "dag_id",
    "run_id",
    "logical_date",
    "time",
    "run_type",
    "runtime_version",
    "git_ref",
    "run_state",
    "cell_id",
    "axes",
    "machine",
    "backend",
    "quarantined",
    "cell_state",
    "resource_held_seconds",
    "workload_seconds",
    "cost",
    "benchmark",
    "metric",
    "value",
    "points",
    "lower",
    "upper",
    "passed",
]


def history(
    store: ResultsStore | None = None,
    *,
    metric: str | None = "step_time",
    dag_id: str | None = None,
    suite: str | None = None,
    benchmark: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    dedupe: bool = True,
    stats: dict[str, str] | None = None,
) -> pd.DataFrame:
    """The history of ``metric`` (None: every metric a perf check judged), oldest first.

    ``since``/``until`` bound the logical date (aware datetimes, inclusive). ``benchmark``
    keeps only rows of that benchmark. ``stats`` (metric -> median | mean | last | min |
    max) adds those metrics, each point being that statistic over the run's steps (the
    median when not given). Columns: HISTORY_COLUMNS, plus one ``axis.NAME`` column per
    axis seen.
    """
    import pandas as pd

    if store is None:
        store = results_store()
    stats = dict(stats or {})
    raw = store.history_rows(
        dag_id=dag_id,
        suite=suite,
        metric=metric,
        benchmark=benchmark,
        since=since,
        until=until,
        extra_metrics=sorted(stats),
    )
    runs = records_frame(raw.runs, RunRecord)
    if runs.empty:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    key = ["dag_id", "run_id", "cell_id"]

    values = _metric_values(raw.metrics, stats)
    checks = _perf_checks(raw.checks)
    df = values.merge(checks, on=[*key, "metric"], how="outer")
    if benchmark is not None:
        df = df[df["benchmark"] == benchmark]
    # What the check judged wins (same statistic); the metric rows fill in where no check ran.
    df["value"] = df["check_value"].where(df["check_value"].notna(), df["value"])
    df["benchmark"] = df["benchmark"].fillna("")

    cells = records_frame(raw.cells, CellRecord)
    cell_cols = [
        "axes",
        "machine",
        "backend",
        "quarantined",
        "state",
        "resource_held_seconds",
        "workload_seconds",
        "cost",
    ]
    cells = cells[[*key, *cell_cols]].rename(columns={"state": "cell_state"})
    df = df.merge(cells, on=key, how="left")
    run_cols = [
        "dag_id",
        "run_id",
        "suite",
        "logical_date",
        "run_type",
        "runtime_version",
        "git_ref",
        "state",
        "started_at",
        "created_at",
    ]
    df = df.merge(runs[run_cols].rename(columns={"state": "run_state"}), on=key[:2], how="inner")
    df["logical_date"] = pd.to_datetime(df["logical_date"], utc=True)
    started = pd.to_datetime(df["started_at"], utc=True)
    df["time"] = df["logical_date"].where(df["logical_date"].notna(), started)
    if dedupe and not df.empty:
        df = _latest_per_logical_date(df, started)
    for c in ("resource_held_seconds", "workload_seconds", "cost", "value", "lower", "upper"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df = df.sort_values(["time", "dag_id", "cell_id", "metric"], kind="mergesort")
    df = df.reset_index(drop=True)
    out = df[HISTORY_COLUMNS].copy()
    axes = out["axes"].map(lambda a: a if isinstance(a, dict) else {})
    for name in sorted({k for a in axes for k in a}):
        out[f"axis.{name}"] = axes.map(lambda a, n=name: a.get(n))
    return out


def _metric_values(rows: list[MetricRecord], stats: dict[str, str]) -> pd.DataFrame:
    """One value per (run, cell, metric): the median over steps (or the metric's statistic
    in ``stats``), with the step count."""
    import pandas as pd

    cols = ["dag_id", "run_id", "cell_id", "metric", "value", "points"]
    if not rows:
        return pd.DataFrame(columns=cols)
    m = records_frame(rows, MetricRecord)
    m["value"] = m["value"].astype("float64")
    m = m.sort_values("step", kind="mergesort", na_position="first")
    g = m.groupby(["dag_id", "run_id", "cell_id", "name"], sort=False)["value"]
    out = g.agg(value="median", points="size").reset_index()
    for stat in sorted(set(stats.values()) - {"median"}):
        names = [n for n, s in stats.items() if s == stat]
        sub = m[m["name"].isin(names)]
        if sub.empty:
            continue
        agg = sub.groupby(["dag_id", "run_id", "cell_id", "name"], sort=False)["value"].agg(stat)
        key = ["dag_id", "run_id", "cell_id", "name"]
        out = out.merge(agg.rename("_stat").reset_index(), on=key, how="left")
        out["value"] = out["_stat"].where(
            out["_stat"].notna() | ~out["name"].isin(names), out["value"]
        )
        out = out.drop(columns="_stat")
    return out.rename(columns={"name": "metric"})[cols]


def _perf_checks(rows: list[CheckRecord]) -> pd.DataFrame:
    """Perf check rows: benchmark, bounds and verdict per (run, cell, metric)."""
    import pandas as pd

    cols = ["dag_id", "run_id", "cell_id", "metric", "benchmark", "check_value"]
    cols += ["lower", "upper", "passed"]
    if not rows:
        return pd.DataFrame(columns=cols)
    c = records_frame(rows, CheckRecord)
    c = c.rename(columns={"value": "check_value", "lower_bound": "lower", "upper_bound": "upper"})
    # Two perf checks of one metric in one cell: keep one (the first by name), so a value
    # is never counted twice in a series.
    c = c.sort_values("check_name").drop_duplicates(["dag_id", "run_id", "cell_id", "metric"])
    return c[cols]


def _latest_per_logical_date(df: pd.DataFrame, started: pd.Series) -> pd.DataFrame:
    """Keep, per (suite DAG, logical date), only the rows of the run that started last."""
    import pandas as pd

    df = df.assign(_started=started, _created=pd.to_datetime(df["created_at"], utc=True))
    dated = df[df["logical_date"].notna()]
    latest = dated.sort_values(["_started", "_created"], kind="mergesort").drop_duplicates(
        ["dag_id", "logical_date"], keep="last"
    )[["dag_id", "run_id"]]
    keep = dated.merge(latest, on=["dag_id", "run_id"], how="inner")
    return pd.concat([keep, df[df["logical_date"].isna()]], ignore_index=True)
