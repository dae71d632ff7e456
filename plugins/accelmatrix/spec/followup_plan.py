"""A follow-up run: the suite re-testing named builds on its suspect cells, one machine per
cell (``accelmatrix.history.retests.followup`` starts them; this module plans them).

A follow-up run is an ordinary run of the suite's DAG whose ``conf`` carries the block
``accelmatrix_followup``. Its plan holds **one cell per suspect cell**: one machine,
provisioned once and torn down once, on which every build of the re-test is set up once
and run ``pairs`` times, interleaved in palindromes (A B B A, or G X Y S S Y X G for a
bisect of four builds). In a palindrome every build's mean position is the same, so a
machine that drifts (warms up, throttles, gets a noisy neighbour) hits every build alike;
and each sample sits next to a sample of the first build, so the machine's own speed
cancels in their ratio (``history.retests.compare``). Before this design every sample was a cell
with a machine of its own: 22x the samples' time, and machine-to-machine variance (2-4 %
on real fleets) mixed into a 2-5 % question.

The session's workload is ``backends/interleave.py``, run by the machine's own Python: it
runs each build's workload (the suite's, rendered with that build as
``${run.runtime_version}``) in the recorded order between marker lines. The cell id names
the re-test and its round (``model=small,retest=2``); its axis ``builds`` lists the builds.
Each build's setup commands run once, in build order, duplicates dropped.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError

from accelmatrix.backends import interleave
from accelmatrix.metrics.source_models import ProfilerTraceSource
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.plan import Plan, PlanError, expand
from accelmatrix.spec.suite import Suite
from accelmatrix.spec.suite_parts import Model

__all__ = [
    "COMPARE_KEY",
    "FOLLOWUP_KEY",
    "CompareRequest",
    "MAX_SESSION_BUILDS",
    "PROFILES_DIR",
    "Followup",
    "base_cell",
    "compare_followup",
    "expand_followup",
    "followup_of",
    "session_cell_id",
    "session_order",
]

FOLLOWUP_KEY = "accelmatrix_followup"
# The conf block that asks for a comparison of two builds (REST, the CLI, the page).
COMPARE_KEY = "accelmatrix_compare"
# The most builds one session tests: a bisect range up to this long is searched in one
# session; a longer one is narrowed a session at a time (history.retests.followup).
MAX_SESSION_BUILDS = 8
# The most samples one session runs (all builds together): its workload timeout is the
# suite's times this, so a cap keeps a runaway plan from holding a machine for days.
MAX_SESSION_SAMPLES = 512
_RETEST = ",retest="
# Where a session keeps each build's profiler traces (backends/interleave.py), relative to
# the work dir and so to the session cell's collected files. How many samples' worth is the
# suite's profiler_trace metric's ``profiled_samples``.
PROFILES_DIR = "out/accelmatrix-profiles"
PROFILES_PER_BUILD = 1
_M = TypeVar("_M", bound=Model)
# The checks a session cell keeps: those that judge each sample alike (its exit, its log).
# A perf bound or a step count over the whole session would judge every build's samples
# together; the re-test's own verdict (history.retests.compare) is what judges the builds.
SESSION_CHECKS = frozenset({"exit_status", "log_contains", "log_not_contains"})


class Followup(Model):
    """The ``accelmatrix_followup`` block of a follow-up run's conf."""

    kind: Literal["confirm", "bisect", "compare"]
    # results.schema.confirmations.id; None for a comparison asked for on demand.
    confirmation: Annotated[int, Field(ge=1)] | None = None
    round: Annotated[int, Field(ge=1)]
    cells: Annotated[list[str], Field(min_length=1, max_length=64)]
    # The first is the reference (the last good build, or a compare's base).
    builds: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=250)]],
        Field(min_length=2, max_length=MAX_SESSION_BUILDS),
    ]
    # Samples of each build in this session (each one paired with a sample of builds[0]).
    pairs: Annotated[int, Field(ge=1, le=200)]
    max_usd: Annotated[float, Field(ge=0)] | None = None


