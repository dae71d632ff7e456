"""setup: run the setup commands and start the services on the cell's machine; the
environment every workload gets (workload_env)."""

from __future__ import annotations

import json
import logging

from accelmatrix.backends.base import InfrastructureError, SetupFailed
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.contracts.machine_records import MachineResource, ServiceSpec
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.templating import render_tree
from accelmatrix.steps.common import RunRef

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def setup(cell: CellSpec, resource: MachineResource, ref: RunRef) -> None:
    wl = cell.workload
    store = results_store()
    if not wl.setup and not wl.services:
        log.info("no setup commands")
        store.upsert_cell(ref.dag_id, ref.run_id, cell.id, fence=ref.fence, state=CellState.SETUP)
        return
    backend = get_backend(cell.machine_spec)
    variables = backend.variables(resource)
    store.upsert_cell(ref.dag_id, ref.run_id, cell.id, fence=ref.fence, state=CellState.SETUP)
    try:
        backend.setup(
            resource,
            render_tree(wl.setup, variables),
            workload_env(cell, resource, variables),
            wl.setup_timeout,
            lambda line: log.info("%s", line),
        )
        if wl.services:
            backend.start_services(
                resource,
                [
                    ServiceSpec.model_validate(render_tree(s.model_dump(mode="json"), variables))
                    for s in wl.services
                ],
                workload_env(cell, resource, variables),
                lambda line: log.info("%s", line),
            )
    except SetupFailed as e:
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            cell.id,
            fence=ref.fence,
            state=CellState.SETUP_FAILED,
            message=str(e),
        )
        raise
    except InfrastructureError as e:  # the machine failed during setup, not the commands
        store.upsert_cell(
            ref.dag_id,
            ref.run_id,
            cell.id,
            fence=ref.fence,
            state=CellState.INFRA_FAILED,
            message=f"infrastructure failure during setup: {e}",
        )
        raise


def workload_env(
    cell: CellSpec, resource: MachineResource, variables: dict[str, str]
) -> dict[str, str]:
    """The suite's env plus what every workload may rely on (cell id, axis values)."""
    env = dict(render_tree(cell.workload.env, variables))
    env["ACCELMATRIX_CELL_ID"] = cell.id
    # What the cell's machine declares, so a workload can compare it with what it sees.
    env["ACCELMATRIX_MACHINE"] = cell.machine
    env["ACCELMATRIX_MACHINE_RESOURCES"] = json.dumps(cell.machine_json.get("resources") or {})
    for axis, label in cell.axes.items():
        env[f"ACCELMATRIX_AXIS_{axis.upper()}"] = label
    return env
