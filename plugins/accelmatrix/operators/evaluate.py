"""EvaluateCellOperator: judge a cell's outputs, with Great Expectations kept warm.

`deferrable=True` (the default) hands the evaluation to EvaluationTrigger so Great
Expectations is imported once per triggerer instead of once per cell; `deferrable=False`
evaluates in the task process (useful where no triggerer runs). Either way the verdict
table lands in this task's log and the verdicts in the results store.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator


class EvaluateCellOperator(BaseOperator):
    template_fields = ("cell",)
    ui_color = "#fce5cd"

    def __init__(self, *, cell: Any, deferrable: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.cell = cell
        self.deferrable = deferrable

    def _ref(self, context: Any):
        from accelmatrix.lifecycle import RunRef

        context["cell_id"] = self.cell["id"]
        return RunRef.from_context(context)

    def execute(self, context: Any) -> Any:
        ref = self._ref(context)
        if self.deferrable:
            from accelmatrix.triggers.evaluation import EvaluationTrigger

            self.defer(
                trigger=EvaluationTrigger(cell=self.cell, dag_id=ref.dag_id, run_id=ref.run_id),
                method_name="execute_complete",
                timeout=timedelta(minutes=15),
            )
        from accelmatrix import lifecycle

        return self._record(lifecycle.run_checks(self.cell, ref), ref)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        ref = self._ref(context)
        event = event or {}
        if event.get("status") != "done":
            raise RuntimeError(f"evaluation failed to run: {event.get('error', event)}")
        return self._record(event["result"], ref)

    def _record(self, result: dict[str, Any], ref: Any) -> Any:
        from accelmatrix import lifecycle

        self.log.info("checks for %s:\n%s", self.cell["id"], result["table"])
        if result["data_docs"]:
            self.log.info("Data Docs: %s", result["data_docs"])
        self.log.info("evaluation took %.2f s", result["seconds"])
        return lifecycle.record_evaluation(self.cell, ref, result)
