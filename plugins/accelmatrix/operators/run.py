"""RunWorkloadOperator: start a cell's workload and wait for it in the triggerer.

Submitting is quick; the wait can take hours, so the task defers to WorkloadTrigger and
frees its worker slot. The trigger streams the workload's log into this task's log while it
runs. When it fires, `execute_complete` turns the outcome into a task state: exit 0 ->
success; non-zero -> failure (a test failure); timeout -> the workload is killed and the
task fails; a vanished supervisor -> an infrastructure failure (retried if retries are set).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

# Grace between the workload deadline (enforced by the trigger, which kills the workload)
# and Airflow's deferral timeout (a backstop in case the triggerer itself is stuck).
DEFER_GRACE_SECONDS = 300


class WorkloadFailed(AirflowFailException):
    """The workload ran and failed (non-zero exit, timeout, hang): a test failure, never
    retried (retries are for infrastructure failures)."""


class InfrastructureFailure(Exception):
    """The machine failed, not the workload: retried when the suite sets retries."""


class RunWorkloadOperator(BaseOperator):
    """Run ``cell``'s workload on the resource that ``provision`` returned."""

    template_fields = ("cell", "resource")
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        cell: Any,
        resource: Any,
        poll_interval: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.cell = cell
        self.resource = resource
        self.poll_interval = poll_interval

    def _ref(self, context: Any):
        from accelmatrix.lifecycle import RunRef

        return RunRef.from_context(context)

    def execute(self, context: Any) -> Any:
        from accelmatrix import lifecycle
        from accelmatrix.backends.base import get_backend

        cell, resource = self.cell, self.resource
        context["cell_id"] = cell["id"]
        ref = self._ref(context)
        backend = get_backend(cell["machine_spec"])
        if int(getattr(context["ti"], "try_number", 1) or 1) > 1:
            # A retry after an infrastructure failure (a preempted TPU, a vanished pod's
            # node): a machine that is gone is replaced before the workload runs again,
            # under the same deterministic name, so teardown still finds what to delete.
            problem = backend.resource_problem(resource)
            if problem:
                self.log.warning("%s: replacing the machine before this retry", problem)
                backend.teardown(resource)
                record = lifecycle.begin_provision(cell, ref)
                if record.get("pending"):
                    self._defer_provision(cell, record, ref)
                resource = record
                lifecycle.setup(cell, resource, ref)
        self._start(context, resource)

    def _defer_provision(self, cell: dict[str, Any], pending: dict[str, Any], ref: Any) -> None:
        from accelmatrix.triggers.provision import ProvisionTrigger

        trigger, wait = ProvisionTrigger.for_cell(cell, pending, ref)
        self.log.info("waiting up to %.0f s for %s in the triggerer", wait, pending["name"])
        self.defer(
            trigger=trigger,
            method_name="execute_after_provision",
            timeout=timedelta(seconds=wait + DEFER_GRACE_SECONDS),
        )

    def execute_after_provision(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The replacement machine is ready (or never will be): set it up and run."""
        from accelmatrix import lifecycle

        cell = self.cell
        context["cell_id"] = cell["id"]
        ref = self._ref(context)
        event = event or {}
        pending = event.get("pending") or {}
        if event.get("status") != "ready":
            reason = event.get("detail") or "provisioning the replacement machine failed"
            lifecycle.provision_failed(cell, ref, pending, reason)
            raise InfrastructureFailure(reason)
        resource = lifecycle.finish_provision(cell, ref, pending)
        lifecycle.setup(cell, resource, ref)
        self._start(context, resource)

    def _start(self, context: Any, resource: dict[str, Any]) -> None:
        """Submit the workload (or reattach to it) and defer to WorkloadTrigger."""
        from accelmatrix.backends.base import get_backend
        from accelmatrix.lifecycle import results_store, utcnow, workload_env
        from accelmatrix.spec.templating import render_tree
        from accelmatrix.triggers.workload import WorkloadTrigger

        cell = self.cell
        ref = self._ref(context)
        backend = get_backend(cell["machine_spec"])
        variables = backend.variables(resource)
        argv = render_tree(cell["workload"]["run"], variables)
        env = workload_env(cell, resource, variables)
        timeout = int(cell["workload"]["timeout"])
        store = results_store()
        store.upsert_cell(
            ref.dag_id, ref.run_id, cell["id"], state="running", run_started_at=utcnow()
        )
        handle = backend.submit(resource, argv, env)
        verb = "reattached to" if handle.get("reattached") else "started"
        self.log.info("%s workload of %s: %s", verb, cell["id"], argv)
        self.log.info("timeout %d s; streaming its log below", timeout)
        self.defer(
            trigger=WorkloadTrigger(
                machine_spec=cell["machine_spec"],
                handle=handle,
                deadline=time.time() + timeout,
                poll_interval=self.poll_interval,
                hang_detection=cell["workload"].get("hang_detection"),
                started_at=time.time(),
                cell=cell,
                dag_id=ref.dag_id,
                run_id=ref.run_id,
            ),
            method_name="execute_complete",
            kwargs={"handle": handle},
            timeout=timedelta(seconds=timeout + DEFER_GRACE_SECONDS),
        )

    def execute_complete(
        self, context: Any, event: dict[str, Any] | None = None, handle: dict | None = None
    ) -> dict[str, Any]:
        from accelmatrix.lifecycle import record_run_outcome

        cell = self.cell
        context["cell_id"] = cell["id"]
        ref = self._ref(context)
        event = event or {}
        # The trigger already recorded this (and killed a timed-out or hung workload); doing
        # it again is idempotent and covers events from older triggers.
        state, msg = record_run_outcome(cell, ref, event, handle or event.get("handle") or {})
        if state == "infra_failed":
            raise InfrastructureFailure(msg)
        if state != "ran":
            raise WorkloadFailed(msg)
        self.log.info("%s", msg)
        return {"exit_code": event.get("exit_code")}
