"""One change, one first bad build: a re-test that proved the first bad build moves the
change to it.

The detector places a step on the night its statistics split best; with a small step among
builds that differ by themselves, that is often a night late or early. The re-test then
runs the builds around it on one machine and proves which build is the first at the new
level (``history.retests.followup``: a bisect, or a confirm of two adjacent builds). Left alone, the
change, its group's summary, the alert, the history page and the CLI would keep naming the
detector's night next to the re-test's culprit: two first bad builds for one change.

``place`` settles it: every re-tested change point of the group moves to the first nightly
run at or after the culprit (the run whose build is the culprit, else the run after the
last good build's) and names the re-test's builds (the culprit and the last good build,
also when the culprit ran no night of its own), and says so (``placed_by`` "retest"); the
detector's own placement stays beside it (``detected_*``) for audit. The next passes keep the re-test's placement
(``placement_fields``: the detector may re-find the change a night off; its statistics are
refreshed, its night is not). The group's fields and summary follow its members.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from accelmatrix.contracts.change_point_records import (
    CONFIRMED,
    FOUND,
    PLACED_BY_RETEST,
    ChangePoint,
    Confirmation,
)
from accelmatrix.contracts.run_records import RunRecord
from accelmatrix.history.series.grouping import as_utc, summary

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

log = logging.getLogger(__name__)

__all__ = [
    "PLACED_BY_RETEST",
    "PLACEMENT_FIELDS",
    "PLACING_STATES",
    "keep_placement",
    "night_of",
    "nights",
    "place",
    "settle",
]

# The re-test states whose culprit is proved.
PLACING_STATES = (FOUND, CONFIRMED)
# The fields that say where a change is: the re-test's, once it placed it.
PLACEMENT_FIELDS = (
    "run_id",
    "logical_date",
    "runtime_version",
    "prev_run_id",
    "prev_logical_date",
    "prev_runtime_version",
)


def night_of(
    nights: list[RunRecord], culprit: str, last_good: str | None
) -> tuple[RunRecord, RunRecord | None] | None:
    """(the first night at the new level, the night before it) for a re-test's culprit:
    the night that ran the culprit build, else the night after the one that ran the last
    good build (a build between two nights: the first night that holds it). ``nights``:
    the suite's series runs, oldest first. None when neither build ran a night."""
    builds = [r.runtime_version for r in nights]
    if culprit in builds:
        i = builds.index(culprit)
    elif (
        last_good is not None and last_good in builds and builds.index(last_good) + 1 < len(nights)
    ):
        i = builds.index(last_good) + 1
    else:
        return None
    return nights[i], (nights[i - 1] if i > 0 else None)


