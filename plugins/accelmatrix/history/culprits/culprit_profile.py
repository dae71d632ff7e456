"""The culprit report's op-level diff: the traces a re-test kept, found and compared.

A re-test session of a suite that collects profiler traces keeps the first few profiled
samples of each build, interleaved like the timed ones (the ``profiled_samples`` of the
suite's ``profiler_trace`` metric, default 3; ``backends/interleave.py``, under
``spec.followup_plan.PROFILES_DIR`` of the session cell's collected files). When the
re-test ends with a culprit (or a confirmed suspect), ``profile_for`` diffs the last good
build's traces against the culprit's (``history.culprits.profile_diff``: each trace one sample, the
intervals from the spread between them), over every session of the re-test, and ``attach``
stores the diff's JSON with each target's decision, so the change's report,
``changepoints --suite --json`` and the alert carry it. A suite without traces gets
nothing (no diff, no message); a trace that cannot be read gets one message in the
report, and the verdict stands without the diff.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.contracts.change_point_records import (
    CONFIRMED,
    FOUND,
    NOT_REPRODUCED,
    Confirmation,
)
from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.history.culprits.attribution import (
    NIGHTS_AFTER,
    WORKLOAD_AXES,
    attribute,
    siblings_from_history,
)
from accelmatrix.history.culprits.profile_diff import DiffOutcome, diff_traces
from accelmatrix.history.series.frame import history
from accelmatrix.spec.followup_plan import PROFILES_DIR, session_cell_id

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

__all__ = [
    "ATTRIBUTION_KEY",
    "PROFILE_KEY",
    "attach",
    "attach_attribution",
    "profile_for",
    "traces_of",
]

log = logging.getLogger(__name__)

# The key of the diff (or its error) in a target's decision.
PROFILE_KEY = "profile"
# ... and of the cause's class with its sibling evidence (history.culprits.attribution).
ATTRIBUTION_KEY = "attribution"
# The re-test states whose class is read again as nights arrive.
REREAD_STATES = (FOUND, CONFIRMED, NOT_REPRODUCED)
# ... for this long after the re-test began (weekly suites need a month for four nights).
REREAD_FOR = timedelta(days=45)
TRACE_SUFFIXES = (".json", ".json.gz")


def build_dir(build: str) -> str:
    """The folder name interleave.py gives a build's kept traces."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", build)


def traces_of(dag_id: str, run_ids: list[str], cell_id: str, rounds: int, build: str) -> list[Path]:
    """Every trace kept for ``build`` in cell ``cell_id``'s sessions of these runs."""
    out: list[Path] = []
    for run_id in run_ids:
        for r in range(1, rounds + 1):  # sessions are rounds 1, 2, ...; the row counts them
            cell = session_cell_id(cell_id, r)
            d = settings.cell_artifacts_dir(dag_id, run_id, cell) / "files" / PROFILES_DIR
            d = d / build_dir(build)
            if d.is_dir():
                out += sorted(p for p in d.iterdir() if p.name.endswith(TRACE_SUFFIXES))
    return out


def profile_for(
    dag_id: str, run_ids: list[str], cell_id: str, rounds: int, good: str, bad: str
) -> DiffOutcome | None:
    """The diff of ``bad``'s traces against ``good``'s in one cell's sessions; None when the
    sessions kept no trace at all (the suite collects none)."""
    a = traces_of(dag_id, run_ids, cell_id, rounds, good)
    b = traces_of(dag_id, run_ids, cell_id, rounds, bad)
    if not a and not b:
        return None
    if not a or not b:
        missing = good if not a else bad
        return DiffOutcome(None, f"no op-level diff: no profiler trace kept for build {missing}")
    return diff_traces(a, b)


