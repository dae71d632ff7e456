"""One group per cause: the change points of one night, as one alert.

A build that slows 40 cells is one cause, not 40 alerts; a machine kind that runs slow
one night while the other kinds stay flat is a different cause (infrastructure), and
on-call should see which of the two it is before opening a chart. So change points of
one suite, one direction and the same first run (within NEAR points: a small change may be placed a
night or two off) form a group, classified by where its members are:

``infrastructure``  2+ cells, all on one machine kind, at least half of that kind's
                    cells, while another machine kind ran the same night and stayed flat
``build``           any other group of 2+ series: the build under test changed them
``series``          a single series

A change point found a night later than its siblings (a smaller effect needs more points)
joins their group instead of opening another, and takes the group's triage state. The
group is re-classified as it grows; it is notified once (history.change_points.tracking
decides when).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from accelmatrix.contracts.change_point_records import (
    NOT_REPRODUCED_BY,
    PLACED_BY_RETEST,
    ChangeGroup,
    ChangePoint,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["GroupPlan", "as_utc", "classify", "regroup", "summary"]

# Who closes a group whose change points were all taken back
# (history.change_points.tracking).
RETRACTED_BY = "accelmatrix"
# Change points of one direction at most this many points apart (in their series) are
# taken as one night's cause.
NEAR = 3


@dataclass
class GroupPlan:
    creates: list[dict[str, Any]] = field(default_factory=list)  # fields + "members"
    updates: dict[int, dict[str, Any]] = field(default_factory=dict)  # group id -> fields
    assign: dict[int, int] = field(default_factory=dict)  # change point id -> group id
    emptied: list[int] = field(default_factory=list)  # groups left without a member
    # Groups accelmatrix itself closed (every member taken back) that a change came back to:
    # open again, untriaged, instead of passing their "invalid" on to it.
    reopen: set[int] = field(default_factory=set)


def regroup(
    points: list[ChangePoint],
    groups: list[ChangeGroup],
    series: pd.DataFrame,
    retested: dict[int, frozenset[str]] | None = None,
) -> GroupPlan:
    """Plan the suite's grouping for this pass, and refresh every group's fields.

    A group somebody heard of (notified) or decided about (triaged) is fixed: its members
    stay, and a new change point near its night joins it. Every other group is rebuilt
    from scratch each pass (its members clustered again with the ungrouped points), so a
    change whose position settled a night or two later still ends up with its siblings;
    a rebuilt cluster keeps the id of the group most of its members came from.

    A group with a re-test is fixed too, and a new point joins it only when the re-test
    covers the point's build (``retested``: group id -> the builds its re-test runs). The
    re-test answers for the builds it ran and no other: a step found a night after the
    range a noise candidate's re-test tested is a change of its own, with a re-test of its
    own, not a member that the group's earlier verdict ("undecided") silences.

    ``points`` and ``groups`` are the suite's stored rows; ``series`` is the frame of the
    series analysed (``history.change_points.tracking.find_changes``): their machines and point
    times, which say which cells ran on a night and where a point's neighbours are.
    """
    times = _times_by_series(series)
    retested = retested or {}
    plan = GroupPlan()
    by_id = {g.id: g for g in groups}
    fixed = {
        g.id: []
        for g in groups
        if g.notified_at is not None or g.state != "untriaged" or g.id in retested
    }
    fluid = [gid for gid in by_id if gid not in fixed]
    loose = []
    for p in points:
        if p.group_id in fixed:
            fixed[p.group_id].append(p)
        else:
            loose.append(p)
    loose.sort(key=lambda p: (p.direction, p.logical_date, -abs(p.effect or 0)))
    clusters: list[list[ChangePoint]] = []
    for p in loose:
        near = _near(p, times)
        target = next(
            (
                gid
                for gid, ms in fixed.items()
                if by_id[gid].direction == p.direction
                and by_id[gid].state_by != NOT_REPRODUCED_BY
                and (gid not in retested or p.runtime_version in retested[gid])
                and ({by_id[gid].logical_date, *(m.logical_date for m in ms)} & near)
            ),
            None,
        )
        if target is not None:
            fixed[target].append(p)
            if p.group_id != target:
                plan.assign[p.id] = target
            group = by_id[target]
            if group.state == "invalid" and group.state_by == RETRACTED_BY:
                plan.reopen.add(target)
            continue
        cluster = next(
            (
                ms
                for ms in clusters
                if ms[0].direction == p.direction and {m.logical_date for m in ms} & near
            ),
            None,
        )
        if cluster is not None:
            cluster.append(p)
        else:
            clusters.append([p])
    for gid, ms in fixed.items():
        if ms:
            plan.updates[gid] = _fields(ms, series)
        else:
            plan.emptied.append(gid)
    free = set(fluid)
    for ms in sorted(clusters, key=len, reverse=True):
        votes = Counter(p.group_id for p in ms if p.group_id in free)
        if votes:
            gid = votes.most_common(1)[0][0]
            free.discard(gid)
            plan.updates[gid] = _fields(ms, series)
            for p in ms:
                if p.group_id != gid:
                    plan.assign[p.id] = gid
        else:
            fields = _fields(ms, series)
            fields["members"] = [p.id for p in ms]
            plan.creates.append(fields)
    plan.emptied += sorted(free)
    return plan


def classify(
    members: list[ChangePoint], series: pd.DataFrame, when: datetime
) -> tuple[str, str | None]:
    """(kind, machine) of a group whose members first moved at ``when``."""
    cells = {p.cell_id for p in members}
    machines = {p.machine for p in members}
    if len(cells) >= 2 and len(machines) == 1:
        machine = next(iter(machines))
        ran: dict[Any, set[str]] = {}
        w = _np64(when)
        for r in series.itertuples(index=False) if len(series) else []:
            if (r.times == w).any():
                ran.setdefault(r.machine, set()).add(r.cell_id)
        others_flat = any(m != machine and ran[m] for m in ran)
        share = len(cells) / max(1, len(ran.get(machine, set()) | cells))
        if others_flat and share >= 0.5:
            return "infrastructure", machine
    if len({(p.cell_id, p.metric) for p in members}) >= 2:
        return "build", None
    return "series", None


def summary(kind: str, machine: str | None, members: list[ChangePoint]) -> str:
    """One line naming the cause, its size and where: the first thing on-call reads."""
    head = members[0]
    cells = sorted({p.cell_id for p in members})
    machines = sorted({str(p.machine) for p in members})
    changes = [p.change for p in members if p.change is not None]
    med = statistics.median(changes) if changes else float("nan")
    metrics = ", ".join(sorted({p.metric for p in members}))
    what = f"{metrics} {med:+.1%} (median of {len(members)} series, {len(cells)} cell(s))"
    date = head.logical_date.strftime("%Y-%m-%d")
    build = head.runtime_version or date
    prev = head.prev_runtime_version or "the run before"
    word = head.direction
    if kind == "infrastructure":
        return (
            f"{word} on machine kind {machine} from {date}: {what}; "
            "the other machine kinds stayed flat"
        )
    placed = ""
    if head.placed_by == PLACED_BY_RETEST:
        detected = head.detected_runtime_version or "another night"
        placed = f"; first bad build proved by the re-test (the detector placed it at {detected})"
    if kind == "build":
        return (
            f"{word} from build {build} (after {prev}): {what} on {len(machines)} "
            f"machine kind(s){placed}"
        )
    return f"{word} in {head.cell_id} from build {build} (after {prev}): {what}{placed}"


def _fields(members: list[ChangePoint], series: pd.DataFrame) -> dict[str, Any]:
    """The stored fields of a group with these members. Its night is the one most of them
    moved on (the earliest of a tie): a small change may be placed a night off."""
    nights = Counter(p.logical_date for p in members)
    when = min(d for d, k in nights.items() if k == max(nights.values()))
    ordered = sorted(
        members,
        key=lambda p: (p.logical_date != when, p.logical_date, -abs(p.effect or 0)),
    )
    first = ordered[0]
    kind, machine = classify(members, series, when)
    changes = [p.change for p in members if p.change is not None]
    return {
        "kind": kind,
        "direction": first.direction,
        "run_id": first.run_id,
        "logical_date": when,
        "runtime_version": first.runtime_version,
        "prev_logical_date": first.prev_logical_date,
        "prev_runtime_version": first.prev_runtime_version,
        "machine": machine,
        "summary": summary(kind, machine, ordered),
        "series_count": len(members),
        "cells": sorted({p.cell_id for p in members}),
        "machines": sorted({str(p.machine) for p in members if p.machine is not None}),
        "metrics": sorted({p.metric for p in members}),
        "change_median": statistics.median(changes) if changes else None,
        "change_min": min(changes) if changes else None,
        "change_max": max(changes) if changes else None,
    }


def _times_by_series(series: pd.DataFrame) -> dict[tuple[str, str], Any]:
    """(cell, metric) -> the series' times (UTC datetime64, oldest first)."""
    if not len(series):
        return {}
    return {(r.cell_id, r.metric): r.times for r in series.itertuples()}


def _near(p: ChangePoint, times: dict[tuple[str, str], Any]) -> set[datetime]:
    """The point's logical date and those of the NEAR points either side in its series:
    a small change's position is uncertain by a night or two."""
    import numpy as np

    when = p.logical_date
    ts = times.get((p.cell_id, p.metric))
    if ts is None:
        return {when}
    i = int(np.searchsorted(ts, _np64(when)))
    if i >= len(ts) or ts[i] != _np64(when):
        return {when}
    return {as_utc(t) for t in ts[max(0, i - NEAR) : i + NEAR + 1]}


def _np64(t: Any) -> Any:
    import numpy as np

    return np.datetime64(as_utc(t).replace(tzinfo=None), "ns")


def as_utc(t: datetime | np.datetime64 | str) -> datetime:
    """An aware UTC datetime from a datetime or pandas Timestamp (naive taken as UTC: the
    history frame's times are UTC; a numpy datetime64 or an ISO string too)."""
    import pandas as pd

    ts = pd.Timestamp(t)
    if ts.tzinfo is None:
        ts = ts.tz_localize(UTC)
    return ts.tz_convert(UTC).to_pydatetime()
