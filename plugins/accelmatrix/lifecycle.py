"""The steps of one cell, as plain functions: plan, provision, setup, collect, evaluate,
teardown, gate.

The DAG wraps each in a thin TaskFlow task; keeping the logic here means it reads top to
bottom without Airflow in the way and can be exercised directly. Every step records what
it did in the results store, keyed by (dag_id, run_id, cell_id), so a retry or a clear
overwrites its own row instead of adding one.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix import settings
from accelmatrix.backends.base import CellContext, get_backend
from accelmatrix.cell_state import EARLIER_FAILURES, NEVER_RAN, CellState, RunState
from accelmatrix.spec.templating import render_tree

# The per-process store lives in accelmatrix.store_access; the name stays importable here.
from accelmatrix.store_access import results_store  # noqa: F401

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class RunRef:
    """Which DAG run a step belongs to."""

    dag_id: str
    run_id: str
    # The mapped task group and map index of the asking task: resources carry them as
    # labels so the janitor can ask Airflow whether the cell's tasks still run.
    task_group: str | None = None
    map_index: int | None = None

    def artifacts(self, cell_id: str) -> Path:
        return settings.cell_artifacts_dir(self.dag_id, self.run_id, cell_id)

    @classmethod
    def from_context(cls, context: Any) -> RunRef:
        """The run of an Airflow task context."""
        ti = context.get("ti") if hasattr(context, "get") else None
        map_index = getattr(ti, "map_index", None)
        task_id = str(getattr(ti, "task_id", "") or "")
        mapped = isinstance(map_index, int) and map_index >= 0 and "." in task_id
        return cls(
            dag_id=context["dag"].dag_id,
            run_id=context["run_id"],
            task_group=task_id.rsplit(".", 1)[0] if mapped else None,
            map_index=map_index if mapped else None,
        )


# The cell state groups (EARLIER_FAILURES, NEVER_RAN) live in accelmatrix.cell_state, the
# one list of states; the names are kept here for callers of lifecycle.


class CellFailed(AirflowFailException):
    """A cell (or the run) failed its checks: deterministic, so Airflow must not retry."""


# -- plan ---------------------------------------------------------------------------------
def plan_run(
    suite_path: str,
    ref: RunRef,
    params: dict[str, Any],
    *,
    logical_date: datetime | None = None,
    run_type: str | None = None,
) -> list[dict[str, Any]]:
    """Expand the suite for this run, log the plan, record every cell as planned/excluded."""
    from accelmatrix.spec.loader import load_suite
    from accelmatrix.spec.plan import expand

    suite = load_suite(suite_path)
    user_params = {k: v for k, v in params.items() if k in suite.params}
    only = params.get("cells") or None
    if only == ["*"]:
        only = None
    plan = expand(suite, ref.dag_id, params=user_params, only=only, logical_date=logical_date)
    for line in plan.table().splitlines():  # one record per line: readable in the task log
        log.info("%s", line)
    if plan.runtime_version:
        log.info("runtime version under test: %s", plan.runtime_version)
    from accelmatrix.pricing import hourly_price

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
    if suite.budget is not None:
        _check_budget(suite, plan, params, ref, run_fields)
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
    for ex in plan.excluded:
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            ex.id,
            axes=ex.axes,
            state=CellState.EXCLUDED,
            excluded_reason=ex.reason,
        )
    return [c.to_dict() for c in plan.cells]


def _check_budget(suite, plan, params, ref: RunRef, run_fields: dict[str, Any]) -> None:
    """Fail the plan, recording the run as over budget, when the estimate is too high."""
    from accelmatrix.pricing import BudgetExceeded, check_budget

    budget = suite.budget
    limit, source = budget.max_usd, "budget.max_usd of the suite"
    if budget.param and params.get(budget.param) is not None:
        limit, source = float(params[budget.param]), f"param {budget.param}"
    try:
        estimate = check_budget(
            [c.to_dict() for c in plan.cells],
            max_usd=limit,
            expected_seconds=budget.expected_seconds,
            source=source,
        )
    except BudgetExceeded as e:
        results_store().upsert_run(
            ref.dag_id, ref.run_id, state=RunState.OVER_BUDGET, finished_at=utcnow(), **run_fields
        )
        raise PlanRejected(str(e)) from None
    log.info("estimated cost %.4f USD within the budget of %.2f USD (%s)", estimate, limit, source)


class PlanRejected(AirflowFailException):
    """The run must not start (over budget): deterministic, never retried."""


# -- provision / setup --------------------------------------------------------------------
def _cell_context(cell: dict[str, Any], ref: RunRef) -> CellContext:
    return CellContext(
        dag_id=ref.dag_id,
        run_id=ref.run_id,
        cell_id=cell["id"],
        artifacts_dir=ref.artifacts(cell["id"]),
        labels=owner_labels(ref),
    )


def owner_labels(ref: RunRef) -> dict[str, str]:
    """Labels naming the task instances that own a cell's resource (read by the janitor)."""
    from accelmatrix.airflow_state import OWNER_GROUP_LABEL, OWNER_INDEX_LABEL

    if ref.task_group is None or ref.map_index is None:
        return {}
    return {OWNER_GROUP_LABEL: ref.task_group, OWNER_INDEX_LABEL: str(ref.map_index)}