def attach(row: Confirmation, decision: dict[str, JsonObject] | None) -> None:
    """Add each target's op-level diff (or its one-line error) to ``decision`` in place,
    for a re-test that ended with a culprit or a confirmed suspect. Never raises: the diff
    is evidence beside the verdict, not part of it."""
    good = row.last_good or row.good_build
    bad = row.culprit or row.suspect_build
    if not decision or not good or not bad:
        return
    done: dict[str, dict[str, Any] | None] = {}
    for t in row.targets or []:
        key = f"{t['cell_id']}|{t['metric']}"  # history.retests.followup's key of a target
        if key not in decision:
            continue
        cell = t["cell_id"]
        if cell not in done:
            try:
                out = profile_for(
                    row.dag_id, list(row.run_ids or []), cell, row.round or 0,
                    good, bad,
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001 (evidence only; the verdict stands)
                log.warning("op-level diff of %s failed: %s", cell, e)
                out = DiffOutcome(None, f"no op-level diff: {type(e).__name__}: {e}")
            done[cell] = None if out is None else _as_json(out, good, bad)
        if done[cell] is not None:
            decision[key] = {**decision[key], PROFILE_KEY: done[cell]}


def _as_json(out: DiffOutcome, good: str, bad: str) -> dict[str, Any]:
    if out.diff is None:
        return {"error": out.error, "good": good, "bad": bad}
    # "summary": the alert's text (notifications may not import history: it prints this)
    return {**out.diff.as_json(top=10), "good": good, "bad": bad, "summary": out.diff.summary()}


def attach_attribution(
    store: ResultsStore,
    row: Confirmation,
    decision: dict[str, JsonObject] | None,
    *,
    reproduced: bool,
) -> None:
    """Add each target's cause class (code, machine kind, axis value, noise) with the
    sibling cells' evidence to ``decision`` in place: the cells of the suite's nightly
    history around the change's night (``history.culprits.attribution``). Workload axes are those
    named in ``WORKLOAD_AXES``. Never raises: evidence beside the verdict."""
    if not decision:
        return
    frames: dict[str, Any] = {}
    for t in row.targets or []:
        key = f"{t['cell_id']}|{t['metric']}"
        if key not in decision:
            continue
        try:
            points = store.get_change_points(ids=[t["change_id"]])
            if not points:
                continue
            if t["metric"] not in frames:
                frames[t["metric"]] = history(store, metric=t["metric"], dag_id=row.dag_id)
            cells = siblings_from_history(
                frames[t["metric"]],
                points[0].logical_date,
                higher_is_better=bool(t.get("higher_is_better")),
            )
            change = next((c for c in cells if c.cell == t["cell_id"]), None)
            if change is None:
                continue
            a = attribute(
                change,
                cells,
                reproduced=reproduced,
                workload_axes=set(change.axes) & WORKLOAD_AXES,
            )
        except Exception as e:  # noqa: BLE001 (evidence only; the verdict stands)
            log.warning("attribution of %s failed: %s", key, e)
            continue
        stored = {**asdict(a), "summary": a.describe(), "nights_after": change.nights_after}
        decision[key] = {**decision[key], ATTRIBUTION_KEY: stored}


def refresh_attributions(store: ResultsStore, dag_id: str) -> int:
    """Classify again the finished re-tests whose class was read from fewer than
    ``NIGHTS_AFTER`` nights after the change; the number updated.

    Why: a re-test ends the night its suspect lands, when each sibling's Δ rests on one
    night: a 3 % change is then barely beyond a 2 % night's noise, and the class is right
    in 68-94 % of planted matrices against 98-100 % with four nights (BENCHMARKS.md). The gate
    calls this each night, so the stored class (the page, ``changepoints --json``) firms
    up as the nights arrive; the alert already sent keeps the first reading."""
    done = 0
    since = datetime.now(UTC) - REREAD_FOR
    for c in store.get_confirmations(dag_id, states=REREAD_STATES):
        created = c.created_at
        if created is not None and created.replace(tzinfo=created.tzinfo or UTC) < since:
            continue  # a cell that stopped running would be re-read every night forever
        decision = c.decision or {}
        stale = [
            d for d in decision.values()
            if isinstance(d, dict) and ATTRIBUTION_KEY in d
            and d[ATTRIBUTION_KEY].get("nights_after", 0) < NIGHTS_AFTER
        ]  # fmt: skip
        if not stale:
            continue
        fresh = {k: dict(v) for k, v in decision.items()}
        attach_attribution(store, c, fresh, reproduced=c.state != NOT_REPRODUCED)
        if fresh != decision:
            store.save_confirmation(dag_id, id=c.id, decision=fresh)
            done += 1
    return done
