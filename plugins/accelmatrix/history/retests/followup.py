"""Confirm and bisect: a suspect change re-tested the same night, one machine per suspect
cell, before anybody is paged.

When the gate's change-point pass leaves an open regression group that nobody was told of
yet, ``start_confirmations`` records a re-test of it (``results.schema.confirmations``, one
per group: the unique key is what stops a re-run gate or a restarted scheduler from
starting a second) and triggers a **session**: an ordinary DAG run of the suite whose conf
names the suspect cells and the builds to compare (``spec.followup`` plans it: one cell
per suspect cell, every build set up once on its machine and run interleaved, A B B A).

The builds of a session are the last good build (the reference), the suspect build, and
the builds between them, up to ``MAX_SESSION_BUILDS`` (evenly spaced when the range is
longer). So one session both confirms the change and, in a range that short, names its
first bad build.

At the session's gate, ``advance`` reads each session cell's samples from its log
(``history.retests.session``), pools them with the earlier sessions' pairs, and judges by the
**size** of the change (``history.retests.compare``):

    confirming --suspect build undecided, under max_pairs--> confirming (another session)
    confirming --suspect at the old level--> not_reproduced (closed as invalid: no page)
    confirming --suspect at the new level--> confirmed (two builds) | found (the first
               build at the new level, next to the last at the old) | bisecting
    bisecting --builds between still unknown--> bisecting (another session on them)
    bisecting --> found | ambiguous (a level that does not hold, or undecided at the cap)
    any --the sessions gave no samples--> failed;  --over history.confirm.max_usd--> refused

A confirmed change notifies with its culprit, and so does one whose re-test could not run
(``failed``, ``refused``), with the reason (``NOTIFY_STATES``). ``not_reproduced`` closes
the group as invalid; ``undecided`` at the cap leaves it open on the history page, unpaged.

Sessions never become points of the nightly series: they are recorded with run type
``confirm`` / ``bisect`` (``results.schema.FOLLOWUP_RUN_TYPES``), which history reads skip.
Triggering is the caller's (``Trigger``): the gate passes one that asks Airflow's
execution API, as TriggerDagRunOperator does; run ids are deterministic, so asking twice
starts one run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from accelmatrix import settings
from accelmatrix.contracts.change_point_records import (
    NOT_REPRODUCED_BY,
    OPEN_STATES,
    ChangePoint,
    Confirmation,
)
from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.contracts.run_records import RunRecord
from accelmatrix.history.culprits.culprit_profile import (
    attach,
    attach_attribution,
    refresh_attributions,
)
from accelmatrix.history.retests.bisect import AMBIGUOUS, FOUND, Search, split_line, spread
from accelmatrix.history.retests.builds import BuildsError, builds_between
from accelmatrix.history.retests.compare import NEW_LEVEL, OLD_LEVEL, Comparison, compare, level
from accelmatrix.history.retests.confirm import CONFIRMED, NOT_REPRODUCED, UNDECIDED, Policy
from accelmatrix.history.retests.placement import nights as suite_nights
from accelmatrix.history.retests.placement import place
from accelmatrix.history.retests.session import Sample, pairs_of, read_samples, values_of
from accelmatrix.metrics.source_models import LogRegexSource
from accelmatrix.pricing import estimate_cost as estimate
from accelmatrix.spec.followup_plan import (
    FOLLOWUP_KEY,
    MAX_SESSION_BUILDS,
    Followup,
    expand_followup,
    session_cell_id,
    session_order,
)

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite import Suite
    from accelmatrix.spec.suite_parts import ConfirmSpec

log = logging.getLogger(__name__)

__all__ = [
    "ACTIVE_STATES",
    "CONFIRM_BY",
    "NOTIFY_STATES",
    "Trigger",
    "advance",
    "policy_of",
    "refused_by_plan",
    "run_id_for",
    "start_confirmations",
]

CONFIRMING, BISECTING = "confirming", "bisecting"
FAILED, REFUSED = "failed", "refused"
# A group whose change an earlier re-test already covers: it is answered by that one.
DUPLICATE = "duplicate"
ACTIVE_STATES = (CONFIRMING, BISECTING)
# Undecided at the cap is not among them: the re-runs neither reproduced the change nor ruled
# it out, which is no reason to page anyone (the group stays open on the history page, with
# the re-test's figures). A re-test that could not run is (failed, refused).
NOTIFY_STATES = (CONFIRMED, FAILED, REFUSED, FOUND, AMBIGUOUS)
# Who closes a group whose change the re-runs did not reproduce (triage's "by").
CONFIRM_BY = NOT_REPRODUCED_BY
# Re-tests a gate starts at most per run: a bad night over many cells is one group (a
# build or machine kind), so this bounds the machine time a storm of groups can take.
MAX_NEW_PER_RUN = 4
# How a build's level reads on the page and in the steps.
STEP_VERDICT = {NEW_LEVEL: "bad", OLD_LEVEL: "good"}

# (run_id, conf) -> True if the run was created, False if it already existed. The conf is
# the run's JSON (Airflow's dag_run.conf).
Trigger = Callable[[str, JsonObject], bool]


def policy_of(spec: ConfirmSpec) -> Policy:
    """The test policy of a suite's ``history.confirm`` block."""
    return Policy(pairs=spec.pairs, max_pairs=spec.max_pairs, min_change=spec.min_change)


