"""EvaluationTrigger: run a cell's Great Expectations checks in the triggerer.

Importing Great Expectations costs 7-18 s of CPU on a 2-core machine; paid by every
`evaluate` task process it would dominate a matrix run (64 cells -> 64 imports). The
triggerer is one long-lived process per deployment: it imports Great Expectations once
(started early by the cell's earlier triggers, see ending.warm_great_expectations) and then
evaluates each cell in about 0.2-0.6 s, in a worker thread so the event loop keeps
streaming other cells' logs.

With ``end_task`` the trigger records the verdicts and ends the ``evaluate`` task itself:
success when the cell passed, failed (never retried) otherwise, the verdict table in the
task's log once. An evaluation that could not run at all is recorded as such
(``evaluation_failed``): the cell never stays "passed" by default.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent

from accelmatrix.contracts.step_events import EvaluationEvent
from accelmatrix.evidence import evidence_url
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import CellFailed, RunRef
from accelmatrix.steps.evaluate.work import record_evaluation, record_evaluation_error, run_checks


class EvaluationTrigger(BaseTrigger):
    def __init__(
        self, cell: CellSpec | dict[str, Any], dag_id: str, run_id: str, end_task: bool = False
    ):
        super().__init__()
        self.cell = CellSpec.from_json(cell)  # its JSON form after the triggerer loaded it
        self.dag_id = dag_id
        self.run_id = run_id
        self.end_task = end_task

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "cell": self.cell.to_json(),
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "end_task": self.end_task,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ref = RunRef(dag_id=self.dag_id, run_id=self.run_id)
        cell_id = self.cell.id
        try:
            result = await asyncio.to_thread(run_checks, self.cell, ref)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            self.log.exception("evaluation of %s could not run", cell_id)
            if self.end_task:
                await self._record_error(ref, error)
                yield TaskFailedEvent()
            else:  # reported to the resumed task, which records it and fails
                yield TriggerEvent(EvaluationEvent(status="error", error=error).to_json())
            return
        self.log.info("checks for %s:\n%s", cell_id, result.table)
        if result.data_docs:
            self.log.info("Data Docs: %s", evidence_url(self.dag_id, result.data_docs))
        self.log.info("evaluation took %.2f s", result.seconds)
        # Recorded here, not by a resumed task: the verdict must not depend on a worker. The
        # event says so, and what the cell's failure was, so the task does not record again.

        done = EvaluationEvent(status="done", result=result, logged=True)
        try:
            await asyncio.to_thread(record_evaluation, self.cell, ref, result)
        except CellFailed as e:
            self.log.error("evaluate failed: %s", e)
            done.recorded, done.failure = True, str(e)
            if self.end_task:
                yield TaskFailedEvent()  # evaluate has no retries: a check failure is final
                return
        except Exception as e:
            self.log.exception("could not record the verdicts of %s", cell_id)
            if self.end_task:
                await self._record_error(ref, f"recording the verdicts failed: {e}")
                yield TaskFailedEvent()
                return
        else:
            done.recorded = True
            if self.end_task:
                self.log.info("cell %s passed", cell_id)
                yield TaskSuccessEvent()  # no XCom: the verdicts are in the store
                return
        yield TriggerEvent(done.to_json())

    async def _record_error(self, ref: Any, error: str) -> None:
        try:
            await asyncio.to_thread(record_evaluation_error, self.cell, ref, error)
        except Exception:
            self.log.exception("could not record that the evaluation of %s failed", ref)