def begin_provision(cell: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    """Start provisioning: the resource, or a pending record to wait on (see ProvisionOperator)."""
    store = results_store()
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        state=CellState.PROVISIONING,
        provision_started_at=utcnow(),
    )
    backend = get_backend(cell["machine_spec"])
    try:
        record = backend.begin_provision(_cell_context(cell, ref))
    except Exception as e:
        record_provision_failure(ref.dag_id, ref.run_id, cell["id"], str(e))
        raise
    if record.get("pending"):
        return record
    return _provisioned(cell, ref, backend.kind, record)


def finish_provision(cell: dict[str, Any], ref: RunRef, pending: dict[str, Any]) -> dict[str, Any]:
    backend = get_backend(cell["machine_spec"])
    try:
        resource = backend.finish_provision(pending)
    except Exception as e:
        record_provision_failure(ref.dag_id, ref.run_id, cell["id"], str(e))
        raise
    return _provisioned(cell, ref, backend.kind, resource)


def provision_failed(cell: dict[str, Any], ref: RunRef, pending: dict[str, Any], reason: str):
    """Clean up after a provisioning that will never finish (idempotent), record why."""
    try:
        get_backend(cell["machine_spec"]).abandon_provision(pending, reason)
    finally:
        record_provision_failure(ref.dag_id, ref.run_id, cell["id"], reason)


def record_provision_failure(dag_id: str, run_id: str, cell_id: str, reason: str) -> None:
    """The cell's machine could not be provisioned: an infrastructure failure (idempotent).

    Called by the provision task and by ProvisionTrigger (whose resumed task may never run
    in 3.3.2); either way the line lands in the provision task's log.
    """
    # On-call's line: a bare traceback (FileExistsError, an API error) does not say that
    # this is an infrastructure failure of this cell.
    log.error(
        "provision failed for cell %s (an infrastructure failure, not a test failure): %s",
        cell_id,
        reason,
    )
    results_store().upsert_cell(
        dag_id, run_id, cell_id, state=CellState.INFRA_FAILED, message=f"provision failed: {reason}"
    )


def _provisioned(
    cell: dict[str, Any], ref: RunRef, kind: str, resource: dict[str, Any]
) -> dict[str, Any]:
    results_store().upsert_cell(
        ref.dag_id, ref.run_id, cell["id"], state=CellState.PROVISIONED, provisioned_at=utcnow()
    )
    log.info("provisioned %s resource %s", kind, resource["name"])
    return resource


