"""The records of perf changes as the results store returns them: a change point of one
series, the group (cause) it belongs to, and the re-test of a group.

Frozen ``msgspec.Struct``s whose fields are the columns of ``change_points``,
``change_groups`` and ``confirmations`` (accelmatrix.results.schema; a test keeps them in
step), built from rows in ``accelmatrix.results.row_records``. msgspec rather than
dataclasses for the reason given in ``run_records``: many are built per page and pass, and a
Struct is cheaper to build. Frozen: a change goes back through the store
(``save_change_point``, ``set_triage``), never by editing a record.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from accelmatrix.contracts.json_types import JsonObject, JsonValue

__all__ = [
    "CONFIRMED",
    "FOUND",
    "NOT_REPRODUCED",
    "NOT_REPRODUCED_BY",
    "OPEN_STATES",
    "PLACED_BY_RETEST",
    "TRIAGE_STATES",
    "ChangeGroup",
    "ChangePoint",
    "Confirmation",
]

# Perfherder's alert states, cut to the ones a perf history of one team needs:
# untriaged        nobody looked yet (new change points start here)
# acknowledged     someone is on it; the old level is still the baseline
# accepted         the new level is the baseline (bounds re-center onto it)
# invalid          noise: not a change (bounds ignore it)
# infrastructure   a machine misbehaved, not the code
# fixed            the series returned to its old level
TRIAGE_STATES = ("untriaged", "acknowledged", "accepted", "invalid", "infrastructure", "fixed")
# A regression in one of these still needs a person: listed first, and bounds never
# re-center across it.
OPEN_STATES = ("untriaged", "acknowledged")


# ``ChangePoint.placed_by`` of a change moved to the first bad build its re-test proved.
PLACED_BY_RETEST = "retest"
# ``Confirmation.state`` of a finished re-test that later steps read (the culprit report,
# placement): the suspect change reproduced on one machine (history.retests.confirm), it did
# not, or a bisect found the first bad build (history.retests.bisect).
CONFIRMED = "confirmed"
NOT_REPRODUCED = "not_reproduced"
FOUND = "found"
# ``ChangeGroup.state_by`` of a group whose change the re-runs did not reproduce
# (history.retests.followup). Such a group says nothing about a later change near its
# night: a new change never joins it (history.series.grouping).
NOT_REPRODUCED_BY = "accelmatrix-confirm"


class ChangePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where one metric of one cell moved to a new level (``change_points``).

    ``run_id``/``logical_date``/``runtime_version``: the first run at the new level (the
    suspect build); ``prev_*``: the last run before it (the last good build). ``change`` is
    ``mean_after / mean_before - 1``; ``effect`` the shift in the series' noise sigmas.
    ``missing``: passes in a row that analysed the series without finding it again.
    ``confirm_state``/``confirm``: its re-test's outcome and decision. ``placed_by``
    "retest": the re-test proved the first bad build and moved the change to it; the
    detector's own placement is ``detected_*``."""

    id: int
    dag_id: str
    cell_id: str
    metric: str
    benchmark: str | None = None
    machine: str | None = None
    backend: str | None = None
    run_id: str
    logical_date: datetime
    runtime_version: str | None = None
    prev_run_id: str | None = None
    prev_logical_date: datetime | None = None
    prev_runtime_version: str | None = None
    position: int = 0
    n_before: int = 0
    n_after: int = 0
    mean_before: float | None = None
    mean_after: float | None = None
    median_before: float | None = None
    median_after: float | None = None
    std_before: float | None = None
    std_after: float | None = None
    change: float | None = None
    effect: float | None = None
    p_value: float | None = None
    direction: str = "regression"  # regression | improvement
    group_id: int | None = None
    state: str = "untriaged"  # one of TRIAGE_STATES
    state_by: str | None = None
    state_at: datetime | None = None
    note: str | None = None
    missing: int = 0
    confirm_state: str | None = None
    confirm: JsonObject | None = None
    placed_by: str | None = None  # None: the detector; "retest": its re-test's first bad build
    detected_run_id: str | None = None  # the detector's placement, kept when a re-test moved it
    detected_logical_date: datetime | None = None
    detected_runtime_version: str | None = None
    detected_at: datetime | None = None
    updated_at: datetime | None = None


class ChangeGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One cause behind the change points of one night (``change_groups``): a build that
    moved many cells (``kind`` "build"), a machine kind ("infrastructure"), or one series
    ("series"). Its triage applies to every member."""

    id: int
    dag_id: str
    kind: str = "series"  # build | infrastructure | series
    direction: str = "regression"
    run_id: str | None = None
    logical_date: datetime
    runtime_version: str | None = None
    prev_logical_date: datetime | None = None
    prev_runtime_version: str | None = None
    machine: str | None = None
    summary: str = ""
    series_count: int = 0
    cells: list[str] = msgspec.field(default_factory=list)
    machines: list[str] = msgspec.field(default_factory=list)
    metrics: list[str] = msgspec.field(default_factory=list)
    change_median: float | None = None
    change_min: float | None = None
    change_max: float | None = None
    state: str = "untriaged"
    state_by: str | None = None
    state_at: datetime | None = None
    note: str | None = None
    notified_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Confirmation(msgspec.Struct, frozen=True, kw_only=True):
    """The re-test of one suspect group (``confirmations``): confirm rounds of the last good
    and the suspect build, then a bisect of the builds between.

    ``state``: confirming | bisecting, or final: confirmed | not_reproduced | undecided |
    failed | refused | found | ambiguous. ``targets``: what is re-tested (change_id, cell_id,
    metric, statistic, higher_is_better, claimed); ``decision``: the verdict per target."""

    id: int
    dag_id: str
    group_id: int
    state: str
    targets: list[JsonObject] = msgspec.field(default_factory=list)
    good_build: str | None = None
    suspect_build: str | None = None
    builds: list[str] = msgspec.field(default_factory=list)
    round: int = 0
    run_id: str | None = None
    run_ids: list[str] = msgspec.field(default_factory=list)
    samples: JsonObject = msgspec.field(default_factory=dict)
    decision: dict[str, JsonValue] | None = None
    steps: list[JsonObject] = msgspec.field(default_factory=list)
    culprit: str | None = None
    last_good: str | None = None
    cost: float | None = None
    reason: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
