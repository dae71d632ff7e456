"""plan: expand the suite for this run, refuse it over budget, record every cell planned or
excluded (the first task of a run); where each cell's tasks find what plan decided.

Cell references, not cells, travel through Airflow. A mapped task instance resolves its
mapped argument by fetching the whole list it is mapped over from the Execution API and
taking its own item (Task SDK ``DictOfListsExpandInput.resolve``). Mapping over the
expanded cells (workload, machine, checks: ~1-2 KB each) made every task start fetch, and
the api-server serve, the whole plan: N cells x 6 tasks x N KB per run, 200 KB per task at
256 cells. The DAG maps over ``cell_refs`` (id, index, machine: ~60 bytes each) instead;
plan writes the expanded cells to the results store once (``cell_specs``) and each task
reads its own (``cell_spec``) in one keyed SELECT.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix.cell_state import CellState, RunState
from accelmatrix.history.retests.followup import refused_by_plan
from accelmatrix.pricing import BudgetExceeded, check_budget, hourly_price
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.followup_plan import (
    FOLLOWUP_KEY,
    compare_followup,
    expand_followup,
    followup_of,
)
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.steps.common import RunRef, utcnow

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def plan_run(
    suite_path: str,
    ref: RunRef,
    params: dict[str, Any],
    *,
    logical_date: datetime | None = None,
    run_type: str | None = None,
    conf: dict[str, Any] | None = None,
) -> list[CellSpec]:
    """Expand the suite for this run, log the plan, record every cell as planned/excluded.

    A run whose ``conf`` holds ``accelmatrix_followup`` is a re-test of named builds
    (``spec.followup``): its plan is one session cell per suspect cell (every build on one
    machine, interleaved), and it is recorded with run type ``confirm``, ``bisect`` or
    ``compare`` (never a point of the perf series).
    """

    suite = load_suite(suite_path)
    user_params = {k: v for k, v in params.items() if k in suite.params}
    # What this run was asked for and what it runs with: a backfill from Airflow's form sends
    # no conf unless "Override parameters" is ticked, and then every param is its default.
    log.info("run conf: %s; params in effect: %s", params_text(conf), params_text(user_params))
    only = params.get("cells") or None
    if only == ["*"]:
        only = None
    try:
        followup = followup_of(conf) or followup_of(params)
        if followup is None:  # "compare any two builds": base and head, one machine a cell
            followup = compare_followup(
                suite, ref.dag_id, conf, params=user_params, logical_date=logical_date
            )
        if followup is not None:
            log.info(
                "%s session %d of re-test %s: builds %s, %d sample(s) each, interleaved on "
                "one machine per cell: %s",
                followup.kind,
                followup.round,
                followup.confirmation or "(on demand)",
                ", ".join(followup.builds),
                followup.pairs,
                ", ".join(followup.cells),
            )
            plan = expand_followup(
                suite, ref.dag_id, followup, params=user_params, logical_date=logical_date
            )
            run_type = followup.kind
            params = {**params, FOLLOWUP_KEY: followup.model_dump()}
        else:
            plan = expand(
                suite,
                ref.dag_id,
                params=user_params,
                only=only,
                logical_date=logical_date,
                runtime_version=_build_of(suite, conf, params),
            )
    except PlanError as e:  # e.g. a `cells` glob that selects nothing: the run is refused
        raise _refuse(str(e)) from None
    for line in plan.table().splitlines():  # one record per line: readable in the task log
        log.info("%s", line)
    if not plan.cells:
        # A run that tests nothing must never be green (nor become the suite's latest run).
        raise _refuse(
            f"no cell to run: all {len(plan.excluded)} cell(s) of {ref.dag_id} are excluded "
            "with these params (the plan above says why)"
        )
    if plan.runtime_version:
        log.info("runtime version under test: %s", plan.runtime_version)

    for machine in sorted({c.machine for c in plan.cells}):
        # A price_key missing from include/pricing.yaml fails here, not as a cost of 0.
        log.info(
            "machine %s: %.4f per hour", machine, hourly_price(suite.machines[machine].model_dump())
        )

    run_fields = {
        "suite": ref.dag_id,
        "logical_date": logical_date,
        "run_type": run_type,
        "params": params,
        "git_ref": str(params["git_ref"])[:250] if params.get("git_ref") else None,
        "runtime_version": plan.runtime_version,
        "started_at": utcnow(),
    }
    store = results_store()
    if suite.budget is not None or (followup is not None and followup.max_usd is not None):
        try:
            _check_budget(suite, plan, params, ref, run_fields, followup)
        except PlanRejected as e:
            if followup is not None:
                refused_by_plan(store, ref.dag_id, ref.run_id, followup, str(e))
            raise
    # A re-run of this run (cleared, or a backfill re-processing its logical date under the
    # same run_id) replaces the previous attempt's cells, metrics and verdicts.
    removed = store.reset_run(ref.dag_id, ref.run_id)
    if removed:
        log.info("re-run: replaced %d row(s) of the previous attempt of this run", removed)
    store.upsert_run(ref.dag_id, ref.run_id, state=RunState.RUNNING, finished_at=None, **run_fields)
    for cell in plan.cells:
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            cell.id,
            cell_index=cell.index,
            axes=cell.axes,
            machine=cell.machine,
            backend=cell.backend,
            quarantined=cell.quarantined,
            state=CellState.PLANNED,
        )
    store.put_cell_specs(ref.dag_id, ref.run_id, {c.id: c.to_json() for c in plan.cells})
    for ex in plan.excluded:
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            ex.id,
            axes=ex.axes,
            state=CellState.EXCLUDED,
            excluded_reason=ex.reason,
        )
    return plan.cells


# A build named in a run's conf (`{"build": "nightly-2026-03-04"}`): what a re-test of one
# build, or a person, asks for. It replaces the suite's runtime_version for the whole run.
BUILD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+@/-]{0,249}$")


def _build_of(suite: Any, conf: dict[str, Any] | None, params: dict[str, Any]) -> str | None:
    """The build the run's conf names, checked; None when it names none."""

    build = (conf or {}).get("build") or params.get("build")
    if build is None:
        return None
    if not isinstance(build, str) or not BUILD_RE.match(build):
        raise PlanError(
            f"conf build: {build!r} is not a build name (letters, digits and _.:+@/-, at most "
            "250 characters)"
        )
    if suite.runtime_version is None:
        raise PlanError(
            "conf build: this suite names no build under test (no runtime_version), so a run "
            "cannot be told to test one"
        )
    return build