def setup(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> None:
    from accelmatrix.backends.base import InfrastructureError, SetupFailed

    wl = cell["workload"]
    store = results_store()
    if not wl["setup"] and not wl.get("services"):
        log.info("no setup commands")
        store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state=CellState.SETUP)
        return
    backend = get_backend(cell["machine_spec"])
    variables = backend.variables(resource)
    store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state=CellState.SETUP)
    try:
        backend.setup(
            resource,
            render_tree(wl["setup"], variables),
            workload_env(cell, resource, variables),
            wl["setup_timeout"],
            lambda line: log.info("%s", line),
        )
        if wl.get("services"):
            backend.start_services(
                resource,
                render_tree(wl["services"], variables),
                workload_env(cell, resource, variables),
                lambda line: log.info("%s", line),
            )
    except SetupFailed as e:
        store.upsert_cell(
            ref.dag_id, ref.run_id, cell["id"], state=CellState.SETUP_FAILED, message=str(e)
        )
        raise
    except InfrastructureError as e:  # the machine failed during setup, not the commands
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            cell["id"],
            state=CellState.INFRA_FAILED,
            message=f"infrastructure failure during setup: {e}",
        )
        raise


def workload_env(
    cell: dict[str, Any], resource: dict[str, Any], variables: dict[str, str]
) -> dict[str, str]:
    """The suite's env plus what every workload may rely on (cell id, axis values)."""
    env = dict(render_tree(cell["workload"]["env"], variables))
    env["ACCELMATRIX_CELL_ID"] = cell["id"]
    # What the cell's machine declares, so a workload can compare it with what it sees.
    env["ACCELMATRIX_MACHINE"] = cell["machine"]
    env["ACCELMATRIX_MACHINE_RESOURCES"] = json.dumps(cell["machine_spec"].get("resources") or {})
    for axis, label in cell["axes"].items():
        env[f"ACCELMATRIX_AXIS_{axis.upper()}"] = label
    return env


def record_run_outcome(
    cell: dict[str, Any], ref: RunRef, event: dict[str, Any], handle: dict[str, Any]
) -> tuple[str, str]:
    """Turn a WorkloadTrigger event into the cell's run state; kill what must be killed.

    Idempotent: called by the trigger before it fires and again by the resumed task.
    """
    status = event.get("status")
    exit_code = event.get("exit_code")
    if status in ("timeout", "hung") and handle:
        get_backend(cell["machine_spec"]).cancel(handle)
    expected = next(
        (int(c.get("expected", 0)) for c in cell["checks"] if c.get("type") == "exit_status"), 0
    )
    if status == "timeout":
        state = CellState.TIMED_OUT
        msg = f"workload timed out after {cell['workload']['timeout']} s and was killed"
    elif status == "hung":
        state, msg = CellState.HUNG, f"workload {event.get('detail')}; it was killed"
    elif status == "infra_failed":
        state, msg = CellState.INFRA_FAILED, f"infrastructure failure: {event.get('detail')}"
    elif exit_code != expected:
        state = CellState.RUN_FAILED
        msg = f"workload exited with {exit_code}, expected {expected} ({event.get('detail')})"
    else:
        state, msg = CellState.RAN, f"workload exited {exit_code} as expected"
    store = results_store()
    row = store.get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    from accelmatrix.stopped import STOPPED

    if row.get("state") == STOPPED:
        # The run was stopped from outside and the teardown killed the workload before the
        # trigger heard of it: the exit it saw is the kill's, not the workload's verdict.
        log.warning(
            "%s: stays cancelled (%s); the exit seen was %s", cell["id"], row.get("message"), msg
        )
        return STOPPED, row.get("message") or msg
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        run_ended_at=utcnow(),
        exit_code=exit_code,
        state=state,
        message="" if state == CellState.RAN else msg,
    )
    return state, msg


# -- collect ------------------------------------------------------------------------------
class CollectFailed(AirflowFailException):
    """Metrics were read but could not all be kept (reserved name, duplicate): the suite or
    the workload must change, so Airflow must not retry."""


