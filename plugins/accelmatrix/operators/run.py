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

# Grace between the workload deadline (enforced by the trigger, which kills the workload)
# and Airflow's deferral timeout (a backstop in case the triggerer itself is stuck).
DEFER_GRACE_SECONDS = 300


class WorkloadFailed(Exception):
    """The workload ran and failed (non-zero exit or timeout): a test failure."""


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

        return RunRef(dag_id=context["dag"].dag_id, run_id=context["run_id"])

    def execute(self, context: Any) -> Any:
        from accelmatrix.backends.base import get_backend
        from accelmatrix.lifecycle import results_store, utcnow, workload_env
        from accelmatrix.spec.templating import render_tree
        from accelmatrix.triggers.workload import WorkloadTrigger

        cell, resource = self.cell, self.resource
        context["cell_id"] = cell["id"]
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
            ),
            method_name="execute_complete",
            kwargs={"handle": handle},
            timeout=timedelta(seconds=timeout + DEFER_GRACE_SECONDS),
        )

    def execute_complete(
        self, context: Any, event: dict[str, Any] | None = None, handle: dict | None = None
    ) -> dict[str, Any]:
        from accelmatrix.backends.base import get_backend
        from accelmatrix.lifecycle import results_store, utcnow

        cell = self.cell
        context["cell_id"] = cell["id"]
        ref = self._ref(context)
        event = event or {}
        store = results_store()
        status = event.get("status")
        exit_code = event.get("exit_code")
        store.upsert_cell(
            ref.dag_id, ref.run_id, cell["id"], run_ended_at=utcnow(), exit_code=exit_code
        )
        if status == "timeout":
            get_backend(cell["machine_spec"]).cancel(handle or {})
            msg = f"workload timed out after {cell['workload']['timeout']} s and was killed"
            store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state="timed_out", message=msg)
            raise WorkloadFailed(msg)
        if status == "hung":
            get_backend(cell["machine_spec"]).cancel(handle or {})
            msg = f"workload {event.get('detail')}; it was killed"
            store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state="hung", message=msg)
            raise WorkloadFailed(msg)
        if status == "infra_failed":
            msg = f"infrastructure failure: {event.get('detail')}"
            store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state="infra_failed", message=msg)
            raise InfrastructureFailure(msg)
        expected = next(
            (int(c.get("expected", 0)) for c in cell["checks"] if c.get("type") == "exit_status"),
            0,
        )
        if exit_code != expected:
            msg = f"workload exited with {exit_code}, expected {expected} ({event.get('detail')})"
            store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state="run_failed", message=msg)
            raise WorkloadFailed(msg)
        store.upsert_cell(ref.dag_id, ref.run_id, cell["id"], state="ran")
        self.log.info("workload of %s exited %s as expected", cell["id"], exit_code)
        return {"exit_code": exit_code}
