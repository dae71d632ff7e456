"""Confirm and bisect: a suspect change re-tested through the suite's own DAG, the same night.

When the gate's change-point pass leaves an open regression group that nobody was told of
yet, ``start_confirmations`` records a re-test of it (``results.schema.confirmations``, one
per group: the unique key is what stops a re-run gate or a restarted scheduler from
starting a second) and triggers a **follow-up run** of the suite: an ordinary DAG run whose
conf names the suspect cells, the last good build and the suspect build, and the repeats
(``spec.followup`` plans it: the builds interleaved, each cell testing its own build).

At the follow-up run's gate, ``advance`` reads the run's samples (each cell's value of the
changed metric, by the series' own statistic), decides with ``history.confirm.decide`` and
moves the re-test on:

    confirming --undecided, under the cap--> confirming (next round: the repeats doubled)
    confirming --not reproduced--> not_reproduced (the group is closed as invalid: no page)
    confirming --confirmed, adjacent builds--> confirmed (the suspect build is the culprit)
    confirming --confirmed, builds between--> bisecting (one follow-up run per step)
    bisecting --step decided--> bisecting (next middle build) | found | ambiguous
    any --the runs gave no samples--> failed;  --over history.confirm.max_usd--> refused

A confirmed change notifies with its culprit (``found``; ``ambiguous`` when the bisect could
not decide a step, saying between which builds), and so does one whose re-test could not
run (``failed``: its runs gave no samples; ``refused``: over the budget), with the reason
(``NOTIFY_STATES``). ``not_reproduced`` closes the group as invalid; ``undecided`` at the
cap leaves it open on the history page, unpaged: the re-runs neither reproduced the change
nor ruled it out.

Follow-up runs never become points of the nightly series: they are recorded with run type
``confirm`` or ``bisect`` (``results.schema.FOLLOWUP_RUN_TYPES``), which history reads skip.
Triggering is the caller's (``Trigger``): the gate passes one that asks Airflow's
execution API, as TriggerDagRunOperator does; run ids are deterministic, so asking twice
starts one run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelmatrix.history.bisect import AMBIGUOUS, FOUND, Bisect, Step
from accelmatrix.history.builds import BuildsError, builds_between
from accelmatrix.history.confirm import (
    CONFIRMED,
    NOT_REPRODUCED,
    UNDECIDED,
    Decision,
    Policy,
    decide,
    next_repeats,
)
from accelmatrix.history.grouping import NOT_REPRODUCED_BY
from accelmatrix.results.changes import OPEN_STATES
from accelmatrix.spec.followup import FOLLOWUP_KEY, Followup, base_cell, expand_followup

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

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
ACTIVE_STATES = (CONFIRMING, BISECTING)
# Undecided at the cap is not among them: the re-runs neither reproduced the change nor ruled
# it out, which is no reason to page anyone (the group stays open on the history page, with
# the re-test's medians and p-value). A re-test that could not run is (failed, refused).
NOTIFY_STATES = (CONFIRMED, FAILED, REFUSED, FOUND, AMBIGUOUS)
# Who closes a group whose change the re-runs did not reproduce (triage's "by").
CONFIRM_BY = NOT_REPRODUCED_BY
# Re-tests a gate starts at most per run: a bad night over many cells is one group (a
# build or machine kind), so this bounds the machine time a storm of groups can take.
MAX_NEW_PER_RUN = 4

# (run_id, conf) -> True if the run was created, False if it already existed.
Trigger = Callable[[str, dict[str, Any]], bool]


def policy_of(spec: Any) -> Policy:
    """The test policy of a suite's ``history.confirm`` block."""
    return Policy(repeats=spec.repeats, max_repeats=spec.max_repeats)


def run_id_for(kind: str, confirmation_id: int, round_: int) -> str:
    """The follow-up run's id: one per re-test and round, so a second trigger is a no-op."""
    return f"accelmatrix_{kind}__{confirmation_id}_{round_}"


# -- starting ----------------------------------------------------------------------------


