"""WorkloadTrigger: wait for a workload in the triggerer, stream its log live, end the task.

A 6-hour training run must not hold a worker slot, and on-call must see its log while it
runs: the trigger polls the backend (non-blocking calls, run in a thread), writes every new
log line through its logger (Airflow routes trigger logs into the task's log), and fires
once the workload exits or its deadline passes.

With ``end_task`` (what RunWorkloadOperator asks for) the trigger records the outcome and
ends the ``run`` task itself (accelmatrix.steps.task_ending): a passing workload never goes
back to a worker, which saves a task start per cell and keeps the cell out of Airflow
3.3.2's defer/resume race. Before it ends the task it copies the artifacts and releases the
machine when the outcome is final, so no accelerator waits for collect and teardown.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.triggers.base import BaseTaskEndEvent, BaseTrigger, TriggerEvent

from accelmatrix.backends.machine_kinds import get_backend, machine_of
from accelmatrix.cleanup.stopped import stop_workload
from accelmatrix.contracts.machine_records import (
    JobHandle,
    MachineResource,
    handle_from_json,
    resource_from_json,
)
from accelmatrix.contracts.step_events import WorkloadEvent
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import RunRef
from accelmatrix.steps.run.work import finish_run, record_run_outcome
from accelmatrix.steps.task_ending import end_event, settle_before_resume, warm_great_expectations


class WorkloadTrigger(BaseTrigger):
    """Watch one workload (``handle``) until it ends or its deadline passes.

    ``cell`` (a CellSpec, or its JSON form after the triggerer deserialised the trigger)
    is carried once and says everything about the workload: its machine, timeout and hang
    detection. Without a cell the trigger watches a workload on a bare machine
    (``machine_spec``, ``timeout`` and ``hang_detection`` given alone): it then only fires
    the outcome, recording nothing. ``handle`` and ``resource`` come as their JSON forms
    after the triggerer deserialised the trigger.
    """

    def __init__(
        self,
        handle: JobHandle | dict[str, Any],
        deadline: float,
        log_offset: int = 0,
        poll_interval: float = 1.0,
        started_at: float | None = None,
        cell: CellSpec | dict[str, Any] | None = None,
        dag_id: str | None = None,
        run_id: str | None = None,
        end_task: bool = False,
        test_failure_ends_task: bool = False,
        deferred_at: float | None = None,
        resource: MachineResource | dict[str, Any] | None = None,
        machine_spec: dict[str, Any] | None = None,
        timeout: float | None = None,
        hang_detection: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.cell = CellSpec.from_json(cell) if cell is not None else None
        if self.cell is not None:
            # A trigger serialised before the cell carried these also passes them: the
            # cell's own values win.
            hang = self.cell.workload.hang_detection
            self.machine = self.cell.machine_spec
            # With the timeout, a wait for capacity (Kueue) does not count: the deadline
            # moves on while the backend reports the workload queued.
            timeout = self.cell.timeouts.workload_s
            hang_detection = hang.model_dump() if hang is not None else None
        elif machine_spec is not None:
            self.machine = machine_of(machine_spec)
        else:
            raise TypeError("WorkloadTrigger needs a cell or a machine_spec")
        self.timeout = timeout
        self.hang_detection = hang_detection
        self.handle = handle_from_json(handle)
        self.deadline = deadline
        self.log_offset = log_offset
        self.poll_interval = poll_interval
        self.started_at = started_at if started_at is not None else time.time()
        self.dag_id = dag_id
        self.run_id = run_id
        self.end_task = end_task
        self.test_failure_ends_task = test_failure_ends_task
        self.deferred_at = deferred_at if deferred_at is not None else time.time()
        # The machine, released here as soon as the outcome is final (lifecycle.finish_run).
        self.resource = resource_from_json(resource) if resource is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "handle": self.handle.to_json(),
            "deadline": self.deadline,
            "log_offset": self.log_offset,
            "poll_interval": self.poll_interval,
            "started_at": self.started_at,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "end_task": self.end_task,
            "test_failure_ends_task": self.test_failure_ends_task,
            "deferred_at": self.deferred_at,
            "resource": self.resource.to_json() if self.resource is not None else None,
        }
        if self.cell is not None:  # the cell says the rest
            kwargs["cell"] = self.cell.to_json()
        else:
            kwargs.update(
                machine_spec=self.machine.model_dump(mode="json"),
                timeout=self.timeout,
                hang_detection=self.hang_detection,
            )
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # This cell's evaluation comes next: have Great Expectations imported by then.
        warm_great_expectations()
        backend = get_backend(self.machine)
        offset = self.log_offset
        hang = HangWatch(self.hang_detection, self.started_at) if self.hang_detection else None
        deadline = self.deadline
        while True:
            lines, offset = await asyncio.to_thread(backend.read_logs, self.handle, offset)
            for line in lines:
                self.log.info("%s", line)
                if hang:
                    hang.saw(line)
            status = await asyncio.to_thread(backend.poll, self.handle)
            deadline = self._deadline(deadline, status)
            if hang and (status.queued or status.started_at is not None):
                # A wait for capacity is not a silent workload: its heartbeat clock too
                # starts when it runs.
                hang.clock_starts(time.time() if status.queued else status.started_at)
            event: WorkloadEvent | None = None
            if status.done:
                # Drain what was written between the last read and the exit.
                lines, offset = await asyncio.to_thread(backend.read_logs, self.handle, offset)
                for line in lines:
                    self.log.info("%s", line)
                event = WorkloadEvent(
                    status="infra_failed" if status.infrastructure_failure else "exited",
                    exit_code=status.exit_code,
                    detail=status.detail,
                )
            elif hang and (problem := hang.problem()):
                event = WorkloadEvent(status="hung", detail=problem)
            elif time.time() >= deadline:
                event = WorkloadEvent(status="timeout", detail="deadline passed")
            if event is not None:
                event.log_offset = offset
                event.handle = self.handle
                outcome = await self._record(event)
                if outcome is not None:
                    event.state, event.message = outcome
                    await self._finish(outcome[0])
                ending = self._event(event, outcome)
                if not isinstance(ending, BaseTaskEndEvent):
                    await settle_before_resume(self.deferred_at)
                yield ending
                return
            await asyncio.sleep(self.poll_interval)

    def _deadline(self, deadline: float, status: Any) -> float:
        """The workload's deadline: its timeout counts from when it started running, not
        from submit, when the backend says it waited for capacity (``queued``)."""
        if self.timeout is None:
            return deadline
        if status.queued:  # the clock has not started
            return max(deadline, time.time() + self.timeout)
        if status.started_at is not None:
            return max(deadline, status.started_at + self.timeout)
        return deadline

    async def on_kill(self) -> None:
        """A person acted on the deferred run task (mark failed/success, clear) or deleted
        its run: Airflow 3.3.2 calls this then, and never on a triggerer restart or a
        timeout. The workload is cancelled at once (accelmatrix.cleanup.stopped.stop_workload);
        the lines land in the run task's log."""
        if not (self.cell and self.dag_id and self.run_id):
            return
        try:
            # Shielded: 3.3.2 cancels the trigger again at its next state sync (about a
            # second), which interrupts on_kill; the cancelling goes on in its thread.
            await asyncio.shield(
                asyncio.to_thread(
                    stop_workload,
                    self.cell,
                    self.dag_id,
                    self.run_id,
                    self.handle,
                    lambda line: self.log.warning("%s", line),
                )
            )
        except Exception:
            self.log.exception("could not stop the workload of %s", self.cell.id)

    def _event(self, event: WorkloadEvent, outcome: tuple[str, str] | None) -> TriggerEvent:
        """What ends the wait: the task's end (see ending.py), or a resume of the task."""
        if not self.end_task or outcome is None:
            return TriggerEvent(event.to_json())  # the resumed task records and decides
        state, msg = outcome
        return end_event(
            "run",
            state,
            msg,
            passed_state="ran",
            resume=TriggerEvent(event.to_json()),
            test_failure_ends_task=self.test_failure_ends_task,
            log=self.log,
        )

    async def _finish(self, state: str) -> None:
        """Fetch the artifacts and release the machine once the outcome is final, before the
        task ends: the accelerator is free seconds earlier than after collect and teardown
        tasks (see finish_run; never raises)."""
        if not (self.resource and self.cell and self.dag_id and self.run_id):
            return
        ref = RunRef(dag_id=self.dag_id, run_id=self.run_id)
        # The context carries the trigger id, which routes the lines into the task's log.
        ctx = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(
            _RELEASES, ctx.run, finish_run, self.cell, self.resource, ref, state
        )

    async def _record(self, event: WorkloadEvent) -> tuple[str, str] | None:
        """Record the outcome (and kill a timed-out or hung workload) before firing; the
        event then carries it, so a resumed task does not record it again. None when it
        could not be recorded (the resumed task then records it).
        """
        if not (self.cell and self.dag_id and self.run_id):
            return None
        ref = RunRef(dag_id=self.dag_id, run_id=self.run_id)
        try:
            state, msg = await asyncio.to_thread(
                record_run_outcome, self.cell, ref, event, self.handle
            )
        except Exception:
            self.log.exception("could not record the outcome of %s", self.cell.id)
            return None
        self.log.info("%s: %s", state, msg)
        return state, msg


