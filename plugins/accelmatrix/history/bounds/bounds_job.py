"""Re-center step-time bounds from the perf history (the maintenance DAG's main task).

For each benchmark of a bounds file: the step-time samples of the window (one per run and
cell: the median step time its check judged, from every suite that checks the benchmark),
bounds by ``compute_bounds`` (half-width = max(t-interval half-width, 1.5 % of the mean,
max - mean, mean - min)), stored in the results store (``bounds``: one row per benchmark,
with the window and the sample count). A benchmark with fewer than ``min_samples`` samples
keeps its old bounds, and the log says why: bounds from three noisy runs would fail good
runs or pass bad ones.

The bounds file itself is never written: in a deployment include/ comes from git (a DAG
bundle, git-sync), read-only or overwritten at the next deploy. It is the initial baseline;
the newest stored row of each benchmark is in force over it (``evaluation.bounds``), for
the checks, the pages and the next re-centering alike, and ``python -m accelmatrix bounds
export FILE`` prints the file with them applied, for a PR.

``bounds_table`` is the same computation for many benchmarks at once, vectorised; the job
uses the exact per-benchmark function (a bounds file holds tens of benchmarks), the bench
and the page use the table.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.contracts.change_point_records import OPEN_STATES, ChangePoint
from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.contracts.series_records import BoundsRecord, BoundsValues
from accelmatrix.evaluation.bounds import (
    MIN_RELATIVE_HALF_WIDTH,
    PERF_FIELDS,
    apply_stored,
    bounds_key,
    compute_bounds,
    load_bounds,
)
from accelmatrix.history.series.frame import history
from accelmatrix.results import results_store
from accelmatrix.spec.include_paths import include_file
from accelmatrix.spec.loader import SuiteError, load_suite, suite_files

if TYPE_CHECKING:
    import pandas as pd

    from accelmatrix.results.store import ResultsStore

log = logging.getLogger(__name__)

__all__ = [
    "MAINTENANCE_USER",
    "PERF_FIELDS",
    "Change",
    "RecenterReport",
    "bounds_table",
    "reason_line",
    "recenter",
    "recenter_accepted",
]

# Who the maintenance DAG's re-centering is, in the stored rows.
MAINTENANCE_USER = "accelmatrix-maintenance"


@dataclass
class Change:
    benchmark: str
    samples: int
    old: tuple[float | None, float | None]
    new: tuple[float, float] | None  # None: kept (too few samples)
    reason: str = ""

    def line(self) -> str:
        def fmt(b: tuple[Any, Any] | None) -> str:
            if b is None:
                return "unchanged"
            return "[" + ", ".join("-" if x is None else f"{x:.6g}" for x in b) + "]"

        if self.new is None:
            return f"{self.benchmark}: kept {fmt(self.old)}: {self.reason}"
        return f"{self.benchmark}: {fmt(self.old)} -> {fmt(self.new)} (n={self.samples})"


@dataclass
class RecenterReport:
    path: Path
    query_start: datetime
    query_end: datetime
    changes: list[Change] = field(default_factory=list)
    stored: bool = False  # rows were added to the results store (the file is never written)
    key: str = ""  # the file's key in the store (relative to the include dir)

    @property
    def updated(self) -> list[str]:
        return [c.benchmark for c in self.changes if c.new is not None]

    @property
    def kept(self) -> list[str]:
        return [c.benchmark for c in self.changes if c.new is None]


def recenter(
    path: str | Path,
    *,
    store: ResultsStore | None = None,
    window_days: int = 30,
    confidence_level: float = 0.95,
    min_samples: int = 10,
    metric: str = "step_time",
    now: datetime | None = None,
    include_dir: str | Path | None = None,
) -> RecenterReport:
    """Recompute every benchmark of the bounds file at ``path`` from the window's history.

    The old bounds are the ones in force (the file with its stored rows applied). Each
    benchmark that gets new bounds gets a stored row (reason ``maintenance``, by
    ``accelmatrix-maintenance``) whose detail records the window (query_start, query_end,
    window_days), the confidence level, min_samples and its sample count. The file is
    never written.
    """

    if window_days < 1:
        raise ValueError(f"window_days must be >= 1, got {window_days}")
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2 (a t-interval needs 2), got {min_samples}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    path = Path(path)
    file_bounds = load_bounds(path)
    end = now or datetime.now(UTC)
    start = end - timedelta(days=window_days)
    key = bounds_key(path, include_dir)
    report = RecenterReport(path=path, query_start=start, query_end=end, key=key)
    if store is None:
        store = results_store()
    bounds = apply_stored(file_bounds, store.bounds_in_force(key))
    h = history(store, metric=metric, since=start, until=end)
    h = h[h["benchmark"].isin(list(bounds.benchmarks)) & h["value"].map(_finite)]
    keep, held = baseline_points(h, store.get_change_points(metric=metric))
    h = h[keep]
    samples = {b: g["value"].tolist() for b, g in h.groupby("benchmark")}

    rows: list[BoundsValues] = []
    for name, bench in bounds.benchmarks.items():
        values = samples.get(name, [])
        old = (bench.step_time_lower_bound, bench.step_time_upper_bound)
        if name in held:
            change = Change(name, len(values), old, None, held[name])
            log.info("bounds %s", change.line())
            report.changes.append(change)
            continue
        if len(values) < min_samples:
            reason = (
                f"only {len(values)} sample(s) of {metric} between {start:%Y-%m-%d %H:%M} and "
                f"{end:%Y-%m-%d %H:%M} UTC; min_samples is {min_samples}"
            )
            change = Change(name, len(values), old, None, reason)
        else:
            new = compute_bounds(values, confidence_level)
            rows.append(BoundsValues(benchmark=name, **new, **_file_values(file_bounds, name)))
            change = Change(
                name,
                len(values),
                old,
                (new["step_time_lower_bound"], new["step_time_upper_bound"]),
            )
        log.info("bounds %s", change.line())
        report.changes.append(change)

    if rows:
        store.add_bounds(
            key,
            rows,
            reason="maintenance",
            by=MAINTENANCE_USER,
            detail={
                "query_start": start.isoformat(),
                "query_end": end.isoformat(),
                "window_days": window_days,
                "confidence_level": confidence_level,
                "min_samples": min_samples,
                "metric": metric,
                "samples": {r.benchmark: r.sample_size for r in rows},
            },
        )
        report.stored = True
        log.info(
            "stored re-centered bounds of %d benchmark(s) of %s in the results store "
            "(the file is not written)",
            len(rows),
            key,
        )
    else:
        log.info("%s unchanged: no benchmark had %d sample(s) in the window", key, min_samples)
    return report


def _file_values(file_bounds: Any, name: str) -> dict[str, Any]:
    """The file's own bounds of ``name``: what a stored row is made over (its baseline)."""
    b = file_bounds.benchmarks[name]
    return {
        "file_lower_bound": b.step_time_lower_bound,
        "file_upper_bound": b.step_time_upper_bound,
    }


