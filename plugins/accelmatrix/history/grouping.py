"""One group per cause: the change points of one night, as one alert.

A build that slows 40 cells is one cause, not 40 alerts; a machine kind that runs slow
one night while the other kinds stay flat is a different cause (infrastructure), and
on-call should see which of the two it is before opening a chart. So change points of
one suite, one direction and the same first run (within one point: a small change may be
placed a night off) form a group, classified by where its members are:

``infrastructure``  2+ cells, all on one machine kind, at least half of that kind's
                    cells, while another machine kind ran the same night and stayed flat
``build``           any other group of 2+ series: the build under test changed them
``series``          a single series

A change point found a night later than its siblings (a smaller effect needs more points)
joins their group instead of opening another, and takes the group's triage state. The
group is re-classified as it grows; it is notified once, when it is created.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GroupPlan", "as_utc", "classify", "regroup", "summary"]


@dataclass
class GroupPlan:
    creates: list[dict[str, Any]] = field(default_factory=list)  # fields + "members"
    updates: dict[int, dict[str, Any]] = field(default_factory=dict)  # group id -> fields
    assign: dict[int, int] = field(default_factory=dict)  # change point id -> group id
    emptied: list[int] = field(default_factory=list)  # groups left without a member


def regroup(
    points: list[dict[str, Any]], groups: list[dict[str, Any]], series: pd.DataFrame
) -> GroupPlan:
    """Plan the grouping of every ungrouped change point of one suite, and refresh every
    group's fields from its members (they may have moved by a point since).

    ``points`` and ``groups`` are the suite's stored rows; ``series`` is the frame of the
    series analysed (``history.changes.find_changes``): their machines and point times,
    which say which cells ran on a night and where a point's neighbours are.
    """
    times = _times_by_series(series)
    plan = GroupPlan()
    members: dict[int, list[dict[str, Any]]] = {g["id"]: [] for g in groups}
    for p in points:
        if p["group_id"] is not None and p["group_id"] in members:
            members[p["group_id"]].append(p)
    loose = [p for p in points if p["group_id"] is None or p["group_id"] not in members]
    loose.sort(key=lambda p: (p["direction"], p["logical_date"], -abs(p["effect"] or 0)))
    by_id = {g["id"]: g for g in groups}
    fresh: list[list[dict[str, Any]]] = []
    for p in loose:
        near = _near(p, times)
        target = next(
            (
                gid
                for gid, ms in members.items()
                if by_id[gid]["direction"] == p["direction"]
                and ({by_id[gid]["logical_date"], *(m["logical_date"] for m in ms)} & near)
            ),
            None,
        )
        if target is not None:
            members[target].append(p)
            plan.assign[p["id"]] = target
            continue
        cluster = next(
            (
                ms
                for ms in fresh
                if ms[0]["direction"] == p["direction"] and {m["logical_date"] for m in ms} & near
            ),
            None,
        )
        if cluster is not None:
            cluster.append(p)
        else:
            fresh.append([p])
    for gid, ms in members.items():
        if ms:
            plan.updates[gid] = _fields(ms, series)
    for ms in fresh:
        fields = _fields(ms, series)
        fields["members"] = [p["id"] for p in ms]
        plan.creates.append(fields)
    plan.emptied = [gid for gid, ms in members.items() if not ms]
    return plan


def classify(
    members: list[dict[str, Any]], series: pd.DataFrame, when: datetime
) -> tuple[str, str | None]:
    """(kind, machine) of a group whose members first moved at ``when``."""
    cells = {p["cell_id"] for p in members}
    machines = {p["machine"] for p in members}
    if len(cells) >= 2 and len(machines) == 1:
        machine = next(iter(machines))
        ran: dict[Any, set[str]] = {}
        for r in series.itertuples(index=False) if len(series) else []:
            if any(as_utc(t) == when for t in r.times):
                ran.setdefault(r.machine, set()).add(r.cell_id)
        others_flat = any(m != machine and ran[m] for m in ran)
        share = len(cells) / max(1, len(ran.get(machine, set()) | cells))
        if others_flat and share >= 0.5:
            return "infrastructure", machine
    if len({(p["cell_id"], p["metric"]) for p in members}) >= 2:
        return "build", None
    return "series", None


def summary(kind: str, machine: str | None, members: list[dict[str, Any]]) -> str:
    """One line naming the cause, its size and where: the first thing on-call reads."""
    head = members[0]
    cells = sorted({p["cell_id"] for p in members})
    machines = sorted({str(p["machine"]) for p in members})
    changes = [p["change"] for p in members if p["change"] is not None]
    med = statistics.median(changes) if changes else float("nan")
    metrics = ", ".join(sorted({p["metric"] for p in members}))
    what = f"{metrics} {med:+.1%} (median of {len(members)} series, {len(cells)} cell(s))"
    date = head["logical_date"].strftime("%Y-%m-%d")
    build = head.get("runtime_version") or date
    prev = head.get("prev_runtime_version") or "the run before"
    word = head["direction"]
    if kind == "infrastructure":
        return (
            f"{word} on machine kind {machine} from {date}: {what}; "
            "the other machine kinds stayed flat"
        )
    if kind == "build":
        return (
            f"{word} from build {build} (after {prev}): {what} on {len(machines)} machine kind(s)"
        )
    return f"{word} in {head['cell_id']} from build {build} (after {prev}): {what}"


def _fields(members: list[dict[str, Any]], series: pd.DataFrame) -> dict[str, Any]:
    """The stored fields of a group with these members. Its night is the one most of them
    moved on (the earliest of a tie): a small change may be placed a night off."""
    nights = Counter(p["logical_date"] for p in members)
    when = min(d for d, k in nights.items() if k == max(nights.values()))
    ordered = sorted(
        members,
        key=lambda p: (p["logical_date"] != when, p["logical_date"], -abs(p["effect"] or 0)),
    )
    first = ordered[0]
    kind, machine = classify(members, series, when)
    changes = [p["change"] for p in members if p["change"] is not None]
    return {
        "kind": kind,
        "direction": first["direction"],
        "run_id": first["run_id"],
        "logical_date": when,
        "runtime_version": first.get("runtime_version"),
        "prev_logical_date": first.get("prev_logical_date"),
        "prev_runtime_version": first.get("prev_runtime_version"),
        "machine": machine,
        "summary": summary(kind, machine, ordered),
        "series_count": len(members),
        "cells": sorted({p["cell_id"] for p in members}),
        "machines": sorted({str(p["machine"]) for p in members if p["machine"] is not None}),
        "metrics": sorted({p["metric"] for p in members}),
        "change_median": statistics.median(changes) if changes else None,
        "change_min": min(changes) if changes else None,
        "change_max": max(changes) if changes else None,
    }


def _times_by_series(series: pd.DataFrame) -> dict[tuple[str, str], list[datetime]]:
    if not len(series):
        return {}
    return {(r.cell_id, r.metric): [_py(t) for t in r.times] for r in series.itertuples()}


def _near(p: dict[str, Any], times: dict[tuple[str, str], list[datetime]]) -> set[datetime]:
    """The point's logical date and those of its neighbours in its series."""
    when = p["logical_date"]
    ts = times.get((p["cell_id"], p["metric"]), [])
    if when not in ts:
        return {when}
    i = ts.index(when)
    return set(ts[max(0, i - 1) : i + 2])


def _py(t: Any) -> datetime:
    return as_utc(t)


def as_utc(t: Any) -> datetime:
    """An aware UTC datetime from a datetime or pandas Timestamp (naive taken as UTC: the
    history frame's times are UTC)."""
    import pandas as pd

    ts = pd.Timestamp(t)
    if ts.tzinfo is None:
        ts = ts.tz_localize(UTC)
    return ts.tz_convert(UTC).to_pydatetime()
