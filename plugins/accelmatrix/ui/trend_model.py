"""The matrix page's perf trends: points from the store, series verdicts, one chart each.

From the perf-check points of the shown window (``_history``, without pandas) and the
series verdicts (the gate's stored ones for the latest run, else classified here over the
window, ``_verdicts``), ``_trends`` builds one ``Trend`` per (benchmark, metric): the series
most urgent first, the bounds band in force at each time, and the bounds in force now for
the suite's bounds files (``current_bounds``: the file with the bounds re-centered since,
stored in the results store, applied). Separate from ``accelmatrix.ui.model`` (which builds
a run's grid of cells) because it is its own read of the store, with its own cost (the
classification needs pandas); ``model.load_run_view`` calls it, and ``ui/trend.py`` draws it.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from accelmatrix import settings
from accelmatrix.contracts.change_point_records import OPEN_STATES, ChangePoint
from accelmatrix.contracts.series_records import SeriesStatus
from accelmatrix.evaluation.bounds import BoundsError, load_bounds_in_force
from accelmatrix.history.series.frame import history
from accelmatrix.history.series.regression import classify
from accelmatrix.history.series.series import tracked_metrics
from accelmatrix.spec.checks.training import StepTimeWithinBoundsCheck
from accelmatrix.spec.include_paths import include_file
from accelmatrix.spec.loader import load_suite, resolve_suite

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

log = logging.getLogger("accelmatrix.ui.model")

# Series verdicts, most urgent first: the order trend charts pick series to draw in.
STATUS_PRIORITY = ("regression", "flaky", "suspicious", "ok", "insufficient_data")


@dataclass
class Point:
    time: datetime
    value: float
    lower: float
    upper: float
    run_id: str | None = None
    build: str | None = None  # the run's runtime_version (which build was tested)

    @property
    def violated(self) -> bool:
        lo, hi = self.lower, self.upper
        return (not math.isnan(lo) and self.value < lo) or (not math.isnan(hi) and self.value > hi)


@dataclass
class Series:
    cell_id: str
    status: str
    points: list[Point]
    changes: list[ChangePoint] = field(default_factory=list)  # oldest first


@dataclass
class Trend:
    """One chart: a benchmark's metric over time for the cells that ran it."""

    benchmark: str
    metric: str
    series: list[Series]  # drawn, most urgent first
    band: list[tuple[datetime, float, float]]  # bounds in force at each time
    current: tuple[float | None, float | None] | None  # bounds in the bounds file now
    hidden: dict[str, int] = field(default_factory=dict)  # status -> series not drawn

    @property
    def regressions(self) -> list[str]:
        return [s.cell_id for s in self.series if s.status == "regression"]


# -- history, verdicts, trends ------------------------------------------------------------
# (benchmark, metric, cell_id) -> points, oldest first
History = dict[tuple[str, str, str], list[Point]]


def _history(store: ResultsStore, dag_id: str, since: datetime, until: datetime) -> History:
    """The perf-check points of the window, keyed like ``history.series.frame.history`` (the
    check's judged value and bounds; a logical date tested twice keeps only the run that
    started last), without pandas: the page's common path never needs it."""
    rows = store.perf_points(dag_id, since=since, until=until)
    latest: dict[datetime, tuple[Any, ...]] = {}
    for r in rows:
        if r.logical_date is not None:
            rank = (r.started_at or r.created_at, r.created_at, r.run_id)
            if r.logical_date not in latest or latest[r.logical_date] < rank:
                latest[r.logical_date] = rank
    out: History = {}
    builds = _builds(store, dag_id, {r.run_id for r in rows})
    for r in rows:
        when = r.logical_date
        if when is not None and latest[when][2] != r.run_id:
            continue
        when = when or r.started_at or r.created_at
        nan = math.nan
        point = Point(
            when,
            nan if r.value is None else float(r.value),
            nan if r.lower_bound is None else float(r.lower_bound),
            nan if r.upper_bound is None else float(r.upper_bound),
            run_id=r.run_id,
            build=builds.get(r.run_id),
        )
        out.setdefault((r.benchmark, r.metric, r.cell_id), []).append(point)
    for pts in out.values():
        pts.sort(key=lambda p: p.time)
    return out


def _builds(store: ResultsStore, dag_id: str, run_ids: set[str]) -> dict[str, str]:
    """run_id -> runtime_version (the build a run tested) of the window's runs: one narrow
    read of the runs table (``perf_points`` does not carry it)."""
    return store.builds_of_runs(dag_id, run_ids)


