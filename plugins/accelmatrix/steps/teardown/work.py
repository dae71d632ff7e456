"""teardown: release what is left of the cell's machine (a cut-short cell gets its verdict
first); Airflow runs it after failures too, so no machine outlives its cell."""

from __future__ import annotations

import logging

from accelmatrix.cleanup import stopped
from accelmatrix.contracts.machine_records import MachineResource
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import RunRef
from accelmatrix.steps.release import release_machine

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def teardown(cell: CellSpec, resource: MachineResource, ref: RunRef) -> dict[str, float]:
    """Release whatever of the cell's machine is still there (``run`` releases a finished
    cell's machine itself: then this only checks that it is gone)."""
    # Before the machine goes: a trigger still watching a cut-short workload would otherwise
    # see the teardown's kill as the workload's exit and record it as a failure.
    _settle_cut_short(cell, ref, resource)
    return release_machine(cell, resource, ref, step="teardown")


def _settle_cut_short(cell: CellSpec, ref: RunRef, resource: MachineResource) -> None:
    """A cell whose work ended without an outcome (its run marked failed from outside, its
    worker killed) gets a verdict here, before its machine goes: see accelmatrix.cleanup.stopped."""
    row = results_store().get_cell(ref.dag_id, ref.run_id, cell.id)
    if row is None or row.state not in stopped.IN_FLIGHT:
        return
    states = {}
    if ref.task_group is not None and ref.map_index is not None:
        states = stopped.owner_states(ref.dag_id, ref.run_id, ref.task_group, ref.map_index)
    message = (
        f"stopped before it finished ({stopped.describe(states)}; was {row.state}); "
        f"machine {resource.name} and its workload torn down by the cell's teardown"
    )
    if stopped.settle_cell(results_store(), ref.dag_id, ref.run_id, cell.id, message):
        log.warning("cell %s: %s", cell.id, message)