def run_id_for(kind: str, confirmation_id: int, round_: int) -> str:
    """The session run's id: one per re-test and round, so a second trigger is a no-op."""
    return f"accelmatrix_{kind}__{confirmation_id}_{round_}"


# -- starting ----------------------------------------------------------------------------


def start_confirmations(
    store: ResultsStore,
    suite: Suite,
    dag_id: str,
    params: JsonObject,
    trigger: Trigger,
) -> list[Confirmation]:
    """Start the re-test of every open regression group of ``dag_id`` that has none and was
    not notified (at most MAX_NEW_PER_RUN); the confirmations started (or refused).
    ``params`` are the run's params, passed on to the sessions."""
    spec = suite.history.confirm
    if not spec.enabled:
        return []
    try:
        refresh_attributions(store, dag_id)  # the classes read from too few nights
    except Exception as e:  # noqa: BLE001 (evidence only: never stops a re-test)
        log.warning("re-reading the causes' classes of %s failed: %s", dag_id, e)
    earlier = store.get_confirmations(dag_id)
    have = {c.group_id for c in earlier}
    started: list[Confirmation] = []
    nights: list[RunRecord] | None = None
    for g in store.get_change_groups(dag_id, states=OPEN_STATES):
        if len(started) >= MAX_NEW_PER_RUN:
            break
        if g.direction != "regression" or g.notified_at is not None or g.id in have:
            continue
        if g.kind == "infrastructure":
            # One machine kind moved while the others, on the same builds, did not: re-running
            # builds on that kind would compare two builds on one slow machine. It is not a
            # build's change to confirm; it notifies as infrastructure.
            continue
        points = [
            p
            for p in store.get_change_points(dag_id, group_id=g.id)
            if not p.missing and p.direction == "regression"
        ]
        if not points:
            continue
        points.sort(key=lambda p: -abs(p.effect or 0))
        cells: list[str] = []
        targets = []
        for p in points:
            if p.cell_id not in cells:
                if len(cells) >= spec.max_cells:
                    continue
                cells.append(p.cell_id)
            targets.append(
                {
                    "change_id": p.id,
                    "cell_id": p.cell_id,
                    "metric": p.metric,
                    "statistic": suite.history.track.get(p.metric, "median"),
                    "higher_is_better": suite.history.higher_is_better_for(p.metric),
                    "claimed": abs(p.change or 0.0),
                }
            )
        if (same := _same_cause(store, earlier, points)) is not None:
            # The detector placed again a change a re-test already covers (a suspect night
            # that the detector reports nights later, a night off): one cause, one re-test,
            # one page. The group shows which re-test answers for it.
            row = store.start_confirmation(
                dag_id,
                g.id,
                state=DUPLICATE,
                targets=targets,
                culprit=same.culprit,
                last_good=same.last_good,
                good_build=same.good_build,
                suspect_build=same.suspect_build,
                reason=f"the same change as re-test {same.id} of group {same.group_id} "
                f"({same.state}): no second re-test",
            )
            if row is not None:
                started.append(row)
            continue
        if nights is None:
            nights = suite_nights(store, dag_id)
        good, suspect = _sandwich(nights, points[0])
        row = store.start_confirmation(
            dag_id,
            g.id,
            state=CONFIRMING,
            targets=targets,
            good_build=good,
            suspect_build=suspect,
        )
        if row is None:  # another gate got there first
            continue
        started.append(row)
        if not good or not suspect or good == suspect:
            _finish(
                store,
                row,
                REFUSED,
                reason=(
                    "cannot re-test: the suite names no build for the runs around the change "
                    f"(runtime_version {good!r} -> {suspect!r})"
                ),
            )
            continue
        if unread := [t["metric"] for t in targets if not _per_sample(suite, t["metric"])]:
            _finish(
                store,
                row,
                REFUSED,
                reason=(
                    f"cannot re-test {', '.join(sorted(set(unread)))} on one machine: a re-test "
                    "tells its samples apart in the workload's log, and this metric is not a "
                    "log_regex metric of the suite"
                ),
            )
            continue
        builds, note = _range(suite, dag_id, good, suspect)
        plain = (points[0].prev_runtime_version, points[0].runtime_version)
        if len(builds) > MAX_SESSION_BUILDS and (good, suspect) != plain and all(plain):
            # Runs far apart (a weekly suite): the nights of the margin hold a week of
            # builds each. The builds between the two runs around the change are already
            # all tested; widening would only add sessions.
            good, suspect = plain
            builds, note = _range(suite, dag_id, good, suspect)
            row = replace(row, good_build=good, suspect_build=suspect)
            store.save_confirmation(dag_id, id=row.id, good_build=good, suspect_build=suspect)
        inner = spread(builds[1:-1], MAX_SESSION_BUILDS - 2) if spec.bisect else []
        log.info(
            "re-testing change group %s of %s: %s vs %s (%d builds) on %s%s",
            g.id,
            dag_id,
            good,
            suspect,
            len(builds),
            ", ".join(cells),
            f" ({note})" if note else "",
        )
        _launch(
            store,
            suite,
            row,
            "confirm",
            [good, *inner, suspect],
            cells,
            params,
            trigger,
            builds=builds,
            reason=note,
        )
    return started