def collect(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    """Copy artifacts and turn the declared metric sources into long-form metric rows.

    A crash here must not leave the cell looking healthy: evaluate still runs after it (its
    trigger rule) and would judge whatever happened to be on disk. So any failure records
    the cell as ``collect_failed`` with the error, which record_evaluation keeps.
    """
    try:
        result, errors = _collect(cell, resource, ref)
    except Exception as e:
        record_collect_failure(cell, ref, f"{type(e).__name__}: {e}")
        raise
    if errors:
        message = "; ".join(errors)
        record_collect_failure(cell, ref, message)
        raise CollectFailed(f"cell {cell['id']}: collect failed: {message}"[:4000])
    prior = results_store().get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    if (
        prior.get("state") == CellState.COLLECT_FAILED
    ):  # an earlier attempt crashed, this one worked
        results_store().upsert_cell(
            ref.dag_id, ref.run_id, cell["id"], state=CellState.COLLECTED, message=""
        )
    return result


def record_collect_failure(cell: dict[str, Any], ref: RunRef, error: str) -> None:
    """State ``collect_failed``, message "collect failed: <error>"; a more specific earlier
    failure (a timeout, a failed setup) keeps its state and gets the error appended."""
    _record_step_failure(cell, ref, CellState.COLLECT_FAILED, f"collect failed: {error}")


def _record_step_failure(cell: dict[str, Any], ref: RunRef, state: str, message: str) -> None:
    log.error("cell %s: %s", cell["id"], message)
    store = results_store()
    prior = store.get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    if prior.get("state") in EARLIER_FAILURES and prior.get("state") != state:
        state = prior["state"]
        if prior.get("message"):
            message = f"{prior['message']}; {message}"
    store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state=state, message=message[:4000])


def _collect(
    cell: dict[str, Any], resource: dict[str, Any], ref: RunRef
) -> tuple[dict[str, Any], list[str]]:
    from pydantic import TypeAdapter

    from accelmatrix.metrics.sources import MetricSource, collect_metrics, write_train_metrics

    backend = get_backend(cell["machine_spec"])
    resource = backend.refresh(resource)  # a retried run may have replaced the machine
    art = ref.artifacts(cell["id"])
    files_dir = art / "files"
    variables = backend.variables(resource)
    globs = []
    for g in render_tree(cell["workload"]["artifacts"], variables):
        # A param or axis value may have turned a safe glob into one that escapes the work
        # dir: the suite model only saw the template.
        if g.startswith("/") or ".." in re.split(r"[/\\]", g):
            log.warning("artifact glob %r escapes the work dir: not collected", g)
            continue
        globs.append(g)
    copied = backend.collect(resource, globs, files_dir)
    log.info("collected %d artifact(s) into %s", len(copied), files_dir)
    for rel in copied[:50]:
        log.info("  %s", rel)

    adapter = TypeAdapter(MetricSource)
    sources = [adapter.validate_python(s) for s in cell["workload"]["metrics"]]
    from accelmatrix.metrics.resources import FILE, resource_rows

    # The runner's samples (namespace runner.) go through the same duplicate check.
    collected = collect_metrics(
        sources,
        files_dir=files_dir,
        log_path=art / "output.log",
        extra_rows=resource_rows(art / FILE),
    )
    for d in collected.diagnostics:
        log.warning("metrics: %s", d)
    (art / "metrics.json").write_text(json.dumps(collected.rows, default=_json_default))
    write_train_metrics(
        collected.rows, art / "train_metrics.json", extra={"cell": cell["id"], **cell["axes"]}
    )
    store = results_store()
    store.replace_metrics(ref.dag_id, ref.run_id, cell["id"], collected.rows)
    log.info("stored %d metric value(s)", len(collected.rows))
    return {
        "artifacts": len(copied),
        "metrics": len(collected.rows),
        "diagnostics": collected.diagnostics,
        "errors": collected.errors,
    }, collected.errors


def _json_default(o: Any) -> Any:
    return str(o)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- evaluate -----------------------------------------------------------------------------
_EVAL_LOCK = threading.Lock()


