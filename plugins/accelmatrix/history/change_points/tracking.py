"""The change points of a suite's perf series, kept current in the results store.

Pure functions over frames do the work; ``update_changes`` is the one edge that reads the
history and writes the store. The gate calls it after each run over the last ``window``
points of every series (incremental: the newest nights are where changes appear); the
maintenance DAG calls it over every point (``full``), which also finds slow changes that
need more than a window to stand out.

``find_changes``  series -> change points with their runs, builds and statistics
``match``         found vs stored: a change re-found within one point of where it was
                  stored is the same change (its triage is kept); an untriaged one no
                  longer found is retracted (a 2-night blip at the end that went away)
``group``         one group per cause (``history.series.grouping``), one notification per group
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from accelmatrix.contracts import change_point_records
from accelmatrix.contracts.change_point_records import OPEN_STATES, ChangeGroup
from accelmatrix.history.retests.confirm import SUSPECT_BASELINE, newest_point_suspect
from accelmatrix.history.retests.followup import ACTIVE_STATES, NOTIFY_STATES
from accelmatrix.history.retests.placement import keep_placement, settle
from accelmatrix.history.series.detector import (
    DEFAULT,
    ChangePoint,
    Detector,
    Segment,
    detect_many,
)
from accelmatrix.history.series.frame import history
from accelmatrix.history.series.grouping import RETRACTED_BY, as_utc, regroup

if TYPE_CHECKING:
    import pandas as pd

    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite import HistorySpec

log = logging.getLogger(__name__)

# One row of a pandas frame (``DataFrame.to_dict("records")``): column -> cell, each cell of
# its column's type (str, float, Timestamp, ...); Any because a frame's columns are not typed.
FrameRow: TypeAlias = "dict[str, Any]"

__all__ = [
    "ChangeUpdate",
    "detector_for",
    "find_changes",
    "match",
    "update_changes",
]

SERIES = ("cell_id", "metric")
# A stored change re-found this many points from where it was is the same change, moved:
# with a few points after it, a small step's position is uncertain by a night or two.
MOVE = 3
# A regression in one series alone is notified once it has held this many nights, or at
# once if it is tail_guard sigmas large; one in several series at once (a build, a machine
# kind) is notified at once: its siblings are the corroboration.
CONFIRM_NIGHTS = 4
# ... and only with this many points before it: from fewer, the series' noise is not known
# well enough to page anyone on one series (the change is still stored and shown).
MIN_HISTORY = 8
# The gate's window pass takes back only reports with fewer points after them than this (a
# tail that went away); the maintenance DAG's full pass decides about the others.
RETRACT_AFTER = 8
# ... and only once it was missing from this many passes in a row.
RETRACT_MISSES = 2
# Re-test verdicts (history.retests.followup) after which a change is real, whatever the detector
# says of its tail later (a one-night suspect is never re-found by it).
CONFIRMED_STATES = ("confirmed", "found", "ambiguous")


def detector_for(spec: HistorySpec) -> Detector:
    """The default detector with the suite's ``history`` overrides."""
    overrides = {
        k: getattr(spec, k)
        for k in ("penalty", "min_effect", "min_change")
        if getattr(spec, k, None) is not None
    }
    return replace(DEFAULT, **overrides)