# The builds around a change are widened by this many nights before it and after it (only
# nights that exist). A step's position is uncertain by a night or two, and a newest point
# that stands out may be the third night of a step whose first nights stayed inside the
# noise: re-testing only the newest night against the one before would call that real step
# "not reproduced". The session tests every build of the range, so the first build at the
# new level is found wherever in it the change landed.
SANDWICH_BEFORE = 2
SANDWICH_AFTER = 1


def _sandwich(nights: list[RunRecord], p: ChangePoint) -> tuple[str | None, str | None]:
    """(last good build, suspect build) to re-test for change point ``p``: the builds around
    it, widened by SANDWICH_BEFORE / SANDWICH_AFTER nights where there are nights."""
    good, suspect = p.prev_runtime_version, p.runtime_version
    ids = [r.run_id for r in nights]
    if p.run_id not in ids:
        return good, suspect
    first = ids.index(p.run_id)
    lo = max(0, first - 1 - SANDWICH_BEFORE)
    hi = min(len(nights) - 1, first + SANDWICH_AFTER, first + max(0, p.n_after - 1))
    return (
        nights[lo].runtime_version or good,
        nights[hi].runtime_version or suspect,
    )


def _range(suite: Suite, dag_id: str, good: str, suspect: str) -> tuple[list[str], str | None]:
    """Every build from ``good`` to ``suspect``, and why only the two ends when the builds
    between cannot be listed (the re-test then confirms without naming a culprit between)."""
    try:
        return (
            builds_between(
                good,
                suspect,
                template=suite.runtime_version,
                list_command=suite.history.builds,
                source=f"suite {dag_id}",
            ),
            None,
        )
    except BuildsError as e:
        return [good, suspect], f"the builds between are not tested: {e}"