def run_checks(cell: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    """Evaluate the cell's outputs with Great Expectations; return a JSON-able result.

    Pure with respect to the results store, so it can run wherever Great Expectations is
    already warm (the triggerer, see EvaluationTrigger). Serialised by a lock: GE contexts
    are not documented as thread-safe.
    """
    from pydantic import TypeAdapter

    from accelmatrix.evaluation import CellOutputs, evaluate_cell
    from accelmatrix.spec.checks import Check

    art = ref.artifacts(cell["id"])
    status = _read_json(art / "status.json")
    metrics = _read_json(art / "metrics.json") or []
    adapter = TypeAdapter(Check)
    checks = [adapter.validate_python(c) for c in cell["checks"]]
    with _EVAL_LOCK:
        report = evaluate_cell(
            checks,
            CellOutputs(
                files_dir=art / "files",
                log_path=art / "output.log",
                status=status,
                metrics=metrics,
            ),
            include_dir=settings.include_dir(),
            data_docs_dir=art / "data_docs",
            suite_name=f"{ref.dag_id}.{cell['id']}",
        )
    return {
        "passed": report.passed,
        "table": report.format_table(),
        "seconds": report.seconds,
        "data_docs": str(report.data_docs_index) if report.data_docs_index else None,
        "verdicts": [
            {
                "check_name": v.name,
                "check_type": v.type,
                "passed": v.passed,
                "expected": v.expected,
                "observed": v.observed,
                "message": v.message,
                **(v.perf or {}),
            }
            for v in report.verdicts
        ],
        "warnings": [f"{v.name}: {v.message}" for v in report.verdicts if v.warning],
    }


def record_evaluation(cell: dict[str, Any], ref: RunRef, result: dict[str, Any]) -> dict[str, Any]:
    """Store the verdicts and the cell's final state; raise CellFailed unless it passed."""
    store = results_store()
    store.replace_checks(ref.dag_id, ref.run_id, cell["id"], result["verdicts"])
    failed = [v for v in result["verdicts"] if not v["passed"]]
    prior = store.get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    # A specific earlier failure (setup, timeout, infrastructure) says more than "failed".
    earlier = prior.get("state") if prior.get("state") in EARLIER_FAILURES else None
    if prior.get("state") in NEVER_RAN:
        # Its machine never got to run the workload (Airflow failed or skipped the provision
        # or setup task without a word to the store): an infrastructure failure, not checks
        # failing on outputs that never existed.
        earlier = CellState.INFRA_FAILED
        prior = {
            "message": f"the workload never ran: the cell stopped at {prior['state']!r} "
            "(its provision or setup task did not finish)"
        }
    if result["passed"] and earlier is None:
        state = CellState.PASSED
    else:
        state = earlier or CellState.FAILED
    message = "; ".join(f"{v['check_name']}: {v['message']}" for v in failed)[:2000]
    for w in result.get("warnings") or []:
        log.warning("cell %s: %s", cell["id"], w)
    if state == CellState.PASSED and result.get("warnings"):
        message = "; ".join(result["warnings"])[:2000]  # passed, with warnings
    if earlier and prior.get("message"):
        message = f"{prior['message']}; {message}"
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        state=state,
        message=message,
        data_docs=result["data_docs"],
    )
    if state != CellState.PASSED:
        raise CellFailed(
            f"cell {cell['id']} {state}: {len(failed)} of {len(result['verdicts'])} check(s) "
            "failed" + (": " + ", ".join(v["check_name"] for v in failed) if failed else "")
        )
    return {"cell": cell["id"], "state": state}


def record_evaluation_error(cell: dict[str, Any], ref: RunRef, error: str) -> None:
    """The checks could not run (Great Expectations crashed, the trigger failed): the cell
    gets ``evaluation_failed`` and "evaluation could not run: <error>", never a stale state
    that could pass. Called by the evaluate task and trigger; idempotent."""
    _record_step_failure(
        cell, ref, CellState.EVALUATION_FAILED, f"evaluation could not run: {error}"
    )


