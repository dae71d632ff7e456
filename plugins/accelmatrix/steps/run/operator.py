"""RunWorkloadOperator: start a cell's workload and wait for it in the triggerer.

Submitting is quick; the wait can take hours, so the task defers to WorkloadTrigger and
frees its worker slot. The trigger streams the workload's log into this task's log while it
runs, records the outcome and ends the task itself (steps/task_ending.py): exit as expected ->
success, without going back to a worker; a vanished machine -> an infrastructure failure
(retried if the task has retries); non-zero exit, timeout (the workload is killed) or hang
-> a test failure, never retried. ``execute_complete`` handles the cases the trigger hands
back to a worker.

Once the outcome is final (passed, or a test failure), the artifacts are copied and the
machine is released right here (finish_run), in the trigger or in the task, so an
accelerator is not held while Airflow starts collect and teardown; teardown then only
checks that it is gone.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix.backends.base import Backend
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.contracts.machine_records import (
    JobHandle,
    MachineResource,
    PendingProvision,
    handle_from_json,
    resource_from_json,
)
from accelmatrix.contracts.step_events import ProvisionEvent, WorkloadEvent
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.templating import render_tree
from accelmatrix.spec.timeouts import provision_deferral
from accelmatrix.steps.cell_operator import CellOperator, InfrastructureFailure, resource_record
from accelmatrix.steps.common import utcnow
from accelmatrix.steps.provision.trigger import ProvisionTrigger
from accelmatrix.steps.provision.work import begin_provision, finish_provision, provision_failed
from accelmatrix.steps.run.trigger import WorkloadTrigger
from accelmatrix.steps.run.work import finish_run, record_run_outcome
from accelmatrix.steps.setup.work import setup, workload_env

# How long the run task watches a fresh workload itself before deferring (see _wait_briefly).
INLINE_WAIT_SECONDS = 2.0
# Cell states of a workload that ran and failed: test failures, never retried.
TEST_FAILURE_STATES = (CellState.RUN_FAILED, CellState.TIMED_OUT, CellState.HUNG)


class WorkloadFailed(AirflowFailException):
    """The workload ran and failed (non-zero exit, timeout, hang): a test failure, never
    retried (retries are for infrastructure failures)."""


class RunWorkloadOperator(CellOperator):
    """Run ``cell``'s workload on the resource that ``provision`` returned."""

    template_fields = ("cell", "resource")
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        resource: Any,
        poll_interval: float = 1.0,
        inline_wait: float = INLINE_WAIT_SECONDS,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.resource = resource
        self.poll_interval = poll_interval
        self.inline_wait = inline_wait

    def execute(self, context: Any) -> Any:
        cell, resource = self.cell, resource_record(self.resource)
        ref = self.ref(context)
        backend = get_backend(cell.machine_spec)
        if int(getattr(context["ti"], "try_number", 1) or 1) > 1:
            self._refuse_to_rerun_a_test_failure(ref)
            # A retry after an infrastructure failure (a preempted TPU, a vanished pod's
            # node): a machine that is gone is replaced before the workload runs again,
            # under the same deterministic name, so teardown still finds what to delete.
            problem = backend.resource_problem(resource)
            if problem:
                self.log.warning("%s: replacing the machine before this retry", problem)
                backend.teardown(resource)
                record = begin_provision(cell, ref)
                if isinstance(record, PendingProvision):
                    self._defer_provision(cell, record, ref)
                    return None  # defer raises: the step goes on in execute_after_provision
                resource = record
                setup(cell, resource, ref)
        return self._start(context, resource)

    def _refuse_to_rerun_a_test_failure(self, ref: Any) -> None:
        """A retry after the workload already failed as a test failure ends at once.

        Retries are for infrastructure failures. The trigger hands a test failure to the
        worker, which fails without retry; but Airflow 3.3.2's defer/resume race can fail
        that resumed try as if its worker died, and then retries it. The verdict recorded
        by the trigger stands: the workload does not run twice.
        """
        row = results_store().get_cell(ref.dag_id, ref.run_id, self.cell.id)
        if row is not None and row.state in TEST_FAILURE_STATES:
            raise WorkloadFailed(
                f"not re-running the workload of {self.cell.id}: it already failed "
                f"({row.state}: {row.message}); test failures are never retried"
            )

    def _defer_provision(self, cell: CellSpec, pending: PendingProvision, ref: Any) -> None:
        trigger, wait = ProvisionTrigger.for_cell(cell, pending, ref)
        self.log.info("waiting up to %.0f s for %s in the triggerer", wait, pending.name)
        self.defer(
            trigger=trigger,
            method_name="execute_after_provision",
            timeout=provision_deferral(wait),
        )

    def execute_after_provision(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The replacement machine is ready (or never will be): set it up and run."""
        cell = self.cell
        ref = self.ref(context)
        provisioned = ProvisionEvent.from_json(event or {"status": "failed"})
        pending = provisioned.pending
        if provisioned.status != "ready" or pending is None:
            reason = provisioned.detail or "provisioning the replacement machine failed"
            provision_failed(cell, ref, pending, reason)
            raise InfrastructureFailure(reason)
        resource = finish_provision(cell, ref, pending)
        setup(cell, resource, ref)
        return self._start(context, resource)

    def _start(self, context: Any, resource: MachineResource) -> Any:
        """Submit the workload (or reattach to it); defer to WorkloadTrigger unless it ends
        within a brief wait."""
        cell = self.cell
        ref = self.ref(context)
        backend = get_backend(cell.machine_spec)
        variables = backend.variables(resource)
        argv = render_tree(cell.workload.run, variables)
        env = workload_env(cell, resource, variables)
        timeouts = cell.timeouts
        store = results_store()
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            cell.id,
            fence=ref.fence,
            state=CellState.RUNNING,
            run_started_at=utcnow(),
        )
        handle = backend.submit(resource, argv, env)
        verb = "reattached to" if handle.reattached else "started"
        self.log.info("%s workload of %s: %s", verb, cell.id, argv)
        self.log.info("timeout %d s; streaming its log below", timeouts.workload_s)
        offset, event = self._wait_briefly(backend, handle)
        if event is not None:  # done within the brief wait: no deferral at all
            return self.execute_complete(context, event, handle, resource)
        self.log.info("still running after %.0f s: waiting in the triggerer", self.inline_wait)
        self.defer(
            trigger=WorkloadTrigger(
                cell=cell,
                handle=handle,
                # The trigger moves it on while the backend reports the workload queued.
                deadline=timeouts.workload_deadline(time.time()),
                poll_interval=self.poll_interval,
                log_offset=offset,
                started_at=time.time() - self.inline_wait,
                deferred_at=time.time(),
                dag_id=ref.dag_id,
                run_id=ref.run_id,
                resource=resource,
                end_task=self.triggers_end_tasks(),
                # Without retries a test failure can end in the trigger too (ending.py).
                test_failure_ends_task=not self.retries,
            ),
            method_name="execute_complete",
            kwargs={"handle": handle.to_json(), "resource": resource.to_json()},
            # A queued workload's clock starts when it runs: the deferral allows the queue.
            timeout=timeouts.run_deferral(backend.queue_wait_limit()),
        )

    def _wait_briefly(
        self, backend: Backend, handle: JobHandle
    ) -> tuple[int, WorkloadEvent | None]:
        """Watch the workload for ``inline_wait`` seconds before deferring: (log offset, the
        outcome event if it ended meanwhile).

        Deferring costs a trigger pickup (about a second) plus a triggerer round trip; for
        a workload of seconds (a smoke test, a CI tier) that is most of its cell's held
        time. Longer workloads lose nothing: they run meanwhile, and the slot is freed
        after ``inline_wait``.
        """
        offset, deadline = 0, time.monotonic() + self.inline_wait
        while True:
            lines, offset = backend.read_logs(handle, offset)
            for line in lines:
                self.log.info("%s", line)
            status = backend.poll(handle)
            if status.done:
                lines, offset = backend.read_logs(handle, offset)
                for line in lines:
                    self.log.info("%s", line)
                return offset, WorkloadEvent(
                    status="infra_failed" if status.infrastructure_failure else "exited",
                    exit_code=status.exit_code,
                    detail=status.detail,
                    log_offset=offset,
                    handle=handle,
                )
            if time.monotonic() >= deadline:
                return offset, None
            time.sleep(0.05)

    def execute_complete(
        self,
        context: Any,
        event: WorkloadEvent | dict[str, Any] | None = None,
        handle: JobHandle | dict[str, Any] | None = None,
        resource: MachineResource | dict[str, Any] | None = None,
    ) -> dict[str, int | None]:
        """The workload ended (``event``: a WorkloadEvent, or its JSON form when the trigger
        resumed this task; ``handle`` and ``resource`` as the deferral's kwargs)."""
        cell = self.cell
        ref = self.ref(context)
        ended = WorkloadEvent.from_json(event or {"status": "infra_failed"})
        job = ended.handle or (handle_from_json(handle) if handle else None)
        if ended.state is not None:
            # The trigger recorded the outcome (killed a timed-out or hung workload, released
            # the machine): the task only ends as it says.
            state, msg = ended.state, ended.message
        else:
            # Ended within the inline wait, or the trigger could not record it: here, once.
            state, msg = record_run_outcome(cell, ref, ended, job)
            machine = resource_from_json(resource) if resource else resource_record(self.resource)
            # The machine goes now, not two task starts later.
            finish_run(cell, machine, ref, state)
        if state == CellState.INFRA_FAILED:
            raise InfrastructureFailure(msg)
        if state != CellState.RAN:
            raise WorkloadFailed(msg)
        self.log.info("%s", msg)
        return {"exit_code": ended.exit_code}