def _same_cause(
    store: ResultsStore, earlier: list[Confirmation], points: list[ChangePoint]
) -> Confirmation | None:
    """The earlier re-test that already answers for one of ``points``, or None: one in
    flight or found real, on the same cell, whose builds hold the point's build; or one
    found real on the same series whose new level the point sits at (a newest night judged
    against nights on both sides of that step stands out by the step itself, not by a
    second change: its level after is within half the found change of the earlier one)."""
    for c in earlier:
        if c.state not in (*ACTIVE_STATES, CONFIRMED, FOUND, AMBIGUOUS):
            continue
        cells = {t["cell_id"] for t in c.targets or []}
        builds = set(c.builds or [c.good_build, c.suspect_build])
        builds.discard(c.good_build)  # the last good build is before the change
        for p in points:
            if p.cell_id in cells and p.runtime_version in builds:
                return c
        if c.state in ACTIVE_STATES:
            continue
        for t in c.targets or []:
            (old,) = store.get_change_points(ids=[t["change_id"]]) or [None]
            if old is None or not old.median_after or not old.change:
                continue
            for p in points:
                if (p.cell_id, p.metric) != (t["cell_id"], t["metric"]):
                    continue
                if p.median_after is None:
                    continue
                if abs(p.median_after / old.median_after - 1) < abs(old.change) / 2:
                    return c
    return None


def _per_sample(suite: Suite, metric: str) -> bool:
    """Whether the session can tell the samples of ``metric`` apart (a log metric)."""
    return any(isinstance(s, LogRegexSource) and s.name == metric for s in suite.workload.metrics)


def _launch(
    store: ResultsStore,
    suite: Suite,
    row: Confirmation,
    kind: str,
    session_builds: list[str],
    cells: list[str],
    params: JsonObject,
    trigger: Trigger,
    **fields: Any,
) -> None:
    """Trigger the next session of a re-test: ``session_builds`` (the reference first) on
    one machine per cell of ``cells``, ``history.confirm.pairs`` samples of each build;
    ``fields`` are saved on the re-test with it. Refused instead when it would cost over
    ``history.confirm.max_usd``."""
    spec = suite.history.confirm
    round_ = int(row.round) + 1
    run_id = run_id_for(kind, row.id, round_)
    fu = Followup(
        kind=kind,  # type: ignore[arg-type]
        confirmation=row.id,
        round=round_,
        cells=cells,
        builds=session_builds,
        pairs=spec.pairs,
        max_usd=spec.max_usd,
    )
    kept = {k: v for k, v in fields.items() if k not in ("state", "reason")}
    if spec.max_usd is not None:
        estimate = estimate_cost(suite, row.dag_id, fu, params)
        if estimate > spec.max_usd:
            _finish(
                store,
                replace(row, **kept),
                REFUSED,
                reason=(
                    f"the {kind} session would cost an estimated {estimate:.2f} USD for "
                    f"{len(cells)} machine(s) x {len(session_builds) * spec.pairs} samples, "
                    f"over history.confirm.max_usd {spec.max_usd:.2f}: nothing was provisioned"
                ),
                **kept,
            )
            return
    conf = {k: v for k, v in params.items() if k not in ("cells", FOLLOWUP_KEY)}
    conf[FOLLOWUP_KEY] = fu.model_dump()
    store.save_confirmation(
        row.dag_id,
        id=row.id,
        **{**fields, "round": round_, "run_id": run_id, "run_ids": [*row.run_ids, run_id]},
    )
    try:
        created = trigger(run_id, conf)
    except Exception as e:  # noqa: BLE001 - recorded on the re-test, which then notifies
        _finish(
            store, replace(row, **kept), FAILED, reason=f"could not start {run_id}: {e}", **kept
        )
        return
    log.info("%s session %s %s", kind, run_id, "started" if created else "already exists")