# -- teardown -----------------------------------------------------------------------------
def teardown(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    backend = get_backend(cell["machine_spec"])
    # Before the machine goes: a trigger still watching a cut-short workload would otherwise
    # see the teardown's kill as the workload's exit and record it as a failure.
    _settle_cut_short(cell, ref, resource)
    backend.teardown(resource)
    ended = time.time()
    held = ended - float(resource["created_at"])
    status = _read_json(ref.artifacts(cell["id"]) / "status.json") or {}
    workload = None
    if status.get("started_at") and status.get("ended_at"):
        workload = status["ended_at"] - status["started_at"]
    from accelmatrix.pricing import PricingError, hourly_price

    try:
        cost = held / 3600.0 * hourly_price(cell["machine_spec"])
    except PricingError as e:  # checked at plan time; teardown must not fail over a price
        log.warning("no cost recorded: %s", e)
        cost = None
    results_store().upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        teardown_at=utcnow(),
        resource_held_seconds=held,
        workload_seconds=workload,
        cost=cost,
    )
    log.info(
        "tore down %s; resource held %.1f s, workload ran %s s",
        resource["name"],
        held,
        f"{workload:.1f}" if workload is not None else "-",
    )
    return {"held_seconds": held, "workload_seconds": workload}


def _settle_cut_short(cell: dict[str, Any], ref: RunRef, resource: dict[str, Any]) -> None:
    """A cell whose work ended without an outcome (its run marked failed from outside, its
    worker killed) gets a verdict here, before its machine goes: see accelmatrix.stopped."""
    from accelmatrix import stopped

    row = results_store().get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    if row.get("state") not in stopped.IN_FLIGHT:
        return
    states = {}
    if ref.task_group is not None and ref.map_index is not None:
        states = stopped.owner_states(ref.dag_id, ref.run_id, ref.task_group, ref.map_index)
    message = (
        f"stopped before it finished ({stopped.describe(states)}; was {row['state']}); "
        f"machine {resource['name']} and its workload torn down by the cell's teardown"
    )
    if stopped.settle_cell(results_store(), ref.dag_id, ref.run_id, cell["id"], message):
        log.warning("cell %s: %s", cell["id"], message)


# -- gate ---------------------------------------------------------------------------------
def gate(
    planned: list[dict[str, Any]], ref: RunRef, suite_path: str | None = None
) -> dict[str, Any]:
    """Decide the run: it fails exactly when a non-quarantined cell did not pass.

    With ``suite_path``, the suite's ``notify`` settings are honoured (see notify.py).
    """
    store = results_store()
    stopped_cells = _settle_stopped_run(planned, ref)
    rows = {r["cell_id"]: r for r in store.get_cells(ref.dag_id, ref.run_id)}
    log.info(
        "results for %s %s:\n%s", ref.dag_id, ref.run_id, store.run_table(ref.dag_id, ref.run_id)
    )
    failed, quarantined_failed, passed = [], [], []
    for c in planned:
        state = (rows.get(c["id"]) or {}).get("state", "missing")
        if state == CellState.PASSED:
            passed.append(c["id"])
        elif c["quarantined"]:
            quarantined_failed.append((c["id"], state))
        else:
            failed.append((c["id"], state))
    summary = {
        "passed": passed,
        "failed": [f"{i} ({s})" for i, s in failed],
        "quarantined_failed": [f"{i} ({s})" for i, s in quarantined_failed],
    }
    store.upsert_run(
        ref.dag_id,
        ref.run_id,
        state=RunState.FAILED if failed else RunState.PASSED,
        finished_at=utcnow(),
    )
    from accelmatrix.report_html import write_run_index

    run_dir = (
        settings.artifacts_dir() / settings.safe_name(ref.dag_id) / settings.safe_name(ref.run_id)
    )
    index = write_run_index(
        run_dir,
        ref.dag_id,
        ref.run_id,
        list(rows.values()),
        store.get_checks(ref.dag_id, ref.run_id),
    )
    log.info("run report: %s", index)
    costs = [r["cost"] for r in rows.values() if r.get("cost") is not None]
    summary["cost"] = sum(costs) if costs else None
    if costs:
        log.info("run cost: %.6f (sum of %d cell(s))", summary["cost"], len(costs))
    if suite_path:
        # A cell a person stopped says nothing about the code under test: no alert for it.
        judged = [c for c in planned if c["id"] not in stopped_cells]
        _history_and_alerts(suite_path, judged, ref, rows)
        _notify(suite_path, planned, ref, failed, rows, summary["cost"])
    for cid, state in quarantined_failed:
        log.warning("quarantined cell %s did not pass (%s): not failing the run", cid, state)
    if failed:
        raise CellFailed(
            f"{len(failed)} cell(s) failed: " + ", ".join(f"{i} ({s})" for i, s in failed)
        )
    log.info("all %d non-quarantined cell(s) passed", len(planned) - len(quarantined_failed))
    return summary


