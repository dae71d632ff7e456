"""evaluate: run the cell's checks (Great Expectations, wherever it is warm) and record the
verdicts and the cell's final state."""

from __future__ import annotations

import logging
import threading

from accelmatrix import settings
from accelmatrix.cell_state import EARLIER_FAILURES, NEVER_RAN, CellState
from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.step_events import EvaluationResult
from accelmatrix.evaluation import CellOutputs, evaluate_cell
from accelmatrix.evaluation.gx_suite import gx_loaded
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import CellFailed, RunRef, _read_json, _record_step_failure

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


_EVAL_LOCK = threading.Lock()


def checks_are_warm() -> bool:
    """Whether Great Expectations is already imported in this process.

    True in a PreloadedLocalExecutor's task processes (accelmatrix.deploy.executor) and in a
    triggerer after its warm-up. Evaluating where it is warm takes a fraction of a second;
    where it is cold the import alone costs ~2.5 s of CPU, more than a deferral's round trip.
    """
    return gx_loaded()


def run_checks(cell: CellSpec, ref: RunRef) -> EvaluationResult:
    """Evaluate the cell's outputs with Great Expectations; return the result.

    Pure with respect to the results store, so it can run wherever Great Expectations is
    already warm (the triggerer, see EvaluationTrigger). Serialised by a lock: GE contexts
    are not documented as thread-safe.
    """
    art = ref.artifacts(cell.id)
    status = _read_json(art / "status.json")
    metrics = _read_json(art / "metrics.json") or []
    with _EVAL_LOCK:
        report = evaluate_cell(
            cell.checks,
            CellOutputs(
                files_dir=art / "files",
                log_path=art / "output.log",
                status=status,
                metrics=metrics,
            ),
            include_dir=settings.include_dir(),
            data_docs_dir=art / "data_docs",
            suite_name=f"{ref.dag_id}.{cell.id}",
        )
    return EvaluationResult(
        passed=report.passed,
        table=report.format_table(),
        seconds=report.seconds,
        data_docs=str(report.data_docs_index) if report.data_docs_index else None,
        verdicts=list(report.verdicts),
        warnings=[f"{v.name}: {v.message}" for v in report.verdicts if v.warning],
    )


def record_evaluation(cell: CellSpec, ref: RunRef, result: EvaluationResult) -> dict[str, str]:
    """Store the verdicts and the cell's final state; raise CellFailed unless it passed."""
    store = results_store()
    store.replace_checks(ref.dag_id, ref.run_id, cell.id, result.verdicts)
    failed = [v for v in result.verdicts if not v.passed]
    prior = store.get_cell(ref.dag_id, ref.run_id, cell.id)
    prior_state = prior.state if prior is not None else None
    prior_message = prior.message if prior is not None else ""
    # A specific earlier failure (setup, timeout, infrastructure) says more than "failed".
    earlier = prior_state if prior_state in EARLIER_FAILURES else None
    if prior_state in NEVER_RAN:
        # Its machine never got to run the workload (Airflow failed or skipped the provision
        # or setup task without a word to the store): an infrastructure failure, not checks
        # failing on outputs that never existed.
        earlier = CellState.INFRA_FAILED
        prior_message = (
            f"the workload never ran: the cell stopped at {prior_state!r} "
            "(its provision or setup task did not finish)"
        )
    if result.passed and earlier is None:
        state = CellState.PASSED
    else:
        state = earlier or CellState.FAILED
    message = "; ".join(f"{v.name}: {v.message}" for v in failed)[:2000]
    for w in result.warnings:
        log.warning("cell %s: %s", cell.id, w)
    if state == CellState.PASSED and result.warnings:
        message = "; ".join(result.warnings)[:2000]  # passed, with warnings
    if earlier and prior_message:
        message = f"{prior_message}; {message}"
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell.id,
        fence=ref.fence,
        state=state,
        message=message,
        data_docs=result.data_docs,
    )
    if state != CellState.PASSED:
        raise CellFailed(failure_line(cell.id, state, failed, len(result.verdicts), message))
    return {"cell": cell.id, "state": state}


# How much of each failed check's "why" the failure line carries (the verdict table above
# it has everything).
WHY_WIDTH = 120
WHY_CHECKS = 3


def failure_line(
    cell_id: str, state: str, failed: list[CheckVerdict], total: int, message: str = ""
) -> str:
    """The one line a failed evaluate ends with (its task's last log line): which cell, and
    why: each failed check with expected against observed (the first few), or the earlier
    failure's message when no check failed (an infrastructure failure, a timeout)."""
    head = f"cell {cell_id} {state}: {len(failed)} of {total} check(s) failed"
    whys = []
    for v in failed[:WHY_CHECKS]:
        said = [f"expected {v.expected}"] if v.expected else []
        said += [f"observed {v.observed}"] if v.observed else []
        why = ", ".join(said) or (v.message or "")
        why = " ".join(str(why).split())
        why = why if len(why) <= WHY_WIDTH else why[: WHY_WIDTH - 3] + "..."
        whys.append(f"{v.name} ({why})" if why else v.name)
    if len(failed) > WHY_CHECKS:
        whys.append(f"and {len(failed) - WHY_CHECKS} more")
    if whys:
        return f"{head}: {', '.join(whys)}"
    why = " ".join(message.split())
    return f"{head}; {why[: WHY_WIDTH * 2]}" if why else head


def record_evaluation_error(cell: CellSpec, ref: RunRef, error: str) -> None:
    """The checks could not run (Great Expectations crashed, the trigger failed): the cell
    gets ``evaluation_failed`` and "evaluation could not run: <error>", never a stale state
    that could pass. Called by the evaluate task and trigger; idempotent."""
    _record_step_failure(
        cell, ref, CellState.EVALUATION_FAILED, f"evaluation could not run: {error}"
    )