def estimate_cost(suite: Suite, dag_id: str, fu: Followup, params: JsonObject) -> float:
    """The session's estimated cost, as the plan's budget check computes it."""

    user = {k: v for k, v in params.items() if k in suite.params}
    plan = expand_followup(suite, dag_id, fu, params=user)
    expected = suite.budget.expected_seconds if suite.budget is not None else None
    if expected is not None:
        expected *= len(session_order(len(fu.builds), fu.pairs))
    return estimate(plan.cells, expected)


def refused_by_plan(
    store: ResultsStore, dag_id: str, run_id: str, fu: Followup, reason: str
) -> None:
    """The session's own plan refused it (its budget): the re-test ends as refused with the
    plan's reason, and the group notifies at the suite's next gate."""
    rows = store.get_confirmations(ids=[fu.confirmation])
    if rows and rows[0].dag_id == dag_id and rows[0].run_id == run_id:
        _finish(store, rows[0], REFUSED, reason=reason)


# -- advancing ---------------------------------------------------------------------------


def advance(
    store: ResultsStore,
    suite: Suite,
    dag_id: str,
    run_id: str,
    fu: Followup,
    params: JsonObject,
    trigger: Trigger,
) -> Confirmation | None:
    """At a session's gate: add its samples, decide, and start the next session or finish.
    The re-test as it now stands, or None when this run is not the one it waits for."""
    rows = store.get_confirmations(ids=[fu.confirmation])
    if not rows or rows[0].dag_id != dag_id:
        log.warning("session run %s: no re-test %s of %s", run_id, fu.confirmation, dag_id)
        return None
    row = rows[0]
    if row.run_id != run_id or row.state not in ACTIVE_STATES:
        log.info(
            "session run %s: re-test %s is %s and waits for %s: nothing to do",
            run_id,
            row.id,
            row.state,
            row.run_id,
        )
        return row
    cost = _finite(row.cost) + sum(_finite(c.cost) for c in store.get_cells(dag_id, run_id))
    samples, problems = _read_session(suite, dag_id, run_id, fu, row.targets)
    pooled = {k: list(v) for k, v in (row.samples or {}).items()}
    for key, new in samples.items():
        pooled.setdefault(key, []).extend(new)
    for p in problems:
        log.warning("session %s: %s", run_id, p)
    row = replace(row, samples=pooled, cost=cost)
    if row.state == CONFIRMING:
        return _after_confirm(store, suite, row, params, trigger, problems)
    return _after_search(store, suite, row, params, trigger)


def _read_session(
    suite: Suite, dag_id: str, run_id: str, fu: Followup, targets: list[dict[str, Any]]
) -> tuple[dict[str, list[list[object]]], list[str]]:
    """target key -> the session's sample rows; and what went wrong in the session."""
    out: dict[str, list[list[object]]] = {}
    problems: list[str] = []
    for cell in fu.cells:
        mine = [t for t in targets if t["cell_id"] == cell]
        if not mine:
            continue
        session_cell = session_cell_id(cell, fu.round)
        path = settings.cell_artifacts_dir(dag_id, run_id, session_cell) / "output.log"
        session = read_samples(
            path,
            builds=fu.builds,
            round_=fu.round,
            sources=suite.workload.metrics,
            statistics={t["metric"]: t["statistic"] for t in mine},
        )
        problems += [f"{cell}: {p}" for p in session.failed]
        for t in mine:
            out.setdefault(_key(t), []).extend(
                s.as_list() for s in session.samples if s.metric == t["metric"]
            )
    return out, problems


def _compare(row: Confirmation, t: dict[str, Any], build: str) -> Comparison:
    """``build`` against the re-test's reference build, on target ``t``'s pooled pairs."""
    samples = [Sample.from_list(s) for s in row.samples.get(_key(t), [])]
    ref, metric = row.good_build, t["metric"]
    return compare(
        values_of(samples, ref, metric),
        values_of(samples, build, metric),
        pairs_of(samples, ref, build, metric),
    )


def _looks(row: Confirmation, t: dict[str, Any], build: str) -> list[int]:
    """The pooled pairs of ``build`` against the reference at each look so far: after
    every session (round) that brought samples of it, oldest first (``Policy.critical``)."""
    samples = [Sample.from_list(s) for s in row.samples.get(_key(t), [])]
    rounds = sorted({s.round for s in samples if s.build == build})
    ref, metric = row.good_build, t["metric"]
    return [len(pairs_of([s for s in samples if s.round <= r], ref, build, metric)) for r in rounds]