def _settle_stopped_run(planned: list[dict[str, Any]], ref: RunRef) -> set[str]:
    """Give cells cut short a verdict and release whatever the run still holds; the ids of
    the cells stopped from outside (state ``cancelled``).

    The gate runs after every cell's teardown, also when a person marked the run failed
    (it is a teardown task). A cell still without a verdict here never got one: its tasks
    were skipped or killed.

    Then every resource of this run that no teardown deleted is torn down through the
    janitor (by the run's labels, on every machine the run used), whatever happened:
    Airflow skips a cell's teardown when its provision task failed, and Airflow 3.3.2 can
    fail a provision task after its machine exists (the defer/resume race). Listing is one
    call per machine kind; in a clean run it finds nothing.
    """
    from accelmatrix import stopped
    from accelmatrix.janitor import reap_run

    store = results_store()
    rows = {r["cell_id"]: r for r in store.get_cells(ref.dag_id, ref.run_id)}
    for c in planned:
        state = (rows.get(c["id"]) or {}).get("state")
        message = (
            f"stopped before it finished (was {state}); nothing of it was left running "
            "(it never got a machine, or its teardown released it)"
        )
        if stopped.settle_cell(store, ref.dag_id, ref.run_id, c["id"], message):
            log.warning("cell %s: %s", c["id"], message)
    cut = {
        r["cell_id"]
        for r in store.get_cells(ref.dag_id, ref.run_id)
        if r.get("state") == stopped.STOPPED
    }
    if cut:
        log.warning(
            "run %s was stopped from outside: %d cell(s) cancelled: %s",
            ref.run_id,
            len(cut),
            ", ".join(sorted(cut)),
        )
        reason = f"run {ref.run_id} was stopped from outside and its teardown left it"
    else:
        reason = f"run {ref.run_id} is over and no teardown deleted it"
    specs = {json.dumps(c["machine_spec"], sort_keys=True): c["machine_spec"] for c in planned}
    report = reap_run(
        ref.dag_id, ref.run_id, specs.values(), reason=reason, say=log.warning, store=store
    )
    if not report.decisions and not report.unreachable:
        log.info("run cleanup: no resource of this run is left on its %d machine(s)", len(specs))
    for key, err in report.unreachable.items():
        log.error("run cleanup: machine %s not checked: %s", key, err)
    return cut


def _regressions(suite: Any, ref: RunRef) -> dict[str, list[dict[str, Any]]]:
    """Classify the suite's perf series (series_status); the regressed ones by cell.

    A suite that never had a bounded perf verdict has no series: skipped without importing
    pandas (about a second at the very end of every run of a functional suite).
    """
    from accelmatrix.history.series import classify_suite, rules_of, trend

    store = results_store()
    if not store.has_perf_checks(ref.dag_id):
        log.info("no perf series in %s: nothing to classify", ref.dag_id)
        return {}
    regressions: dict[str, list[dict[str, Any]]] = {}
    rules, window = rules_of(suite.regression)
    verdicts, hist = classify_suite(store, ref.dag_id, rules=rules, window_days=window)
    for r in verdicts[verdicts["status"] == "regression"].itertuples(index=False):
        points = trend(hist, r.cell_id, r.benchmark, r.metric)
        log.warning("perf regression: %s %s %s: %s", r.benchmark, r.cell_id, r.metric, points)
        regressions.setdefault(r.cell_id, []).append(
            {
                "benchmark": r.benchmark,
                "metric": r.metric,
                "lower": points[-1]["lower"],
                "upper": points[-1]["upper"],
                "points": points,
            }
        )
    return regressions


