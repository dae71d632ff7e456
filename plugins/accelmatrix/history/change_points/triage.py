"""Triage of change points: a person says what a change is, and the history acts on it.

The page and the CLI both come here, so a decision has one effect wherever it is made:
the state is stored with who and when (``ResultsStore.set_triage``); a group's state
applies to every change point in it; accepting a change makes its new level the
baseline, so the bounds of its benchmark are re-centered onto it at once
(``history.bounds.bounds_job.recenter_accepted``) instead of at the next maintenance run: stored
in the results store with who accepted it, when, the change and the note, never written
to the bounds file (include/ comes from git).
Permission checks are the caller's: the page asks Airflow's auth manager for edit access
to the suite's DAG; the CLI runs with the operator's own database access, like
``airflow`` itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelmatrix.contracts.change_point_records import (
    OPEN_STATES,
    TRIAGE_STATES,
    ChangeGroup,
    ChangePoint,
)
from accelmatrix.history.bounds.bounds_job import recenter_accepted

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

log = logging.getLogger(__name__)

__all__ = ["OPEN_STATES", "TRIAGE_STATES", "TriageResult", "apply_triage"]


@dataclass
class TriageResult:
    what: str  # group | change
    id: int
    dag_id: str
    state: str
    by: str
    row: ChangeGroup | ChangePoint
    bounds: list[str] = field(default_factory=list)  # lines: what re-centering did

    def line(self) -> str:
        out = f"change {self.what} {self.id} of {self.dag_id}: {self.state} (by {self.by})"
        return out + "".join(f"\n  bounds {b}" for b in self.bounds)


def apply_triage(
    store: ResultsStore,
    what: str,
    id: int,
    state: str,
    *,
    by: str,
    note: str | None = None,
    dag_id: str | None = None,
) -> TriageResult:
    """Set the state of change group / change point ``id``; ValueError on a bad state or a
    row of another suite than ``dag_id`` (when given), KeyError when there is no such row."""
    if state not in TRIAGE_STATES:
        raise ValueError(f"state {state!r} is not one of: {', '.join(TRIAGE_STATES)}")
    rows = (
        store.get_change_groups(ids=[id]) if what == "group" else store.get_change_points(ids=[id])
    )
    if not rows:
        raise KeyError(f"no change {what} with id {id}")
    if dag_id is not None and rows[0].dag_id != dag_id:
        raise KeyError(f"change {what} {id} does not belong to {dag_id}")
    row = store.set_triage(what, id, state, by=by, note=note)
    result = TriageResult(what, id, row.dag_id, state, by, row)
    log.info("%s", result.line())
    if state == "accepted":
        points = store.get_change_points(group_id=id) if what == "group" else [row]  # type: ignore[list-item]
        change = {"group_id": id} if what == "group" else {"change_id": id}
        result.bounds = recenter_accepted(store, points, by=by, change=change, note=note)
    return result