def _decision(
    c: Comparison, verdict: str, critical: tuple[float, float] | None = None
) -> dict[str, Any]:
    """A comparison as the re-test stores it (its names are those the page reads), with
    the critical values its look was judged at (``z_new``, ``z_old``)."""
    extra = {"z_new": critical[0], "z_old": critical[1]} if critical else {}
    return {
        **c.as_dict(),
        **extra,
        "verdict": verdict,
        "n_good": c.n_base,
        "n_suspect": c.n_head,
        "median_good": c.median_base,
        "median_suspect": c.median_head,
        "p_worse": c.p_greater,
    }


def _after_confirm(
    store: ResultsStore,
    suite: Suite,
    row: Confirmation,
    params: JsonObject,
    trigger: Trigger,
    problems: list[str],
) -> Confirmation:
    """The suspect build against the last good one: another session, not reproduced,
    undecided, or confirmed (and then, with builds between, the search for the first bad)."""
    policy = policy_of(suite.history.confirm)
    suspect = row.suspect_build
    comparisons = {_key(t): (t, _compare(row, t, suspect)) for t in row.targets}
    comparisons = {k: v for k, v in comparisons.items() if v[1].pairs >= 2}
    if not comparisons:
        why = "; ".join(problems[:3]) or "their cells failed: see the run"
        return _finish(
            store,
            row,
            FAILED,
            reason=(
                "the re-test sessions gave fewer than 2 pairs of samples for every suspect "
                f"series ({why}); not a verdict on the change"
            ),
        )
    # Every look at every target keeps the verdicts' error rates (Policy.critical): any
    # one target confirms the group, so the new level's side is shared among them.
    criticals = {
        k: policy.critical(_looks(row, t, suspect), targets=len(row.targets))
        for k, (t, _c) in comparisons.items()
    }
    verdicts = {
        k: _verdict(
            level(
                c,
                claimed=t["claimed"],
                higher_is_better=t["higher_is_better"],
                line=policy.confirm_line(t["claimed"]),
                z_new=criticals[k][0],
                z_old=criticals[k][1],
            )
        )
        for k, (t, c) in comparisons.items()
    }
    decision = {k: _decision(c, verdicts[k], criticals[k]) for k, (_t, c) in comparisons.items()}
    found = set(verdicts.values())
    verdict = (
        CONFIRMED
        if CONFIRMED in found
        else (NOT_REPRODUCED if found == {NOT_REPRODUCED} else UNDECIDED)
    )
    last = _session_builds(row)
    if verdict == UNDECIDED and _room(row, suspect, policy):
        cells = sorted({t["cell_id"] for t in row.targets})
        _launch(
            store, suite, row, "confirm", last, cells, params, trigger,
            samples=row.samples, cost=row.cost, decision=decision,
        )  # fmt: skip
        return store.get_confirmations(ids=[row.id])[0]
    _record_on_points(store, row, decision)
    if verdict == NOT_REPRODUCED:
        best = max(comparisons.values(), key=lambda tc: abs(tc[1].change))[1]
        note = (
            f"not reproduced on one machine, {best.pairs} pairs: median "
            f"{best.median_base:.6g} ({row.good_build}) vs {best.median_head:.6g} "
            f"({suspect}), {best.change:+.1%} [{best.ci_low:+.1%}, {best.ci_high:+.1%}]"
        )
        store.set_triage("group", row.group_id, "invalid", by=CONFIRM_BY, note=note)
        return _finish(store, row, NOT_REPRODUCED, decision=decision, reason=note)
    if verdict == UNDECIDED:
        return _finish(
            store,
            row,
            UNDECIDED,
            decision=decision,
            reason=f"undecided after {policy.max_pairs} pairs per build (history.confirm.max_pairs)",
        )
    # Confirmed. The search judges every build between by the size confirmed on the
    # machine, with the series that moved most.
    confirmed = [
        (t, c) for k, (t, c) in comparisons.items() if verdicts[k] == CONFIRMED
    ]  # fmt: skip
    t, c = max(confirmed, key=lambda tc: abs(tc[1].change))
    targets = [
        {**x, "claimed": abs(comparisons[_key(x)][1].change), "primary": x is t}
        if _key(x) in comparisons
        else x
        for x in row.targets
    ]
    row = replace(row, targets=targets, decision=decision)
    return _after_search(store, suite, row, params, trigger, state=BISECTING)