def attach_changes(
    store: ResultsStore, dag_id: str, trends: list[Trend], since: datetime | None = None
) -> None:
    """Hang the stored change points (``change_points``) on the drawn series they belong to:
    same cell and metric, and same benchmark when the change point names one. A change
    point older than ``since`` (outside the chart's window) is left out."""
    if not trends:
        return
    try:
        rows = store.get_change_points(dag_id, since=since)
    except Exception:  # noqa: BLE001 - an older store without the table: no marks
        log.warning("matrix page: change points of %s not readable", dag_id, exc_info=True)
        return
    by_key: dict[tuple[str, str], list[ChangePoint]] = {}
    for r in rows:
        by_key.setdefault((r.metric, r.cell_id), []).append(r)
    for t in trends:
        for s in t.series:
            s.changes = [
                r
                for r in by_key.get((t.metric, s.cell_id), [])
                if not r.benchmark or r.benchmark == t.benchmark
            ]


def tracked_trends(
    store: ResultsStore,
    dag_id: str,
    since: datetime,
    until: datetime,
    max_series: int,
    judged: set[str],
) -> list[Trend]:
    """Charts of the metrics the suite's ``history.track`` adds that no perf check judges
    (no bounds: no band, no verdict), read the way the change-point detector reads them
    (``history.series.frame.history`` with the suite's per-metric statistic over steps), so the
    points drawn are the points analysed. Only when the suite file loads and tracks such
    a metric: pandas is imported then, never on the common path."""
    try:
        suite = load_suite(resolve_suite(dag_id, settings.suites_dir()))
        stats = {m: st for m, st in tracked_metrics(suite).items() if m not in judged}
    except Exception:  # noqa: BLE001 - a missing or broken suite: no extra charts
        return []
    if not stats:
        return []

    try:
        h = history(store, metric=None, dag_id=dag_id, since=since, until=until, stats=stats)
    except Exception:  # noqa: BLE001 - the extra charts never break the page
        log.warning("matrix page: tracked metrics of %s not readable", dag_id, exc_info=True)
        return []
    if h.empty:
        return []
    h = h[h["metric"].isin(list(stats))]
    out = []
    for metric in sorted(stats):
        rows = h[h["metric"] == metric]
        series = []
        for cid, g in rows.groupby("cell_id", sort=True):
            pts = [
                Point(
                    t.to_pydatetime(),
                    math.nan if v is None or v != v else float(v),
                    math.nan,
                    math.nan,
                    run_id=run_id,
                    build=b if isinstance(b, str) and b else None,
                )
                for t, v, run_id, b in zip(
                    g["time"], g["value"], g["run_id"], g["runtime_version"], strict=True
                )
            ]
            pts.sort(key=lambda p: p.time)
            series.append(Series(str(cid), "no_bounds", pts))
        if not series:
            continue
        hidden = {"not drawn": len(series) - max_series} if len(series) > max_series else {}
        out.append(
            Trend(
                benchmark="",
                metric=metric,
                series=series[:max_series],
                band=[],
                current=None,
                hidden=hidden,
            )
        )
    return out


def stored_verdicts(store: ResultsStore, dag_id: str) -> list[SeriesStatus]:
    """The gate's stored series verdicts (``series_status``) as they stand now.

    The gate calls a series ``regression`` when it has an open regression change point
    (``history.series.classify_suite``), and stores that until the suite's next run. A
    person who closed the change since (accepted it: the new level is the baseline; or
    invalid, infrastructure, fixed) has settled it: such a series is no regression any
    more, as the next gate will say. It reads ``ok`` once accepted (the bounds re-center
    onto the new level), else ``suspicious`` while its last points lie out of bounds."""
    rows = store.get_series_status(dag_id)
    if not any(r.status == "regression" for r in rows):
        return rows
    try:
        points = store.get_change_points(dag_id)
    except Exception:  # noqa: BLE001 - an older store without the table: as stored
        log.warning("change points of %s not readable", dag_id, exc_info=True)
        return rows
    open_, settled = set(), {}
    epoch = datetime.min.replace(tzinfo=UTC)
    for p in sorted(points, key=lambda p: (p.logical_date or epoch, p.id)):
        if p.direction != "regression":
            continue
        key = (p.cell_id, p.metric)
        if p.state in OPEN_STATES:
            open_.add(key)
        else:
            settled[key] = p.state  # the newest wins
    out = []
    for r in rows:
        key = (r.cell_id, r.metric)
        if r.status == "regression" and key in settled and key not in open_:
            out_of_bounds = settled[key] != "accepted" and (r.trailing or 0) > 0
            r = replace(r, status="suspicious" if out_of_bounds else "ok")
        out.append(r)
    return out