def baseline_points(
    h: pd.DataFrame, change_points: list[ChangePoint]
) -> tuple[pd.Series, dict[str, str]]:
    """Which history points may set the bounds, and the benchmarks to hold as they are.

    Bounds follow only a level that nobody has to decide about, so a regression is never
    folded into them by the daily re-centering:

    * ``accepted`` change point: its new level is the baseline; points before it go.
    * ``untriaged`` or ``acknowledged`` change point (either direction): a person has yet
      to say whether the new level is the baseline; points from it on go. A regression in
      that state holds the benchmark's bounds outright (returned with the reason), even
      when enough older points remain.
    * ``fixed`` or ``infrastructure``: the points of the bad level, up to the series' next
      change point, go; the level around them counts.
    * ``invalid`` (noise): ignored.

    ``h`` is a history frame (dag_id, cell_id, metric, time, benchmark); returns a boolean
    mask over it and {benchmark: reason} of the held benchmarks.
    """
    import pandas as pd

    keep = pd.Series(True, index=h.index)
    held: dict[str, str] = {}
    by_series: dict[tuple[str, str, str], list[ChangePoint]] = {}
    for cp in change_points:
        by_series.setdefault((cp.dag_id, cp.cell_id, cp.metric), []).append(cp)
    if not by_series or h.empty:
        return keep, held
    times = pd.to_datetime(h["time"], utc=True)
    for (dag_id, cell_id, metric), cps in by_series.items():
        rows = (h["dag_id"] == dag_id) & (h["cell_id"] == cell_id) & (h["metric"] == metric)
        if not rows.any():
            continue
        cps = sorted(cps, key=lambda c: c.logical_date)
        for i, cp in enumerate(cps):
            at = pd.Timestamp(cp.logical_date)
            state = cp.state
            if state == "accepted":
                keep &= ~(rows & (times < at))
            elif state in OPEN_STATES:
                keep &= ~(rows & (times >= at))
                if cp.direction == "regression":
                    for bench in set(h.loc[rows, "benchmark"]) - {""}:
                        held.setdefault(
                            bench,
                            f"held: open regression in {cell_id} {metric} from "
                            f"{at:%Y-%m-%d} ({state}, change {cp.change:+.1%}); bounds "
                            "never re-center across it: accept, fix or mark it first",
                        )
            elif state in ("fixed", "infrastructure"):
                nxt = pd.Timestamp(cps[i + 1].logical_date) if i + 1 < len(cps) else None
                span = times >= at if nxt is None else (times >= at) & (times < nxt)
                keep &= ~(rows & span)
    return keep, held


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def bounds_table(
    history: pd.DataFrame, confidence: float, *, by: str = "benchmark", min_samples: int = 2
) -> pd.DataFrame:
    """``compute_bounds`` for every group of ``history`` (column ``value``) at once.

    One row per group with min_samples or more finite values: the fields of a bounds file.
    """
    import numpy as np
    from scipy.stats import t

    v = history[[by, "value"]]
    v = v[np.isfinite(v["value"].to_numpy(dtype="float64"))]
    g = v.groupby(by, sort=True)["value"]
    agg = g.agg(["count", "mean", "std", "min", "max"])
    agg = agg[agg["count"] >= max(2, min_samples)]
    n = agg["count"].to_numpy(dtype="float64")
    mean = agg["mean"].to_numpy()
    t_half = t.ppf((1 + confidence) / 2, n - 1) * agg["std"].to_numpy() / np.sqrt(n)
    half = np.maximum.reduce(
        [
            t_half,
            MIN_RELATIVE_HALF_WIDTH * np.abs(mean),
            agg["max"].to_numpy() - mean,
            mean - agg["min"].to_numpy(),
        ]
    )
    out = agg.assign(
        step_time_lower_bound=np.maximum(0.0, mean - half),
        step_time_upper_bound=mean + half,
        confidence_interval=t_half,
        average=mean,
        sample_size=agg["count"].astype("int64"),
    )
    return out[list(PERF_FIELDS)]