def place(
    store: ResultsStore, row: Confirmation, runs: list[RunRecord], *, quiet: bool = False
) -> list[ChangePoint]:
    """Move the change points of re-test ``row`` (finished with a culprit) to the culprit's
    night among ``runs`` (the series' runs, oldest first), and refresh its group's fields
    and summary; the points moved (none when they are there already). ``quiet``: say
    nothing when the culprit ran no night yet."""
    if not row.culprit:
        return []
    at = night_of(runs, row.culprit, row.last_good)
    if at is None:
        if quiet:
            return []
        log.info(
            "re-test %s: build %s ran no night of %s; its changes stay where the detector "
            "placed them",
            row.id,
            row.culprit,
            row.dag_id,
        )
        return []
    first, before = at
    ids = {int(t["change_id"]) for t in row.targets or []}
    points = [p for p in store.get_change_points(row.dag_id, group_id=row.group_id)]
    points += [p for p in store.get_change_points(ids=sorted(ids)) if p.group_id != row.group_id]
    moved: list[ChangePoint] = []
    taken = {
        (p.cell_id, p.metric, as_utc(p.logical_date)) for p in store.get_change_points(row.dag_id)
    }
    for p in points:
        if p.direction != "regression":
            continue
        if (
            p.placed_by == PLACED_BY_RETEST
            and p.run_id == first.run_id
            and p.runtime_version == row.culprit
        ):
            continue  # placed there already
        fields: dict[str, object] = {"placed_by": PLACED_BY_RETEST}
        if p.placed_by != PLACED_BY_RETEST:
            fields |= {
                "detected_run_id": p.run_id,
                "detected_logical_date": p.logical_date,
                "detected_runtime_version": p.runtime_version,
            }
        # The builds are the re-test's: the first bad one and the last good one, also
        # when the culprit ran no night of its own (a build between two runs, or a night
        # that never came): the first run that holds it is where the change shows.
        fields |= {
            "runtime_version": row.culprit,
            "prev_runtime_version": row.last_good or (before.runtime_version if before else None),
        }
        if p.run_id != first.run_id:
            if (p.cell_id, p.metric, as_utc(_when(first))) in taken:
                # The series holds another change on the culprit's night: the same cause,
                # already there. This one keeps its night; the re-test names the build.
                log.info("change %s: its series already has a change on %s", p.id, first.run_id)
                continue
            fields |= {
                "run_id": first.run_id,
                "logical_date": _when(first),
                "prev_run_id": before.run_id if before else None,
                "prev_logical_date": _when(before) if before else None,
            }
            taken.discard((p.cell_id, p.metric, as_utc(p.logical_date)))
            taken.add((p.cell_id, p.metric, as_utc(_when(first))))
        store.save_change_point(row.dag_id, id=p.id, **fields)
        moved.append(p)
    if moved:
        _refresh_group(store, row)
        log.info(
            "re-test %s placed %d change(s) of group %s at build %s (%s)",
            row.id,
            len(moved),
            row.group_id,
            row.culprit,
            first.run_id,
        )
    return moved


def nights(store: ResultsStore, dag_id: str) -> list[RunRecord]:
    """The suite's runs that are points of its series, oldest first."""
    return list(reversed(store.get_runs(dag_id, which="suite")))


def settle(store: ResultsStore, dag_id: str, retests: list[Confirmation]) -> int:
    """Place again the changes of every re-test that proved a culprit (``place``), against
    the nights there are now: in a backfill the culprit's own night may end after the
    re-test did (two runs at a time, either finishing first), and the change then sat on
    the night after the last good build's until it came. Idempotent; the points moved."""
    done = [c for c in retests if c.culprit and c.state in PLACING_STATES]
    if not done:
        return 0
    runs = nights(store, dag_id)
    return sum(len(place(store, c, runs, quiet=True)) for c in done)


def keep_placement(stored: ChangePoint, found: dict[str, object]) -> dict[str, object]:
    """The fields a pass writes on ``stored`` when the detector re-finds it as ``found``
    (a STORED_FIELDS dict): all of them, but for a change its re-test placed, whose night
    stays and whose ``detected_*`` record the detector's latest placement."""
    if stored.placed_by != PLACED_BY_RETEST:
        return found
    kept = {k: v for k, v in found.items() if k not in (*PLACEMENT_FIELDS, "position")}
    kept["detected_run_id"] = found.get("run_id")
    kept["detected_logical_date"] = found.get("logical_date")
    kept["detected_runtime_version"] = found.get("runtime_version")
    return kept


def _refresh_group(store: ResultsStore, row: Confirmation) -> None:
    """The group's night, builds and summary from its members, as ``grouping`` words it."""
    group = store.get_change_group(row.group_id)
    if group is None:
        return
    members = [p for p in store.get_change_points(row.dag_id, group_id=row.group_id)]
    placed = [p for p in members if p.placed_by == PLACED_BY_RETEST]
    if not placed:
        return
    head = min(placed, key=lambda p: (p.logical_date, -abs(p.effect or 0)))
    ordered = [head, *[p for p in members if p.id != head.id]]
    store.save_change_group(
        row.dag_id,
        id=group.id,
        run_id=head.run_id,
        logical_date=head.logical_date,
        runtime_version=head.runtime_version,
        prev_logical_date=head.prev_logical_date,
        prev_runtime_version=head.prev_runtime_version,
        summary=summary(group.kind, group.machine, ordered),
    )


def _when(run: RunRecord) -> datetime:
    """A run's time in the series (its logical date; a manual run's start)."""
    when = run.logical_date or run.started_at or run.created_at
    assert when is not None, f"run {run.run_id} has no time"
    return when