def find_changes(
    hist: pd.DataFrame,
    *,
    higher_is_better: Callable[[str], bool],
    detector: Detector = DEFAULT,
    window: int | None = None,
    suspects: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(change points, series): the change points of every (cell, metric) series of
    ``hist`` (a ``history.series.frame.history`` frame), over its last ``window`` points (None:
    all), and one row per series analysed (cell_id, metric, machine, points, and
    ``times``: its points' logical dates as UTC datetime64 values, oldest first).

    A change point row carries what the store keeps (``results.schema.change_points``)
    plus ``near`` and ``moved`` (the logical dates of the points around it: where a
    stored change may have been put before).

    ``suspects``: also report a series whose newest point alone lies
    ``confirm.SUSPECT_SIGMAS`` worse than the nights before it (``newest_point_suspect``)
    and where the detector reports nothing in the newest points: a one-point change at the
    end, for the re-test to confirm or reject the same night (``history.retests.followup``).

    Series are cut from one sorted frame as NumPy slices: a pandas group per series costs
    ~2 ms, which is seconds for a 1,024-cell run's 3,072 series (bench/bench_history.py).
    """
    import numpy as np
    import pandas as pd

    cols = ["cell_id", "metric", "time", "value", "run_id", "runtime_version", "machine"]
    cols += ["backend", "benchmark"]
    h = hist[[c for c in cols if c in hist.columns]]
    h = h[np.isfinite(h["value"].to_numpy(dtype="float64"))]
    h = h.sort_values([*SERIES, "time"], kind="mergesort")
    if window is not None and len(h):
        h = h[h.groupby(list(SERIES), sort=False).cumcount(ascending=False) < window]
    n = len(h)
    col = {
        c: h[c].to_numpy(dtype=object) if c in h.columns else np.full(n, None, dtype=object)
        for c in cols
    }
    values = h["value"].to_numpy(dtype="float64")
    times = (
        pd.to_datetime(h["time"], utc=True).dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    )
    cell, metric = col["cell_id"], col["metric"]
    new = np.ones(n, dtype=bool)
    if n > 1:
        new[1:] = (cell[1:] != cell[:-1]) | (metric[1:] != metric[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    cut = [values[a:b] for a, b in zip(starts, ends, strict=True)]
    found_all = detect_many(cut, detector)
    weak_all = detect_many(cut, candidates_detector(detector)) if suspects else [[]] * len(cut)
    series_rows, rows = [], []
    for a, b, found, weak in zip(starts, ends, found_all, weak_all, strict=True):
        machines = [m for m in col["machine"][a:b] if m is not None and m == m]
        series_rows.append(
            {
                "cell_id": cell[a],
                "metric": metric[a],
                "machine": machines[-1] if machines else None,
                "points": int(b - a),
                "times": times[a:b],
            }
        )
        found = list(found)
        hib = higher_is_better(metric[a])
        # Every level shift either detector places, regressions and improvements alike.
        shifts = [cp.index for cp in (*found, *weak)]
        if suspects:
            found.extend(_weak_regressions(weak, found, hib))
        if suspects and not any(cp.index >= b - a - SUSPECT_TAIL for cp in found):
            # The newest point is judged against the level since the last change either
            # detector places (a candidate too: it goes to a re-test of its own). Against
            # nights on both sides of an earlier step, a night at the new level, or a build
            # a little slow by itself there, stands out by that step, not by a change of
            # its own: one cause would get two re-tests and two pages.
            since = max(shifts, default=0)
            found.extend(
                replace(cp, index=cp.index + since) for cp in _suspect(values[a + since : b], hib)
            )
        for cp in found:
            at = a + cp.index
            rising = cp.after.median > cp.before.median
            better = rising == hib
            rows.append(
                {
                    "cell_id": cell[a],
                    "metric": metric[a],
                    "benchmark": col["benchmark"][at] or None,
                    "machine": col["machine"][at],
                    "backend": col["backend"][at],
                    "run_id": col["run_id"][at],
                    "logical_date": _aware64(times[at]),
                    "runtime_version": col["runtime_version"][at],
                    "prev_run_id": col["run_id"][at - 1],
                    "prev_logical_date": _aware64(times[at - 1]),
                    "prev_runtime_version": col["runtime_version"][at - 1],
                    "position": cp.index,
                    "n_before": cp.before.n,
                    "n_after": cp.after.n,
                    "mean_before": cp.before.mean,
                    "mean_after": cp.after.mean,
                    "median_before": cp.before.median,
                    "median_after": cp.after.median,
                    "std_before": cp.before.std,
                    "std_after": cp.after.std,
                    "change": cp.change,
                    "effect": cp.effect,
                    "p_value": cp.p_value,
                    "direction": "improvement" if better else "regression",
                    "near": [_aware64(t) for t in times[max(a, at - 1) : min(b, at + 2)]],
                    "moved": [
                        _aware64(t) for t in times[max(a, at - MOVE) : min(b, at + MOVE + 1)]
                    ],
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(series_rows)


# The detector's report of a change in this many newest points makes the newest-point
# suspect rule redundant for that series.
SUSPECT_TAIL = 3


def candidates_detector(detector: Detector) -> Detector:
    """The permissive detector whose regressions are re-tested before anyone is paged.

    The reporting detector must be strict (its penalty of 6 x log n finds a 3-sigma step
    in 8 + 7 nightlies 63 % of the time) because every change it reports is a page. With
    a re-test on one machine costing a session, not a page, a weaker candidate is worth
    re-testing: at a penalty of 2 x log n and p <= 0.01 the same step is found 91 % of the
    time on one night's look, at about 0.09 candidates per 15-point noise series
    (bench/bench_confirm.py prints what reaches a page)."""
    return replace(detector, penalty=min(detector.penalty, 2.0), max_p=min(detector.max_p, 0.01))


def _weak_regressions(
    weak: list[ChangePoint], found: list[ChangePoint], higher_is_better: bool
) -> list[ChangePoint]:
    """The permissive detector's regressions that the reporting one did not place within a
    point of: candidates for the re-test (history.retests.followup), never a page by themselves."""
    out = []
    for cp in weak:
        worse = (cp.after.median > cp.before.median) != higher_is_better
        if worse and not any(abs(cp.index - f.index) <= 1 for f in found):
            out.append(cp)
    return out


def _suspect(values: Any, higher_is_better: bool) -> list[ChangePoint]:
    """The newest point as a one-point change, when it is a suspect (else nothing)."""
    import numpy as np

    hit = newest_point_suspect(values, higher_is_better=higher_is_better)
    if hit is None:
        return []
    _change, effect = hit
    n = len(values)
    base = np.asarray(values[max(0, n - 1 - SUSPECT_BASELINE) : n - 1], dtype="float64")
    last = float(values[-1])
    before = Segment(
        n=len(base),
        mean=float(base.mean()),
        median=float(np.median(base)),
        std=float(base.std(ddof=1)) if len(base) > 1 else 0.0,
    )
    after = Segment(n=1, mean=last, median=last, std=0.0)
    sign = -1.0 if higher_is_better else 1.0
    return [
        ChangePoint(
            index=n - 1,
            before=before,
            after=after,
            change=last / before.median - 1 if before.median else math.inf,
            effect=sign * effect,
            p_value=0.5 * math.erfc(effect / math.sqrt(2)),
            sigma=abs(last - before.median) / effect if effect else 0.0,
        )
    ]


def _aware64(t: Any) -> datetime:
    """A datetime64 (UTC, naive) as an aware UTC datetime."""
    import pandas as pd

    return pd.Timestamp(t).tz_localize(UTC).to_pydatetime()


@dataclass
class Matched:
    """What to write: changes to insert, stored ones to update (id -> fields), stored
    untriaged ones to delete (retracted)."""

    insert: list[dict[str, Any]] = field(default_factory=list)
    update: dict[int, dict[str, Any]] = field(default_factory=dict)
    retract: list[change_point_records.ChangePoint] = field(default_factory=list)
    # not found, not yet retracted
    missed: list[change_point_records.ChangePoint] = field(default_factory=list)


STORED_FIELDS = (
    "benchmark",
    "machine",
    "backend",
    "run_id",
    "logical_date",
    "runtime_version",
    "prev_run_id",
    "prev_logical_date",
    "prev_runtime_version",
    "position",
    "n_before",
    "n_after",
    "mean_before",
    "mean_after",
    "median_before",
    "median_after",
    "std_before",
    "std_after",
    "change",
    "effect",
    "p_value",
    "direction",
)


def match(
    found: list[FrameRow],
    stored: list[change_point_records.ChangePoint],
    series: pd.DataFrame,
    *,
    retract_after: int | None = None,
) -> Matched:
    """Pair found change points with stored ones (same series and direction, the stored
    one at most MOVE points away: the nearest in time wins; one stored at the very night
    always). Stored changes inside the analysed part
    of a series (after its first ``min_size`` points, where a change could be found) that
    were not re-found are retracted if nobody triaged them; triaged ones stay as they are.
    ``retract_after``: retract only changes stored with fewer points after them than this
    (the gate's window pass: it may take back a report at the end of a series, a blip
    that went away, but not a change the maintenance DAG found over the whole history,
    which a 60-point window cannot always see).
    """
    out = Matched()
    by_series: dict[tuple[str, str], list[change_point_records.ChangePoint]] = {}
    for s in stored:
        by_series.setdefault((s.cell_id, s.metric), []).append(s)
    used: set[int] = set()
    for f in found:
        values = {k: _plain(f[k]) for k in STORED_FIELDS}
        series_rows = by_series.get((f["cell_id"], f["metric"]), [])
        # A stored change at the very night found is that change (or, in the other
        # direction, a different one that night: then this report is dropped, as one night
        # holds one change per series and the unique key says so).
        here = [s for s in series_rows if _same_time(s.logical_date, f["logical_date"])]
        if here:
            s = here[0]
            if s.id not in used and s.direction == f["direction"]:
                used.add(s.id)
                out.update[s.id] = {**keep_placement(s, values), "missing": 0}
            continue
        candidates = [
            s
            for s in by_series.get((f["cell_id"], f["metric"]), [])
            if s.id not in used
            and s.direction == f["direction"]
            and any(_same_time(s.logical_date, t) for t in f["moved"])
            # A suspect the re-runs did not reproduce says nothing about a change the
            # detector finds on another night near it: that one is new, and re-tested.
            and s.confirm_state != "not_reproduced"
        ]
        if candidates:
            best = min(
                candidates,
                key=lambda s: abs(as_utc(s.logical_date) - as_utc(f["logical_date"])),
            )
            used.add(best.id)
            out.update[best.id] = {**keep_placement(best, values), "missing": 0}
        else:
            out.insert.append({"cell_id": f["cell_id"], "metric": f["metric"], **values})
    analysed = (
        {(r.cell_id, r.metric): list(r.times) for r in series.itertuples(index=False)}
        if len(series)
        else {}
    )
    for key, rows in by_series.items():
        times = analysed.get(key)
        if times is None or not len(times):
            continue
        # A change at the window's first points cannot be re-found: it has no "before".
        findable_from = _aware64(times[min(len(times) - 1, DEFAULT.min_size)])
        for s in rows:
            if s.id in used or s.state != "untriaged":
                continue
            if s.confirm_state in CONFIRMED_STATES:
                continue  # the re-runs reproduced it: no later night's silence takes it back
            if retract_after is not None and s.n_after >= retract_after:
                continue
            if as_utc(s.logical_date) >= as_utc(findable_from):
                if s.missing + 1 >= RETRACT_MISSES:
                    out.retract.append(s)
                else:
                    out.missed.append(s)
    return out


@dataclass
class ChangeUpdate:
    """What one pass did to a suite's change points."""

    dag_id: str
    series: int = 0
    found: int = 0
    inserted: int = 0
    updated: int = 0
    retracted: int = 0
    new_groups: list[dict[str, Any]] = field(default_factory=list)
    to_notify: list[ChangeGroup] = field(default_factory=list)  # see groups_to_notify
    open_regressions: set[tuple[str, str]] = field(default_factory=set)  # (cell, metric)

    def line(self) -> str:
        return (
            f"change points of {self.dag_id}: {self.series} series, {self.found} change(s) "
            f"found; {self.inserted} new, {self.updated} updated, {self.retracted} retracted; "
            f"{len(self.new_groups)} new group(s)"
        )


def update_changes(
    store: ResultsStore,
    dag_id: str,
    spec: HistorySpec,
    tracked: dict[str, str],
    *,
    full: bool = False,
    hist: pd.DataFrame | None = None,
) -> ChangeUpdate:
    """Find the change points of ``dag_id``'s series of the ``tracked`` metrics (see
    ``series.tracked_metrics``) and bring the store up to date: matched changes updated, new
    ones inserted and grouped, retracted ones deleted. ``spec`` is the suite's ``history``
    block (spec.suite_parts.HistorySpec); ``hist`` the suite's history (read when not
    given)."""

    with store.changes_lock(dag_id):
        if hist is None:
            since = None if full else _window_start(store, dag_id, spec.window)
            hist = history(store, metric=None, dag_id=dag_id, stats=tracked, since=since)
        return _update(store, dag_id, spec, tracked, full=full, hist=hist)


def _window_start(store: ResultsStore, dag_id: str, window: int) -> datetime | None:
    """The time of the suite's ``window``-th newest run: the gate reads no older history
    (a year of nightly runs is ~6x the rows it needs). None when there are fewer runs."""
    runs = store.get_runs(dag_id, limit=window, which="suite")
    if len(runs) < window:
        return None
    last = runs[-1]
    return last.logical_date or last.started_at or last.created_at


def _update(
    store: ResultsStore,
    dag_id: str,
    spec: HistorySpec,
    tracked: dict[str, str],
    *,
    full: bool,
    hist: pd.DataFrame,
) -> ChangeUpdate:
    hist = hist[hist["metric"].isin(list(tracked))]
    confirming = bool(getattr(getattr(spec, "confirm", None), "enabled", False))
    found, series = find_changes(
        hist,
        higher_is_better=spec.higher_is_better_for,
        detector=detector_for(spec),
        window=None if full else spec.window,
        suspects=confirming and not full,
    )
    up = ChangeUpdate(dag_id, series=len(series), found=len(found))
    found_rows = found.to_dict("records") if len(found) else []
    stored = store.get_change_points(dag_id)
    m = match(found_rows, stored, series, retract_after=None if full else RETRACT_AFTER)
    touched_groups: set[int] = set()
    by_id = {s.id: s for s in stored}
    retests = {c.group_id: c for c in store.get_confirmations(dag_id)}
    for cp_id, values in m.update.items():
        values = {**values, **_leave_stale_retest(by_id[cp_id], values, retests)}
        store.save_change_point(dag_id, id=cp_id, **values)
    up.updated = len(m.update)
    new_ids = []
    for values in m.insert:
        new_ids.append(store.save_change_point(dag_id, **values))
    up.inserted = len(new_ids)
    # A change whose re-test is still running is not taken back under it: the session's
    # verdict is about to say whether it is real, and it records that on the change.
    retesting = {gid for gid, c in retests.items() if c.state in ACTIVE_STATES}
    held = [s for s in m.retract if s.group_id in retesting]
    m.retract = [s for s in m.retract if s.group_id not in retesting]
    for s in [*m.missed, *held]:
        store.save_change_point(dag_id, id=s.id, missing=s.missing + 1)
    if m.retract:
        for s in m.retract:
            log.info(
                "change point retracted: %s %s at %s (no longer found)",
                s.cell_id,
                s.metric,
                s.logical_date,
            )
            if s.group_id is not None:
                touched_groups.add(s.group_id)
        store.delete_change_points([s.id for s in m.retract])
    up.retracted = len(m.retract)

    # Group every change point without a group (the new ones, and any whose group went).
    points = store.get_change_points(dag_id)
    groups = store.get_change_groups(dag_id)
    plan = regroup(points, groups, series, retested_builds(store, dag_id))
    before = {g.id: g for g in groups}
    for gid, fields in plan.updates.items():
        old = before[gid]
        if any(getattr(old, k) != v for k, v in fields.items()):
            store.save_change_group(dag_id, id=gid, **fields)
        touched_groups.discard(gid)
    for new in plan.creates:
        members = new.pop("members")
        gid = store.save_change_group(dag_id, **new)
        for cp_id in members:
            store.save_change_point(dag_id, id=cp_id, group_id=gid)
        up.new_groups.append({**new, "id": gid, "members": members})
    for gid in plan.reopen:
        store.save_change_group(
            dag_id, id=gid, state="untriaged", state_by=None, state_at=None, note=None
        )
        log.info("change group %s reopened: a change it lost was found again", gid)
    for cp_id, gid in plan.assign.items():
        # A change joining a group a person already triaged takes the group's state.
        group = before.get(gid)
        if group is None or gid in plan.reopen or group.state == "untriaged":
            store.save_change_point(dag_id, id=cp_id, group_id=gid)
        else:
            store.save_change_point(
                dag_id,
                id=cp_id,
                group_id=gid,
                state=group.state,
                state_by=group.state_by,
                state_at=group.state_at,
            )
    for gid in touched_groups | set(plan.emptied):
        _settle_empty_group(store, dag_id, gid)
    # A culprit's night that ended after its re-test did: its change moves there now.
    settle(store, dag_id, list(retests.values()))
    up.to_notify = groups_to_notify(store, dag_id, detector_for(spec), confirming=confirming)
    up.open_regressions = {
        (p.cell_id, p.metric)
        for p in store.get_change_points(dag_id, states=OPEN_STATES)
        if p.direction == "regression"
    }
    log.info("%s", up.line())
    return up


def _leave_stale_retest(
    stored: change_point_records.ChangePoint,
    values: dict[str, Any],
    retests: dict[int, change_point_records.Confirmation],
) -> dict[str, Any]:
    """A change the detector now places on a build its group's finished re-test never ran,
    when that re-test did not find it real: it leaves the group and the verdict (fields to
    write), so the grouping gives it a group of its own and the next gate re-tests it there.

    A candidate placed a night early is re-tested on the builds around that night; when the
    nights after it move the change onto the step's real first build, outside that range,
    the old "undecided" or "not reproduced" says nothing about it (one group, one re-test:
    the unique key is per group)."""
    if stored.group_id is None or "runtime_version" not in values:
        return {}
    rt = retests.get(stored.group_id)
    if rt is None or rt.state in (*ACTIVE_STATES, *CONFIRMED_STATES):
        return {}
    covered = {b for b in (rt.builds or [rt.good_build, rt.suspect_build]) if b}
    covered.discard(rt.good_build)
    if values["runtime_version"] in covered:
        return {}
    log.info(
        "change %s moved to %s, outside the builds its re-test %s ran: re-tested anew",
        stored.id,
        values["runtime_version"],
        rt.id,
    )
    return {"group_id": None, "confirm_state": None, "confirm": None}


def retested_builds(store: ResultsStore, dag_id: str) -> dict[int, frozenset[str]]:
    """Group id -> the builds its re-test runs (``grouping.regroup``): the range's builds,
    or its two ends."""
    out: dict[int, frozenset[str]] = {}
    for c in store.get_confirmations(dag_id):
        builds = [b for b in (c.builds or [c.good_build, c.suspect_build]) if b]
        builds = [b for b in builds if b != c.good_build]  # the last good is before it
        out[c.group_id] = frozenset(builds)
    return out


def groups_to_notify(
    store: ResultsStore, dag_id: str, detector: Detector, *, confirming: bool = False
) -> list[ChangeGroup]:
    """The suite's regression groups due a notification: not notified yet and still open.

    With re-tests (``confirming``: the suite's ``history.confirm.enabled``), a build or
    series group is due once its re-test ended in a state that notifies (``followup.NOTIFY_STATES``: confirmed,
    with its culprit, or could not be confirmed, with the reason); a change the re-runs
    did not reproduce never pages. An infrastructure group (one machine kind moved, the
    others on the same builds did not) is no build's change to re-test; it is due, as
    every group without re-tests, when it has several series
    (kind build or infrastructure), or one series with MIN_HISTORY points before the change
    that has held its new level CONFIRM_NIGHTS nights or moved ``tail_guard`` sigmas, so a
    single series' tail report that goes away within a few nights never pages."""
    retests = {c.group_id: c.state for c in store.get_confirmations(dag_id)} if confirming else {}
    due = []
    for g in store.get_change_groups(dag_id, states=OPEN_STATES):
        if g.notified_at is not None or g.direction != "regression":
            continue
        if confirming and g.kind != "infrastructure":
            if retests.get(g.id) in NOTIFY_STATES:
                due.append(g)
            continue
        members = [p for p in store.get_change_points(dag_id, group_id=g.id) if not p.missing]
        if not members:
            continue
        held = max(p.n_after for p in members) >= CONFIRM_NIGHTS
        large = max(abs(p.effect or 0) for p in members) >= detector.tail_guard
        known = max(p.n_before for p in members) >= MIN_HISTORY
        if g.kind != "series" or (known and (held or large)):
            due.append(g)
    return due


def _settle_empty_group(store: ResultsStore, dag_id: str, gid: int) -> None:
    """A group whose change points were all retracted: gone if nobody heard of it, else
    kept and marked invalid (it paged someone; the record says it went away)."""
    if store.get_change_points(dag_id, group_id=gid):
        return
    group = store.get_change_group(gid)
    if group is None:
        return
    if group.notified_at is None and group.state == "untriaged" and not _retested(store, gid):
        store.delete_change_groups([gid])
    elif group.state == "untriaged":
        store.set_triage(
            "group", gid, "invalid", by=RETRACTED_BY, note="every change point was retracted"
        )


def _retested(store: ResultsStore, gid: int) -> bool:
    """Whether group ``gid`` has a re-test: the re-test names it, so it stays (invalid)."""
    return bool(store.get_confirmations(group_id=gid))


def _plain(v: Any) -> Any:
    """numpy/pandas scalars and timestamps as the store's Python types."""
    import pandas as pd

    if v is None:
        return None
    if isinstance(v, pd.Timestamp):
        return None if pd.isna(v) else as_utc(v.to_pydatetime())
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _same_time(a: Any, b: Any) -> bool:
    return as_utc(a) == as_utc(b)