def _history_and_alerts(
    suite_path: str, planned: list[dict[str, Any]], ref: RunRef, rows: dict[str, dict[str, Any]]
) -> None:
    """Classify the suite's perf series (series_status) and update its per-cell alerts.

    After the verdict is known and never able to change it: a problem here is logged.
    """
    from accelmatrix import alerts, notify
    from accelmatrix.spec.loader import load_suite

    suite = load_suite(suite_path)
    store = results_store()
    regressions: dict[str, list[dict[str, Any]]] = {}
    try:
        regressions = _regressions(suite, ref)
    except Exception:  # noqa: BLE001 - classification must never flip the run's verdict
        log.exception("perf series of %s not classified", ref.dag_id)
    run = store.get_run(ref.dag_id, ref.run_id) or {}
    latest = store.latest_logical_date(ref.dag_id)
    if run.get("logical_date") and latest and run["logical_date"] < latest:
        # A re-test of an older build (a backfill) says nothing about the current one: it
        # must not resolve, or open, the alert of newer runs.
        log.info("alerts unchanged: %s is older than the latest run", run["logical_date"])
        return
    try:
        events = alerts.update_alerts(
            store,
            ref.dag_id,
            ref.run_id,
            planned,
            rows,
            regressions=regressions,
            run_url=notify.run_url(ref.dag_id, ref.run_id),
        )
        for ev in events:
            log.info(
                "alert %s: %s (%s x%d)", ev["event"], ev["cell_id"], ev["kind"], ev["recurrences"]
            )
        sinks = suite.notify.alerts if suite.notify else []
        if sinks and events:
            alerts.deliver(sinks, events, store)
    except Exception:  # noqa: BLE001 - same: alerts are advisory
        log.exception("alerts of %s not updated", ref.dag_id)


def _notify(
    suite_path: str,
    planned: list[dict[str, Any]],
    ref: RunRef,
    failed: list[tuple[str, str]],
    rows: dict[str, dict[str, Any]],
    cost: float | None,
) -> None:
    """Send the suite's webhook; a notification problem is logged, never flips the verdict."""
    from accelmatrix import notify
    from accelmatrix.spec.loader import load_suite

    spec = load_suite(suite_path).notify
    hook = spec.webhook if spec else None
    if hook is None or (hook.when == "failure" and not failed):
        return
    by_id = {c["id"]: c for c in planned}
    checks = results_store().get_checks(ref.dag_id, ref.run_id)
    failed_cells = []
    for cid, state in failed:
        failed_cells.append(
            {
                "cell": cid,
                "state": state,
                "message": (rows.get(cid) or {}).get("message", ""),
                "failed_checks": [
                    c["check_name"] for c in checks if c["cell_id"] == cid and not c["passed"]
                ],
                "failed_tests": notify.failed_tests(by_id[cid], ref.artifacts(cid) / "files"),
            }
        )
    run = results_store().get_run(ref.dag_id, ref.run_id) or {}
    payload = notify.build_payload(
        dag_id=ref.dag_id,
        run_id=ref.run_id,
        state=RunState.FAILED if failed else RunState.PASSED,
        failed_cells=failed_cells,
        git_ref=run.get("git_ref"),
        cost=cost,
    )
    try:
        notify.send_webhook(hook, payload)
    except Exception as e:  # noqa: BLE001 - the run's verdict stands whatever the webhook does
        log.error("webhook %s not notified: %s", hook.conn_id, e)