def _check_budget(
    suite, plan, params, ref: RunRef, run_fields: dict[str, Any], followup: Any = None
) -> None:
    """Fail the plan, recording the run as over budget, when the estimate is too high. A
    follow-up run is also held to ``history.confirm.max_usd`` (the lower limit wins)."""

    budget = suite.budget
    limit, source, expected = math.inf, "", None
    if budget is not None:
        limit, source = budget.max_usd, "budget.max_usd of the suite"
        if budget.param and params.get(budget.param) is not None:
            limit, source = float(params[budget.param]), f"param {budget.param}"
        expected = budget.expected_seconds
    if followup is not None and expected is not None:
        # A session cell runs every build's samples on its one machine.
        expected *= len(followup.builds) * followup.pairs
    if followup is not None and followup.max_usd is not None and followup.max_usd < limit:
        limit, source = followup.max_usd, "history.confirm.max_usd of the suite"
    try:
        estimate = check_budget(
            plan.cells,
            max_usd=limit,
            expected_seconds=expected,
            source=source,
        )
    except BudgetExceeded as e:
        results_store().upsert_run(
            ref.dag_id, ref.run_id, state=RunState.OVER_BUDGET, finished_at=utcnow(), **run_fields
        )
        raise PlanRejected(str(e)) from None
    log.info("estimated cost %.4f USD within the budget of %.2f USD (%s)", estimate, limit, source)


class PlanRejected(AirflowFailException):
    """The run must not start (over budget, nothing selected): deterministic, never retried."""


def _refuse(message: str) -> PlanRejected:
    """The plan's refusal, logged line by line (the task log's last words) and raised."""
    for line in message.splitlines():
        log.error("%s", line)
    return PlanRejected(message)


def params_text(values: dict[str, Any] | None, limit: int = 600) -> str:
    """``{"a": 1}`` as one short log line: sorted keys, JSON, clipped."""
    import json

    text = json.dumps(values or {}, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