# Releasing a machine can block for minutes (a TPU delete waits for its operation): it runs
# on threads of its own, so it never starves the default pool that polls every workload.
_RELEASES = ThreadPoolExecutor(max_workers=4, thread_name_prefix="accelmatrix-release")


class HangWatch:
    """Tracks when the heartbeat pattern last appeared in the workload's log."""

    def __init__(self, spec: dict[str, Any], started_at: float):
        self.pattern = re.compile(spec["pattern"])
        self.start_within = float(spec["start_within"])
        self.recur_within = float(spec["recur_within"])
        self.started_at = started_at
        self.last_match: float | None = None

    def clock_starts(self, at: float) -> None:
        """The workload started (later than thought) at ``at``: before its first heartbeat,
        ``start_within`` counts from then."""
        if self.last_match is None:
            self.started_at = max(self.started_at, at)

    def saw(self, line: str) -> None:
        if self.pattern.search(line):
            self.last_match = time.time()

    def problem(self) -> str | None:
        now = time.time()
        if self.last_match is None:
            if now - self.started_at > self.start_within:
                return (
                    f"hung: no log line matched /{self.pattern.pattern}/ within "
                    f"{self.start_within:.0f} s of the start"
                )
            return None
        if now - self.last_match > self.recur_within:
            return (
                f"hung: no log line matched /{self.pattern.pattern}/ for "
                f"{now - self.last_match:.0f} s (limit {self.recur_within:.0f} s)"
            )
        return None