def maintenance_recenter(
    bounds_files: list[str],
    *,
    window_days: int,
    confidence_level: float,
    min_samples: int,
    now: datetime | None = None,
) -> JsonObject:
    """The maintenance DAG's ``recenter_bounds`` task: every file (relative to the include
    dir, no ``..``; none given: every bounds file a suite's checks read), one report line
    per benchmark; returns a JSON-able summary."""

    include = settings.include_dir().resolve()
    if not bounds_files:
        found: list[Path] = []
        for path in suite_files(settings.suites_dir()):
            found += [p for p in suite_bounds_files(path.stem) if p not in found]
        bounds_files = [str(p.relative_to(include)) for p in found]
        log.info("bounds files read by the suites: %s", ", ".join(bounds_files) or "none")
    out: dict[str, Any] = {}
    for rel in bounds_files:
        path = include_file(include, rel, field="bounds_files")
        rep = recenter(
            path,
            window_days=window_days,
            confidence_level=confidence_level,
            min_samples=min_samples,
            now=now,
        )
        out[rel] = {
            "stored": rep.stored,
            "updated": rep.updated,
            "kept": rep.kept,
            "changes": [c.line() for c in rep.changes],
        }
    return out


def suite_bounds_files(dag_id: str) -> list[Path]:
    """The bounds files the suite ``dag_id``'s checks read (inside the include dir), from
    its suite file; none when the file is gone or invalid."""

    include = settings.include_dir().resolve()
    for path in suite_files(settings.suites_dir()):
        if path.stem != dag_id:
            continue
        try:
            suite = load_suite(path)
        except SuiteError as e:
            log.warning("%s: bounds files unknown (suite invalid: %s)", dag_id, e)
            return []
        found = []
        for check in suite.checks:
            rel = getattr(check, "bounds_file", None)  # step_time_within_bounds, final_loss
            if not rel:
                continue
            try:
                target = include_file(include, rel)
            except ValueError as e:  # a rendered placeholder may still lead outside
                log.warning("%s: %s", dag_id, e)
                continue
            if target not in found:
                found.append(target)
        return found
    return []