def followup_of(conf: dict[str, Any] | None) -> Followup | None:
    """The follow-up block of a run's conf (or params), validated; None for an ordinary run.
    A malformed block is a PlanError naming the field."""
    raw = (conf or {}).get(FOLLOWUP_KEY)
    if raw is None:
        return None
    fu = _block(Followup, raw, FOLLOWUP_KEY)
    if len(set(fu.builds)) != len(fu.builds):
        raise PlanError(f"conf {FOLLOWUP_KEY}.builds: a build is listed twice: {fu.builds}")
    return fu


class CompareRequest(Model):
    """The ``accelmatrix_compare`` block of a run's conf: "is build ``head`` slower than
    build ``base`` on these cells?", answered by one session per cell (both builds on one
    machine, interleaved) and ``history.retests.build_compare``."""

    base: Annotated[str, Field(min_length=1, max_length=250)]
    head: Annotated[str, Field(min_length=1, max_length=250)]
    cells: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = ["*"]
    # 8: the fewest pairs whose two-sided exact Wilcoxon p can reach the compare's 0.01
    # (history.retests.compare.MIN_PAIRS_TWO_SIDED); at 7 the answer could never be DIFFERENT.
    pairs: Annotated[int, Field(ge=8, le=200)] = 10


def compare_followup(
    suite: Suite,
    suite_id: str,
    conf: dict[str, Any] | None,
    *,
    params: dict[str, Any] | None = None,
    logical_date: datetime | None = None,
) -> Followup | None:
    """The session a conf's ``accelmatrix_compare`` block asks for (its cell globs matched
    against the suite's cells like the ``cells`` param); None when there is no block. A
    malformed block, equal builds or globs that select nothing are a PlanError naming the
    field and what is allowed."""
    raw = (conf or {}).get(COMPARE_KEY)
    if raw is None:
        return None
    req = _block(CompareRequest, raw, COMPARE_KEY)
    if req.base == req.head:
        raise PlanError(f"conf {COMPARE_KEY}: base and head are the same build ({req.base!r})")
    plan = expand(
        suite,
        suite_id,
        params=params,
        only=req.cells,
        logical_date=logical_date,
        runtime_version=req.base,
    )
    cells = [c.id for c in plan.cells]
    if not cells:
        raise PlanError(f"conf {COMPARE_KEY}.cells: {req.cells} selects no cell of {suite_id}")
    if len(cells) > 64:
        raise PlanError(
            f"conf {COMPARE_KEY}.cells: {len(cells)} cells selected; a comparison takes at most "
            "64 (one machine each): narrow the globs"
        )
    return Followup(
        kind="compare", round=1, cells=cells, builds=[req.base, req.head], pairs=req.pairs
    )