def _after_search(
    store: ResultsStore,
    suite: Suite,
    row: Confirmation,
    params: JsonObject,
    trigger: Trigger,
    state: str | None = None,
) -> Confirmation:
    """Judge every tested build of the range by the confirmed change, and finish with the
    culprit, or test the builds still unknown in another session."""
    policy = policy_of(suite.history.confirm)
    builds = list(row.builds or [row.good_build, row.suspect_build])
    primary = next((t for t in row.targets if t.get("primary")), None)
    if primary is None:  # confirmed by an earlier version of this record: its largest
        primary = max(row.targets, key=lambda t: abs(t.get("claimed") or 0))
    tested = [(i, b, _compare(row, primary, b)) for i, b in enumerate(builds[1:], start=1)]
    tested = [(i, b, c) for i, b, c in tested if c.pairs >= 2]
    hib = primary["higher_is_better"]
    line = split_line([0.0, *(c.oriented(hib)[0] for _i, _b, c in tested)])
    levels: dict[str, str] = {}
    steps = []
    for i, b, c in tested:
        z_new, z_old = policy.critical(_looks(row, primary, b))
        lv = level(
            c, claimed=primary["claimed"], higher_is_better=hib, line=line, z_new=z_new, z_old=z_old
        )
        levels[b] = lv
        steps.append(
            {
                "index": i,
                "build": b,
                "verdict": STEP_VERDICT.get(lv, "unknown"),
                "n": c.pairs,
                "median_good": c.median_base,
                "median_build": c.median_head,
                "change": c.change,
                "ci_low": c.ci_low,
                "ci_high": c.ci_high,
                "p_value": c.p_paired,
                "cliffs_delta": c.cliffs_delta,
                "line": line,
            }
        )
    suspect = row.suspect_build
    levels[suspect] = NEW_LEVEL  # confirmed: the suspect build is at the new level
    search = Search(builds, levels)
    fields: dict[str, Any] = {"steps": steps, "targets": row.targets}
    if row.decision is not None:
        fields["decision"] = row.decision
    if search.state == FOUND:
        kind = CONFIRMED if len(builds) == 2 else FOUND
        return _finish(
            store, row, kind, culprit=search.culprit, last_good=search.last_good, **fields
        )
    if search.state == AMBIGUOUS:
        return _finish(store, row, AMBIGUOUS, reason=search.contradiction, **fields)
    if not suite.history.confirm.bisect:
        return _finish(
            store, row, CONFIRMED, reason="the builds between are not searched "
            "(history.confirm.bisect is off)", **fields,
        )  # fmt: skip
    open_ = [b for b in search.untested() if _room(row, b, policy)]
    lo, hi = search.bounds
    if not open_:
        return _finish(
            store,
            row,
            AMBIGUOUS,
            reason=(
                f"the first bad build is between {builds[lo]} and {builds[hi]}: the builds "
                f"between stayed undecided within {policy.max_pairs} pairs each "
                "(a change that builds in over several builds, or noise too large)"
            ),
            **fields,
        )
    picks = spread(open_, MAX_SESSION_BUILDS - 2)
    cells = [primary["cell_id"]]
    log.info("bisecting %s: %d builds between %s and %s", row.id, len(open_), lo, hi)
    _launch(
        store,
        suite,
        row,
        "bisect",
        [row.good_build, *picks, suspect],
        cells,
        params,
        trigger,
        state=state or BISECTING,
        samples=row.samples,
        cost=row.cost,
        **fields,
    )
    return store.get_confirmations(ids=[row.id])[0]