def start_confirmations(
    store: ResultsStore,
    suite: Any,
    dag_id: str,
    params: dict[str, Any],
    trigger: Trigger,
) -> list[dict[str, Any]]:
    """Start the re-test of every open regression group of ``dag_id`` that has none and was
    not notified (at most MAX_NEW_PER_RUN); the confirmations started (or refused).
    ``params`` are the run's params, passed on to the follow-up runs."""
    spec = suite.history.confirm
    if not spec.enabled:
        return []
    have = {c["group_id"] for c in store.get_confirmations(dag_id)}
    started: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] | None = None
    for g in store.get_change_groups(dag_id, states=OPEN_STATES):
        if len(started) >= MAX_NEW_PER_RUN:
            break
        if g["direction"] != "regression" or g["notified_at"] is not None or g["id"] in have:
            continue
        if g["kind"] == "infrastructure":
            # One machine kind moved while the others, on the same builds, did not: re-running
            # builds on that kind would compare two builds on one slow machine. It is not a
            # build's change to confirm; it notifies as infrastructure.
            continue
        points = [
            p
            for p in store.get_change_points(dag_id, group_id=g["id"])
            if not p["missing"] and p["direction"] == "regression"
        ]
        if not points:
            continue
        points.sort(key=lambda p: -abs(p["effect"] or 0))
        cells: list[str] = []
        targets = []
        for p in points:
            if p["cell_id"] not in cells:
                if len(cells) >= spec.max_cells:
                    continue
                cells.append(p["cell_id"])
            targets.append(
                {
                    "change_id": p["id"],
                    "cell_id": p["cell_id"],
                    "metric": p["metric"],
                    "statistic": _statistic(suite, p["metric"]),
                    "higher_is_better": suite.history.higher_is_better_for(p["metric"]),
                    "claimed": abs(p["change"] or 0.0),
                }
            )
        if builds is None:
            builds = _nights(store, dag_id)
        good, suspect = _sandwich(builds, points[0])
        row = store.start_confirmation(
            dag_id,
            g["id"],
            {
                "state": CONFIRMING,
                "targets": targets,
                "good_build": good,
                "suspect_build": suspect,
            },
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
        log.info(
            "re-testing change group %s of %s: %s vs %s on %s",
            g["id"],
            dag_id,
            good,
            suspect,
            ", ".join(cells),
        )
        _launch(store, suite, row, "confirm", [good, suspect], cells, spec.repeats, params, trigger)
    return started


# A change the detector placed (not a lone newest point) is re-tested across this many
# more nights on each side: with a few nights after it, a small step's position is
# uncertain by a night or two, and re-testing two builds both on one side of the real
# change would call a real regression "not reproduced". The bisect then finds the night.
SANDWICH_MARGIN = 1


def _nights(store: ResultsStore, dag_id: str) -> list[dict[str, Any]]:
    """The suite's runs that are points of its series, oldest first."""
    from accelmatrix.results.schema import FOLLOWUP_RUN_TYPES

    rows = [r for r in store.get_runs(dag_id) if r.get("run_type") not in FOLLOWUP_RUN_TYPES]
    return list(reversed(rows))


def _sandwich(nights: list[dict[str, Any]], p: dict[str, Any]) -> tuple[str | None, str | None]:
    """(last good build, suspect build) to re-test for change point ``p``: the builds around
    it, widened by SANDWICH_MARGIN nights each side when the detector placed it (a one-night
    suspect at the newest point is exactly where it is)."""
    good, suspect = p["prev_runtime_version"], p["runtime_version"]
    if p["n_after"] <= 1:
        return good, suspect
    ids = [r["run_id"] for r in nights]
    if p["run_id"] not in ids:
        return good, suspect
    first = ids.index(p["run_id"])
    lo = max(0, first - 1 - SANDWICH_MARGIN)
    hi = min(len(nights) - 1, first + SANDWICH_MARGIN, first + p["n_after"] - 1)
    return (
        nights[lo].get("runtime_version") or good,
        nights[hi].get("runtime_version") or suspect,
    )


def _launch(
    store: ResultsStore,
    suite: Any,
    row: dict[str, Any],
    kind: str,
    run_builds: list[str],
    run_cells: list[str],
    repeats: int,
    params: dict[str, Any],
    trigger: Trigger,
    **fields: Any,
) -> None:
    """Trigger the next follow-up run of a re-test, testing ``run_builds`` (the good build
    first) on ``run_cells``, ``repeats`` runs each; ``fields`` are saved on the re-test with
    it. Refused instead when it would cost over ``history.confirm.max_usd``."""
    builds, cells = run_builds, run_cells
    spec = suite.history.confirm
    round_ = int(row["round"]) + 1
    run_id = run_id_for(kind, row["id"], round_)
    fu = Followup(
        kind=kind,  # type: ignore[arg-type]
        confirmation=row["id"],
        round=round_,
        cells=cells,
        builds=builds,
        repeats=repeats,
        max_usd=spec.max_usd,
    )
    if spec.max_usd is not None:
        estimate = estimate_cost(suite, row["dag_id"], fu, params)
        if estimate > spec.max_usd:
            kept = {k: v for k, v in fields.items() if k != "state"}
            _finish(
                store,
                {**row, **kept},
                REFUSED,
                reason=(
                    f"the {kind} run would cost an estimated {estimate:.2f} USD for "
                    f"{len(cells) * len(builds) * repeats} cell(s), over history.confirm."
                    f"max_usd {spec.max_usd:.2f}: nothing was provisioned"
                ),
                **kept,
            )
            return
    conf = {k: v for k, v in params.items() if k not in ("cells", FOLLOWUP_KEY)}
    conf[FOLLOWUP_KEY] = fu.model_dump()
    store.save_confirmation(
        row["dag_id"],
        {**fields, "round": round_, "run_id": run_id, "run_ids": [*row["run_ids"], run_id]},
        id=row["id"],
    )
    try:
        created = trigger(run_id, conf)
    except Exception as e:  # noqa: BLE001 - recorded on the re-test, which then notifies
        kept = {k: v for k, v in fields.items() if k != "state"}
        _finish(store, {**row, **kept}, FAILED, reason=f"could not start {run_id}: {e}", **kept)
        return
    log.info("%s run %s %s", kind, run_id, "started" if created else "already exists")


def estimate_cost(suite: Any, dag_id: str, fu: Followup, params: dict[str, Any]) -> float:
    """The follow-up run's estimated cost, as the plan's budget check computes it."""
    from accelmatrix.pricing import estimate_cost as estimate

    user = {k: v for k, v in params.items() if k in suite.params}
    plan = expand_followup(suite, dag_id, fu, params=user)
    expected = suite.budget.expected_seconds if suite.budget is not None else None
    return estimate(plan.cells, expected)


def refused_by_plan(
    store: ResultsStore, dag_id: str, run_id: str, fu: Followup, reason: str
) -> None:
    """The follow-up run's own plan refused it (its budget): the re-test ends as refused
    with the plan's reason, and the group notifies at the suite's next gate."""
    rows = store.get_confirmations(ids=[fu.confirmation])
    if rows and rows[0]["dag_id"] == dag_id and rows[0]["run_id"] == run_id:
        _finish(store, rows[0], REFUSED, reason=reason)


# -- advancing ---------------------------------------------------------------------------


def advance(
    store: ResultsStore,
    suite: Any,
    dag_id: str,
    run_id: str,
    fu: Followup,
    params: dict[str, Any],
    trigger: Trigger,
) -> dict[str, Any] | None:
    """At a follow-up run's gate: add its samples, decide, and start the next run or finish.
    The re-test as it now stands, or None when this run is not the one it waits for."""
    rows = store.get_confirmations(ids=[fu.confirmation])
    if not rows or rows[0]["dag_id"] != dag_id:
        log.warning("follow-up run %s: no re-test %s of %s", run_id, fu.confirmation, dag_id)
        return None
    row = rows[0]
    if row["run_id"] != run_id or row["state"] not in ACTIVE_STATES:
        log.info(
            "follow-up run %s: re-test %s is %s and waits for %s: nothing to do",
            run_id,
            row["id"],
            row["state"],
            row["run_id"],
        )
        return row
    policy = policy_of(suite.history.confirm)
    cost = (row["cost"] or 0.0) + sum(
        c["cost"] for c in store.get_cells(dag_id, run_id) if c.get("cost") is not None
    )
    samples = _merge(row["samples"], _samples(store, dag_id, run_id, row["targets"]))
    samples["_runs"] = int(samples.get("_runs", 0)) + fu.repeats
    row = {**row, "samples": samples, "cost": cost}
    good, tested = fu.builds[0], fu.builds[-1]
    if fu.kind == "confirm":
        return _after_confirm(store, suite, row, good, tested, policy, params, trigger)
    return _after_step(store, suite, row, good, tested, policy, params, trigger)


def _after_confirm(
    store: ResultsStore,
    suite: Any,
    row: dict[str, Any],
    good: str,
    suspect: str,
    policy: Policy,
    params: dict[str, Any],
    trigger: Trigger,
) -> dict[str, Any]:
    """The confirm round's verdict: another round, not reproduced, undecided, confirmed
    (culprit = the suspect build for adjacent builds), or the bisect's first step."""
    decisions = _decide(row, good, suspect, policy)
    if decisions is None:
        return _finish(
            store,
            row,
            FAILED,
            reason=(
                "the confirm runs gave fewer than 2 samples of a build for every suspect "
                "series (their cells failed: see the run); not a verdict on the change"
            ),
        )
    verdict = _group_verdict(decisions)
    if verdict == UNDECIDED and (more := next_repeats(row["samples"]["_runs"], policy)) > 0:
        cells = sorted({t["cell_id"] for t in row["targets"]})
        _launch(
            store,
            suite,
            row,
            "confirm",
            [good, suspect],
            cells,
            more,
            params,
            trigger,
            samples=row["samples"],
            cost=row["cost"],
        )
        return store.get_confirmations(ids=[row["id"]])[0]
    decision = {k: d.as_dict() for k, d in decisions.items()}
    _record_on_points(store, row, decisions)
    if verdict == NOT_REPRODUCED:
        best = max(decisions.values(), key=lambda d: abs(d.change))
        note = (
            f"not reproduced by {best.n_good} + {best.n_suspect} re-runs: median "
            f"{best.median_good:.6g} ({good}) vs {best.median_suspect:.6g} ({suspect}), "
            f"{best.change:+.1%}"
        )
        store.set_triage("group", row["group_id"], "invalid", by=CONFIRM_BY, note=note)
        return _finish(store, row, NOT_REPRODUCED, decision=decision, reason=note)
    if verdict == UNDECIDED:
        return _finish(
            store,
            row,
            UNDECIDED,
            decision=decision,
            reason=f"undecided after {row['samples']['_runs']} runs per build (the cap)",
        )
    # Confirmed. The bisect compares the builds in between with the confirmed size.
    confirmed = [t for t in row["targets"] if decisions[_key(t)].verdict == CONFIRMED]
    targets = [
        {**t, "claimed": abs(decisions[_key(t)].change)} if t in confirmed else t
        for t in row["targets"]
    ]
    row = {**row, "targets": targets}
    try:
        builds = builds_between(
            good,
            suspect,
            template=suite.runtime_version,
            list_command=suite.history.builds,
            source=f"suite {row['dag_id']}",
        )
    except BuildsError as e:
        return _finish(
            store,
            row,
            CONFIRMED,
            decision=decision,
            reason=f"not bisected: {e}",
            targets=targets,
        )
    if len(builds) <= 2 or not suite.history.confirm.bisect:
        return _finish(
            store,
            row,
            CONFIRMED,
            decision=decision,
            targets=targets,
            culprit=suspect if len(builds) <= 2 else None,
            last_good=good if len(builds) <= 2 else None,
            reason=None if len(builds) <= 2 else "bisect is off (history.confirm.bisect)",
        )
    nxt = Bisect(builds).next_build()
    if nxt is None:  # cannot happen with more than two builds; say so rather than guess
        return _finish(store, row, AMBIGUOUS, decision=decision, reason="no build to bisect")
    cells = sorted({t["cell_id"] for t in confirmed})
    log.info("change confirmed; bisecting %d builds from %s to %s", len(builds), good, suspect)
    _launch(
        store,
        suite,
        row,
        "bisect",
        [good, nxt[1]],
        cells,
        policy.repeats,
        params,
        trigger,
        state=BISECTING,
        decision=decision,
        targets=targets,
        builds=builds,
        samples={},
        steps=[],
        cost=row["cost"],
    )
    return store.get_confirmations(ids=[row["id"]])[0]


def _after_step(
    store: ResultsStore,
    suite: Any,
    row: dict[str, Any],
    good: str,
    build: str,
    policy: Policy,
    params: dict[str, Any],
    trigger: Trigger,
) -> dict[str, Any]:
    """A bisect step's verdict on ``build``: another round, the next step, or the end."""
    bisect = Bisect(list(row["builds"]), [Step(**s) for s in row["steps"]])
    due = bisect.next_build()
    if due is None or due[1] != build:
        return _finish(store, row, AMBIGUOUS, reason=f"bisect step for {build} was not due")
    primary = [
        t
        for t in row["targets"]
        if (row["decision"] or {}).get(_key(t), {}).get("verdict") == CONFIRMED
    ]
    decisions = _decide({**row, "targets": primary}, good, build, policy)
    d = None if decisions is None else max(decisions.values(), key=lambda x: abs(x.change))
    verdict = UNDECIDED if d is None else _group_verdict(decisions)
    if verdict == UNDECIDED and d is not None:
        if (more := next_repeats(row["samples"]["_runs"], policy)) > 0:
            cells = sorted({t["cell_id"] for t in primary})
            _launch(
                store,
                suite,
                row,
                "bisect",
                [good, build],
                cells,
                more,
                params,
                trigger,
                samples=row["samples"],
                cost=row["cost"],
            )
            return store.get_confirmations(ids=[row["id"]])[0]
    step = Step(
        index=due[0],
        build=build,
        verdict=verdict if d is not None else FAILED,
        median_good=None if d is None else d.median_good,
        median_build=None if d is None else d.median_suspect,
        n=0 if d is None else d.n_suspect,
        p_value=None if d is None else d.p_worse,
    )
    bisect.record(step)
    steps = [*row["steps"], step.__dict__]
    row = {**row, "steps": steps, "samples": {}}
    nxt = bisect.next_build()
    if nxt is not None:
        cells = sorted({t["cell_id"] for t in primary})
        _launch(
            store,
            suite,
            row,
            "bisect",
            [good, nxt[1]],
            cells,
            policy.repeats,
            params,
            trigger,
            steps=steps,
            samples={},
            cost=row["cost"],
        )
        return store.get_confirmations(ids=[row["id"]])[0]
    if bisect.state == FOUND:
        return _finish(
            store,
            row,
            FOUND,
            steps=steps,
            culprit=bisect.culprit,
            last_good=bisect.last_good,
        )
    return _finish(
        store,
        row,
        AMBIGUOUS,
        steps=steps,
        reason=(
            f"bisect could not decide at build {build} within {policy.max_repeats} runs per "
            f"build (the culprit is between {row['builds'][bisect.bounds[0]]} and "
            f"{row['builds'][bisect.bounds[1]]})"
        ),
    )


# -- pieces ------------------------------------------------------------------------------


def _statistic(suite: Any, metric: str) -> str:
    return suite.history.track.get(metric, "median")


def _key(target: dict[str, Any]) -> str:
    return f"{target['cell_id']}|{target['metric']}"


def _samples(
    store: ResultsStore, dag_id: str, run_id: str, targets: list[dict[str, Any]]
) -> dict[str, dict[str, list[float]]]:
    """target key -> build -> the run's values (one per cell: the metric's statistic over
    the cell's steps). A cell that logged no value of the metric adds nothing: an
    infrastructure failure is never a sample."""
    import numpy as np

    wanted = {(t["cell_id"], t["metric"]): t for t in targets}
    per_cell: dict[tuple[str, str, str], list[tuple[int | None, float]]] = {}
    for m in store.get_metrics(dag_id, run_id):
        cid, build = base_cell(m["cell_id"])
        if build is None or (cid, m["name"]) not in wanted or m["value"] is None:
            continue
        per_cell.setdefault((m["cell_id"], m["name"], build), []).append((m["step"], m["value"]))
    out: dict[str, dict[str, list[float]]] = {}
    for (cell, name, build), rows in sorted(per_cell.items()):
        t = wanted[(base_cell(cell)[0], name)]
        rows.sort(key=lambda r: (r[0] is not None, r[0] or 0))
        values = np.asarray([v for _, v in rows], dtype="float64")
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        stat = t["statistic"]
        value = float(values[-1] if stat == "last" else getattr(np, stat)(values))
        out.setdefault(_key(t), {}).setdefault(build, []).append(value)
    return out


def _merge(old: dict[str, Any], new: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out = {
        k: ({b: list(v) for b, v in d.items()} if isinstance(d, dict) else d)
        for k, d in (old or {}).items()
    }
    for key, by_build in new.items():
        for build, values in by_build.items():
            out.setdefault(key, {}).setdefault(build, []).extend(values)
    return out


def _decide(
    row: dict[str, Any], good: str, tested: str, policy: Policy
) -> dict[str, Decision] | None:
    """A decision per target with at least 2 samples of each build; None if none has."""
    out = {}
    for t in row["targets"]:
        s = row["samples"].get(_key(t), {})
        g, x = s.get(good, []), s.get(tested, [])
        if len(g) < 2 or len(x) < 2:
            continue
        out[_key(t)] = decide(
            g, x, claimed=t["claimed"], higher_is_better=t["higher_is_better"], policy=policy
        )
    return out or None


def _group_verdict(decisions: dict[str, Decision]) -> str:
    """Confirmed if any series of the group reproduces its change; not reproduced if none
    does and every one is ruled out; otherwise undecided."""
    verdicts = {d.verdict for d in decisions.values()}
    if CONFIRMED in verdicts:
        return CONFIRMED
    if verdicts == {NOT_REPRODUCED}:
        return NOT_REPRODUCED
    return UNDECIDED


def _record_on_points(
    store: ResultsStore, row: dict[str, Any], decisions: dict[str, Decision]
) -> None:
    """Each re-tested change point gets its verdict and the decision behind it."""
    for t in row["targets"]:
        d = decisions.get(_key(t))
        if d is None:
            continue
        store.save_change_point(
            row["dag_id"], {"confirm_state": d.verdict, "confirm": d.as_dict()}, id=t["change_id"]
        )


def _finish(store: ResultsStore, row: dict[str, Any], state: str, **fields: Any) -> dict[str, Any]:
    """Record the re-test's final state (and on its change points those that have none)."""
    values = {"state": state, "run_id": None, **fields}
    if values.get("cost") is None and row.get("cost") is not None:
        values["cost"] = row["cost"]
    if "samples" not in values:
        values["samples"] = row.get("samples") or {}
    store.save_confirmation(row["dag_id"], values, id=row["id"])
    for t in row["targets"]:
        p = store.get_change_points(ids=[t["change_id"]])
        if p and p[0]["confirm_state"] is None:
            note = {"reason": fields.get("reason")} if fields.get("reason") else None
            store.save_change_point(
                row["dag_id"], {"confirm_state": state, "confirm": note}, id=t["change_id"]
            )
    log.info(
        "re-test %s of group %s: %s%s",
        row["id"],
        row["group_id"],
        state,
        f" ({fields['reason']})" if fields.get("reason") else "",
    )
    if state in (FOUND, CONFIRMED) and (culprit := fields.get("culprit")):
        log.info("first bad build: %s (last good: %s)", culprit, fields.get("last_good"))
    return store.get_confirmations(ids=[row["id"]])[0]