def _block(model: type[_M], raw: Any, key: str) -> _M:
    """A conf block validated as ``model``; a PlanError naming its first wrong field."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise PlanError(f"conf {key}.{where}: {first['msg']}") from None


def session_order(n_builds: int, pairs: int) -> list[int]:
    """The order of a session's samples, as build indexes: palindromes (0 1 .. n-1 n-1 .. 1
    0), cut after ``pairs`` samples of each build (an odd count ends with a forward half)."""
    forward = list(range(n_builds))
    order: list[int] = []
    for half in range(pairs):
        order += forward if half % 2 == 0 else forward[::-1]
    return order


def expand_followup(
    suite: Suite,
    suite_id: str,
    followup: Followup,
    *,
    params: dict[str, Any] | None = None,
    logical_date: datetime | None = None,
) -> Plan:
    """The follow-up run's plan: one session cell per suspect cell. Every listed cell must
    be a cell of the suite that runs with these params (a cell id is matched exactly, never
    as a glob), on a machine that is the same for every build."""
    per_build: dict[str, dict[str, CellSpec]] = {}
    for build in followup.builds:
        plan = expand(
            suite, suite_id, params=params, logical_date=logical_date, runtime_version=build
        )
        per_build[build] = {c.id: c for c in plan.cells}
    first = per_build[followup.builds[0]]
    if missing := [c for c in followup.cells if c not in first]:
        raise PlanError(
            f"conf {FOLLOWUP_KEY}.cells: {', '.join(missing)} is not a cell of {suite_id} that "
            f"runs with these params; cells that run: {', '.join(sorted(first)) or 'none'}"
        )
    order = session_order(len(followup.builds), followup.pairs)
    if len(order) > MAX_SESSION_SAMPLES:
        raise PlanError(
            f"conf {FOLLOWUP_KEY}: {len(order)} samples in one session "
            f"({len(followup.builds)} builds x {followup.pairs}); at most {MAX_SESSION_SAMPLES}"
        )
    out = Plan(suite_id=suite_id, runtime_version=followup.builds[-1])
    for cid in followup.cells:
        cells = [per_build[b][cid] for b in followup.builds]
        out.cells.append(_session_cell(cells, followup, order, len(out.cells)))
    return out


def _session_cell(
    cells: list[CellSpec], followup: Followup, order: list[int], index: int
) -> CellSpec:
    """One suspect cell's session: the first build's cell, running the interleave driver
    over every build's rendered workload."""
    base = cells[0]
    for c, build in zip(cells[1:], followup.builds[1:], strict=True):
        if c.machine_json != base.machine_json:
            raise PlanError(
                f"conf {FOLLOWUP_KEY}: cell {base.id} names another machine for build "
                f"{build!r} than for {followup.builds[0]!r}: a re-test runs every build on one "
                "machine (a build that is a machine image cannot share one; compare such "
                "builds with two ordinary runs)"
            )
    runs = []
    for c, build in zip(cells, followup.builds, strict=True):
        env = {k: v for k, v in c.workload.env.items() if base.workload.env.get(k) != v}
        runs.append({"build": build, "argv": c.workload.run, "env": env})
    doc: dict[str, Any] = {"order": order, "runs": runs}
    traces = [m for m in base.workload.metrics if isinstance(m, ProfilerTraceSource)]
    artifacts = list(base.workload.artifacts)
    if traces:
        # The first profiled samples of each build (the metric's ``profiled_samples``,
        # interleaved like the timed ones) are kept for the culprit report's op-level diff
        # (history.culprits.culprit_profile); a later sample would overwrite them.
        per_build = traces[0].profiled_samples
        doc["keep"] = {"glob": traces[0].glob, "per_build": per_build, "into": PROFILES_DIR}
        artifacts.append(f"{PROFILES_DIR}/**")
    plan = json.dumps(doc, separators=(",", ":"))
    driver = Path(interleave.__file__).read_text(encoding="utf-8")
    setup: list[list[str]] = []
    for c in cells:
        setup += [cmd for cmd in c.workload.setup if cmd not in setup]
    workload = base.workload.model_copy(
        update={
            "run": ["${python}", "-c", driver, plan],
            "setup": setup,
            "artifacts": artifacts,
            # The machine is held for every sample: the limit is the suite's per sample.
            "timeout": base.workload.timeout * len(order),
        }
    )
    axes = {**base.axes, "retest": str(followup.round)}
    return base.model_copy(
        update={
            "id": session_cell_id(base.id, followup.round),
            "index": index,
            "axes": axes,
            "values": {**base.values, "retest": followup.round, "builds": followup.builds},
            "workload": workload,
            "checks": [c for c in base.checks if c.type in SESSION_CHECKS],
        }
    )


def session_cell_id(cell_id: str, round_: int) -> str:
    """The id of suite cell ``cell_id``'s session cell in session ``round_``."""
    return f"{cell_id}{_RETEST}{round_}"


def base_cell(cell_id: str) -> str:
    """The suite's cell id of a session cell id (``model=small,retest=2`` -> ``model=small``);
    other ids as they are."""
    head, sep, tail = cell_id.rpartition(_RETEST)
    return head if sep and tail.isdigit() else cell_id