def recenter_accepted(
    store: ResultsStore,
    points: list[ChangePoint],
    *,
    by: str = "accelmatrix",
    change: JsonObject | None = None,
    note: str | None = None,
) -> list[str]:
    """Re-center the bounds of accepted change points' benchmarks onto their new level.

    The new center is the median of the points' ``median_after`` per benchmark (one
    benchmark is shared by the cells of one model); the interval keeps the width of the
    bounds in force, as the torchprime runbook asks of a re-baseline: the noise did not
    change, the level did. Stored as a row per benchmark (reason ``accepted change``,
    ``by`` the person, ``change`` what was accepted: dag_id and group_id or change_id,
    ``note`` theirs); the bounds file is never written. Returns one line per benchmark
    touched (or why it was not).
    """
    import statistics

    by_bench: dict[tuple[str, str], list[float]] = {}
    for p in points:
        level = p.median_after
        if p.benchmark and level is not None and math.isfinite(level):
            by_bench.setdefault((p.dag_id, p.benchmark), []).append(float(level))
    lines = []
    files: dict[Path, Any] = {}
    for (dag_id, bench), levels in sorted(by_bench.items()):
        center = statistics.median(levels)
        touched = False
        for path in suite_bounds_files(dag_id):
            if path not in files:
                files[path] = load_bounds(path)
            file_bounds = files[path]
            if bench not in file_bounds.benchmarks:
                continue
            key = bounds_key(path)
            b = apply_stored(file_bounds, store.bounds_in_force(key)).benchmarks[bench]
            lo, hi = b.step_time_lower_bound, b.step_time_upper_bound
            if lo is None or hi is None:
                lines.append(f"{bench} in {path.name}: kept (no two-sided interval to move)")
                touched = True
                continue
            half = (hi - lo) / 2
            new = BoundsValues(
                benchmark=bench,
                step_time_lower_bound=max(0.0, center - half),
                step_time_upper_bound=center + half,
                average=center,
                confidence_interval=b.confidence_interval,
                sample_size=b.sample_size,
                **_file_values(file_bounds, bench),
            )
            detail = {**(change or {}), "dag_id": dag_id, "level": center, "points": len(levels)}
            store.add_bounds(key, [new], reason="accepted change", by=by, detail=detail, note=note)
            line = (
                f"{bench} in {path.name}: [{lo:.6g}, {hi:.6g}] -> "
                f"[{new.step_time_lower_bound:.6g}, {new.step_time_upper_bound:.6g}] "
                f"(accepted level {center:.6g}, width kept; stored, {path.name} unchanged)"
            )
            log.info("bounds %s", line)
            lines.append(line)
            touched = True
        if not touched:
            lines.append(f"{bench}: no bounds file of {dag_id} holds it")
    return lines


def reason_line(row: BoundsRecord) -> str:
    """Why a stored row was written, in words: the accepted change or the window."""
    d = row.detail or {}
    if row.reason == "accepted change":
        what = (
            f"change group {d['group_id']}"
            if d.get("group_id") is not None
            else f"change {d['change_id']}"
            if d.get("change_id") is not None
            else "a change"
        )
        of = f" of {d['dag_id']}" if d.get("dag_id") else ""
        level = d.get("level")
        at = f", new level {level:.6g}" if isinstance(level, int | float) else ""
        return f"accepted {what}{of}{at}"
    if row.reason == "maintenance":
        n = (d.get("samples") or {}).get(row.benchmark)
        start, end = str(d.get("query_start") or "?")[:10], str(d.get("query_end") or "?")[:10]
        return (
            f"maintenance: {n if n is not None else '?'} sample(s) from {start} to {end}"
            f" ({d.get('window_days', '?')} days, confidence {d.get('confidence_level', '?')})"
        )
    return str(row.reason or "?")
