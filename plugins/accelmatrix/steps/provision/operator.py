"""ProvisionOperator: get-or-create a cell's machine, waiting for capacity in the triggerer.

A local work dir or an SSH host is ready at once: the operator returns its resource straight
away. A Cloud TPU may wait minutes to hours for capacity (a queued resource) and then boot:
the operator starts the request and defers to ProvisionTrigger, so the wait holds no worker
slot. The trigger gives up at the machine's own deadline (valid-until, provision timeout)
and deletes what was requested before firing; Airflow's deferral timeout is only a backstop.
When the machine is ready the trigger finishes provisioning and ends this task itself, the
resource record as its XCom (steps/task_ending.py): the cell's setup starts without another
task start in between, and nothing is lost to Airflow 3.3.2's defer/resume race.

Every failure here is an infrastructure failure (retried when the suite sets retries),
never a test failure, and leaves nothing behind: Airflow skips the teardown of a failed
setup task, so the backend undoes its own half-made machine.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from accelmatrix.cleanup import clearing
from accelmatrix.contracts.machine_records import MachineResource, PendingProvision
from accelmatrix.contracts.step_events import ProvisionEvent
from accelmatrix.spec.timeouts import provision_deferral
from accelmatrix.steps.cell_operator import CellOperator, InfrastructureFailure
from accelmatrix.steps.provision.trigger import ProvisionTrigger
from accelmatrix.steps.provision.work import begin_provision, finish_provision, provision_failed
from accelmatrix.steps.setup.work import setup
from accelmatrix.steps.teardown.work import teardown


class ProvisionOperator(CellOperator):
    """Provision ``cell``'s machine; returns the resource record (XCom) for the later steps."""

    ui_color = "#cfe2f3"
    pushes_xcom = True

    def execute(self, context: Any) -> dict[str, Any]:
        """The resource record, as its JSON form (this step's XCom)."""
        cell = self.cell
        ref = self.ref(context)
        decision = self._reprovision(context, ref)
        setup_again = decision is not None and decision.setup_again
        record = begin_provision(cell, ref)
        if not isinstance(record, PendingProvision):
            return self._ready(ref, record, setup_again).to_json()
        if setup_again:  # carried over the deferral
            record = record.model_copy(update={"reprovision_setup": True})
        # The trigger ends the task with the resource, unless the new machine must also be
        # set up here (a cleared cell whose setup step was not cleared).
        trigger, wait = ProvisionTrigger.for_cell(
            cell, record, ref, end_task=not setup_again and self.triggers_end_tasks()
        )
        self.log.info(
            "%s requested; waiting up to %.0f s for it in the triggerer", record.name, wait
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"pending": record.to_json()},
            timeout=provision_deferral(wait),
        )

    def _reprovision(self, context: Any, ref: Any) -> Any:
        """On a second try: skip when Airflow re-queued this provision only because another
        cell was cleared (3.3.2 clears the setup tasks of every map index); else say what
        runs again. None on a first try. See accelmatrix.cleanup.clearing.
        """
        if not clearing.needs_check(context) or ref.task_group is None:
            return None
        decision = clearing.decide(ref.dag_id, ref.run_id, ref.task_group, ref.map_index)
        if not decision.provision:
            self.log.info("not provisioning %s: %s", self.cell.id, decision.why)
            raise AirflowSkipException(decision.why)
        self.log.info("provisioning again: %s", decision.why)
        return decision

    def _ready(self, ref: Any, resource: MachineResource, setup_again: bool) -> MachineResource:
        """The new machine of a cleared cell whose setup step was not cleared: set it up.

        A failure here tears the machine down before failing: Airflow skips the teardown
        of a failed setup task.
        """
        if not setup_again:
            return resource
        self.log.info("the setup step was not cleared: setting up the new machine here")
        try:
            setup(self.cell, resource, ref)
        except BaseException:
            teardown(self.cell, resource, ref)
            raise
        return resource

    def execute_complete(
        self,
        context: Any,
        event: dict[str, Any] | None = None,
        pending: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The machine is ready, or never will be (``event``: a ProvisionEvent's JSON form,
        ``pending`` the deferral's kwarg); the resource record's JSON form (this step's XCom)."""
        cell = self.cell
        ref = self.ref(context)
        provisioned = ProvisionEvent.from_json(event or {"status": "failed"})
        # The trigger echoes the pending record: next_kwargs did not survive the resume in
        # Airflow 3.3.2 under dag.test(), and the event is what the resumed task surely gets.
        request = PendingProvision.from_json(pending) if pending else provisioned.pending
        if provisioned.status != "ready" or request is None:
            reason = provisioned.detail or "provisioning failed"
            provision_failed(cell, ref, request, reason)
            raise InfrastructureFailure(reason)
        self.log.info("%s is ready after %.0f s", request.name, provisioned.waited)
        resource = finish_provision(cell, ref, request)
        return self._ready(ref, resource, request.reprovision_setup).to_json()
