"""EvaluateCellOperator: judge a cell's outputs where Great Expectations is warm.

Importing Great Expectations costs ~2.5 s of CPU per process, so the evaluation runs where
it is imported already:

* in this task process when it was started warm (``accelmatrix.deploy.executor.
  PreloadedLocalExecutor`` imports it before forking the workers): no deferral at all;
* otherwise, with ``deferrable=True`` (the default), in the triggerer through
  EvaluationTrigger, which records the verdicts and ends this task (no second task start);
* with ``deferrable=False``, here anyway (where no triggerer runs).

Either way the verdict table lands in this task's log once and the verdicts in the results
store.

A cell whose checks failed is a test failure, not an error: the verdict table is the
message, so the task fails without a traceback (ChecksFailed). An evaluation that could not
run is an error and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

from accelmatrix.contracts.step_events import EvaluationEvent, EvaluationResult
from accelmatrix.evidence import evidence_url
from accelmatrix.spec.timeouts import EVALUATION_DEFERRAL
from accelmatrix.steps.cell_operator import CellOperator
from accelmatrix.steps.common import CellFailed
from accelmatrix.steps.evaluate.trigger import EvaluationTrigger
from accelmatrix.steps.evaluate.work import (
    checks_are_warm,
    record_evaluation,
    record_evaluation_error,
    run_checks,
)


class ChecksFailed(SystemExit):
    """The cell's checks failed: fail the task with one line and no traceback.

    Airflow 3.3.2's task runner logs every other exception, AirflowFailException included,
    with ``log.exception`` (an 8-frame traceback under the verdict table); a SystemExit it
    logs as one ``Task exited`` line with its code, here the failure's message, and fails
    the task like any failure (``evaluate`` has no retries, so it is final).
    """


def _final(record: Any) -> Any:
    """Run ``record`` (record_evaluation); a failed verdict becomes ChecksFailed."""
    try:
        return record()
    except CellFailed as e:
        raise ChecksFailed(str(e)) from None


class EvaluateCellOperator(CellOperator):
    ui_color = "#fce5cd"

    def __init__(self, *, deferrable: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.deferrable = deferrable

    def execute(self, context: Any) -> Any:
        ref = self.ref(context)
        if self.deferrable and not checks_are_warm():
            self.defer(
                trigger=EvaluationTrigger(
                    cell=self.cell,
                    dag_id=ref.dag_id,
                    run_id=ref.run_id,
                    end_task=self.triggers_end_tasks(),
                ),
                method_name="execute_complete",
                timeout=EVALUATION_DEFERRAL,
            )
        self.log.info(
            "evaluating in this task process (%s)",
            "Great Expectations is loaded here already"
            if checks_are_warm()
            else "deferrable=False",
        )
        try:
            result = run_checks(self.cell, ref)
        except Exception as e:
            record_evaluation_error(self.cell, ref, f"{type(e).__name__}: {e}")
            raise
        self._log_result(result)
        return _final(lambda: record_evaluation(self.cell, ref, result))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Only for events that hand the evaluation back to a worker (older triggers);
        ``event``: an EvaluationEvent's JSON form."""
        ref = self.ref(context)
        evaluated = EvaluationEvent.from_json(event or {"status": "error", "error": "no event"})
        result = evaluated.result
        if evaluated.status != "done" or result is None:
            error = evaluated.error or str(event)
            record_evaluation_error(self.cell, ref, error)
            raise RuntimeError(f"evaluation failed to run: {error}")
        if not evaluated.logged:
            self._log_result(result)
        if evaluated.recorded:  # the trigger recorded the verdicts: end as they say
            if evaluated.failure:
                raise ChecksFailed(evaluated.failure)
            return {"cell": self.cell.id, "state": "passed"}
        return _final(lambda: record_evaluation(self.cell, ref, result))

    def _log_result(self, result: EvaluationResult) -> None:
        self.log.info("checks for %s:\n%s", self.cell.id, result.table)
        if result.data_docs:
            self.log.info("Data Docs: %s", evidence_url(self.dag_id, result.data_docs))
        self.log.info("evaluation took %.2f s", result.seconds)