# -- pieces ------------------------------------------------------------------------------


def _finite(v: Any) -> float:
    """A cost as a number: none recorded (None, or NaN as the store reads it back) is 0."""
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else 0.0


def _verdict(lv: str) -> str:
    return {NEW_LEVEL: CONFIRMED, OLD_LEVEL: NOT_REPRODUCED}.get(lv, UNDECIDED)


def _key(target: dict[str, Any]) -> str:
    return f"{target['cell_id']}|{target['metric']}"


def _session_builds(row: Confirmation) -> list[str]:
    """The builds the re-test's last session compared (its run's conf is not at hand here:
    the range's ends and the builds between that have samples)."""
    have = {str(s[3]) for rows in (row.samples or {}).values() for s in rows}
    builds = list(row.builds or [row.good_build, row.suspect_build])
    inner = [b for b in builds[1:-1] if b in have]
    return [builds[0], *inner, builds[-1]]


def _room(row: Confirmation, build: str, policy: Policy) -> bool:
    """Whether ``build`` may get another session's pairs within ``max_pairs``."""
    ref = row.good_build
    most = 0
    for rows in (row.samples or {}).values():
        samples = [Sample.from_list(s) for s in rows]
        metrics = {s.metric for s in samples}
        for m in metrics:
            most = max(most, len(pairs_of(samples, ref, build, m)))
    return most + policy.pairs <= policy.max_pairs


def _record_on_points(
    store: ResultsStore, row: Confirmation, decision: dict[str, dict[str, Any]]
) -> None:
    """Each re-tested change point gets its verdict and the comparison behind it."""
    for t in row.targets:
        d = decision.get(_key(t))
        if d is None:
            continue
        if not store.get_change_points(ids=[t["change_id"]]):
            # Taken back by a pass before the re-test was (kept since: tracking.py holds
            # a re-tested change), or deleted by hand: the verdict stays on the re-test.
            log.warning("re-test %s: change point %s is gone", row.id, t["change_id"])
            continue
        store.save_change_point(
            row.dag_id, id=t["change_id"], confirm_state=d["verdict"], confirm=d
        )


def _finish(store: ResultsStore, row: Confirmation, state: str, **fields: Any) -> Confirmation:
    """Record the re-test's final state (and on its change points those that have none)."""
    values = {"state": state, "run_id": None, **fields}
    if state in (FOUND, CONFIRMED, NOT_REPRODUCED) and (
        decision := values.get("decision") or row.decision
    ):
        # The culprit report: the cause's class from the sibling cells, and the op-level
        # diff where the sessions kept profiler traces (history.culprits.culprit_profile).
        values["decision"] = {k: dict(v) for k, v in decision.items()}
        whole = replace(row, **values)
        attach_attribution(store, whole, values["decision"], reproduced=state != NOT_REPRODUCED)
        if state != NOT_REPRODUCED:
            attach(whole, values["decision"])
    if values.get("cost") is None and row.cost is not None:
        values["cost"] = row.cost
    if "samples" not in values:
        values["samples"] = row.samples or {}
    store.save_confirmation(row.dag_id, id=row.id, **values)
    if state in (FOUND, CONFIRMED) and values.get("culprit"):
        # One change, one first bad build: the change, its group and its summary move to
        # the build the re-test proved (history.retests.placement).
        place(store, replace(row, **values), suite_nights(store, row.dag_id))
    for t in row.targets:
        p = store.get_change_points(ids=[t["change_id"]])
        if p and p[0].confirm_state is None:
            note = {"reason": fields.get("reason")} if fields.get("reason") else None
            store.save_change_point(
                row.dag_id, id=t["change_id"], confirm_state=state, confirm=note
            )
    log.info(
        "re-test %s of group %s: %s%s",
        row.id,
        row.group_id,
        state,
        f" ({fields['reason']})" if fields.get("reason") else "",
    )
    if state in (FOUND, CONFIRMED) and (culprit := fields.get("culprit")):
        log.info("first bad build: %s (last good: %s)", culprit, fields.get("last_good"))
    return store.get_confirmations(ids=[row.id])[0]
