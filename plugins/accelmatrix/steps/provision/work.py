"""provision: get the cell's machine, at once or (a queued machine) begun here and finished by
ProvisionTrigger; a failure is recorded as the cell's infrastructure failure."""

from __future__ import annotations

import logging

from accelmatrix.airflow_state import OWNER_GROUP_LABEL, OWNER_INDEX_LABEL
from accelmatrix.backends.base import CellContext
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.contracts.machine_records import MachineResource, PendingProvision
from accelmatrix.results import results_store
from accelmatrix.results.fence import StepTry
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import RunRef, utcnow
from accelmatrix.steps.release import forget_earlier_machine

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def _cell_context(cell: CellSpec, ref: RunRef) -> CellContext:
    return CellContext(
        dag_id=ref.dag_id,
        run_id=ref.run_id,
        cell_id=cell.id,
        artifacts_dir=ref.artifacts(cell.id),
        labels=owner_labels(ref),
    )


def owner_labels(ref: RunRef) -> dict[str, str]:
    """Labels naming the task instances that own a cell's resource (read by the janitor)."""
    if ref.task_group is None or ref.map_index is None:
        return {}
    return {OWNER_GROUP_LABEL: ref.task_group, OWNER_INDEX_LABEL: str(ref.map_index)}


def begin_provision(cell: CellSpec, ref: RunRef) -> MachineResource | PendingProvision:
    """Start provisioning: the resource, or a pending record to wait on (see ProvisionOperator)."""
    store = results_store()
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell.id,
        fence=ref.fence,
        state=CellState.PROVISIONING,
        provision_started_at=utcnow(),
    )
    backend = get_backend(cell.machine_spec)
    try:
        record = backend.begin_provision(_cell_context(cell, ref))
    except Exception as e:
        record_provision_failure(ref.dag_id, ref.run_id, cell.id, str(e), fence=ref.fence)
        raise
    if isinstance(record, PendingProvision):
        return record
    return _provisioned(cell, ref, backend.kind, record)


def finish_provision(cell: CellSpec, ref: RunRef, pending: PendingProvision) -> MachineResource:
    backend = get_backend(cell.machine_spec)
    try:
        resource = backend.finish_provision(pending)
    except Exception as e:
        record_provision_failure(ref.dag_id, ref.run_id, cell.id, str(e), fence=ref.fence)
        raise
    return _provisioned(cell, ref, backend.kind, resource)


def provision_failed(
    cell: CellSpec, ref: RunRef, pending: PendingProvision | None, reason: str
) -> None:
    """Clean up after a provisioning that will never finish (idempotent), record why."""
    try:
        if pending is not None:
            get_backend(cell.machine_spec).abandon_provision(pending, reason)
    finally:
        record_provision_failure(ref.dag_id, ref.run_id, cell.id, reason, fence=ref.fence)


def record_provision_failure(
    dag_id: str, run_id: str, cell_id: str, reason: str, *, fence: StepTry | None = None
) -> None:
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
        dag_id,
        run_id,
        cell_id,
        fence=fence,
        state=CellState.INFRA_FAILED,
        message=f"provision failed: {reason}",
    )


def _provisioned(
    cell: CellSpec, ref: RunRef, kind: str, resource: MachineResource
) -> MachineResource:
    forget_earlier_machine(ref, cell.id)
    results_store().upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell.id,
        fence=ref.fence,
        state=CellState.PROVISIONED,
        provisioned_at=utcnow(),
    )
    log.info("provisioned %s resource %s", kind, resource.name)
    return resource