def _verdicts(
    store: ResultsStore, dag_id: str, hist: History, *, use_stored: bool
) -> tuple[dict[tuple[str, str, str], str], str]:
    """(benchmark, cell, metric) -> status: the gate's stored verdicts for the latest run
    (as triage left them: ``stored_verdicts``); classified here over the shown window
    otherwise (an older run, or none stored)."""
    if use_stored:
        stored = stored_verdicts(store, dag_id)
        if stored:
            return {(r.benchmark, r.cell_id, r.metric): r.status for r in stored}, ("series_status")
    if not hist:
        return {}, "computed"
    import pandas as pd

    frame = pd.DataFrame.from_records(
        [
            (bench, cid, metric, p.time, p.value, p.lower, p.upper)
            for (bench, metric, cid), pts in hist.items()
            for p in pts
        ],
        columns=["benchmark", "cell_id", "metric", "time", "value", "lower", "upper"],
    )
    v = classify(frame)
    keys = zip(v["benchmark"], v["cell_id"], v["metric"], strict=True)
    return dict(zip(keys, v["status"], strict=True)), "computed"


def _trends(
    dag_id: str,
    hist: History,
    verdicts: dict[tuple[str, str, str], str],
    max_series: int,
    store: ResultsStore | None = None,
) -> list[Trend]:
    if not hist:
        return []
    current = current_bounds(dag_id, store)
    rank = {s: i for i, s in enumerate(STATUS_PRIORITY)}
    charts: dict[tuple[str, str], list[Series]] = {}
    for (bench, metric, cid), pts in hist.items():
        status = verdicts.get((bench, cid, metric), "insufficient_data")
        charts.setdefault((bench, metric), []).append(Series(cid, status, pts))
    out = []
    for (bench, metric), series in sorted(charts.items()):
        series.sort(key=lambda s: (rank.get(s.status, len(rank)), s.cell_id))
        hidden: dict[str, int] = {}
        for s in series[max_series:]:
            hidden[s.status] = hidden.get(s.status, 0) + 1
        # The band: per point in time, the bounds the cells were judged against (one
        # benchmark's cells share them; the median shrugs off an odd one).
        at: dict[datetime, tuple[list[float], list[float]]] = {}
        for s in series:
            for p in s.points:
                lo, hi = at.setdefault(p.time, ([], []))
                lo.append(p.lower)
                hi.append(p.upper)
        band = [(t, _median(lo), _median(hi)) for t, (lo, hi) in sorted(at.items())]
        out.append(
            Trend(
                benchmark=bench,
                metric=metric,
                series=series[:max_series],
                band=band,
                current=current.get(bench),
                hidden=hidden,
            )
        )
    return out


def _median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def current_bounds(
    dag_id: str, store: ResultsStore | None = None
) -> dict[str, tuple[float | None, float | None]]:
    """benchmark -> (lower, upper) in force now for the bounds files the suite's perf checks
    name: the file with its stored rows applied (``store``; None: this process's store).

    The suite is read by the loader, as the DAG reads it, and its perf checks are the
    ``StepTimeWithinBoundsCheck``s in it. A suite that has since broken (or a file outside
    the include dir) only leaves the lines out: the history is still drawn.
    """

    out: dict[str, tuple[float | None, float | None]] = {}
    try:
        suite = load_suite(resolve_suite(dag_id, settings.suites_dir()))
    except Exception:  # noqa: BLE001 - a missing or broken suite only loses the lines
        return out
    files = {c.bounds_file for c in suite.checks if isinstance(c, StepTimeWithinBoundsCheck)}
    include = settings.include_dir()
    for f in sorted(files):
        try:
            p = include_file(include, f)
            loaded = load_bounds_in_force(
                p,
                include_dir=include,
                stored=None if store is None else store.bounds_in_force,
            )
        except (BoundsError, ValueError) as e:
            log.warning("matrix page: %s", e)
            continue
        for name, b in loaded.benchmarks.items():
            out.setdefault(name, (b.step_time_lower_bound, b.step_time_upper_bound))
    return out
