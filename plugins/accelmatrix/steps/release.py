"""Releasing a cell's machine and recording how long it was held and what it cost.

Two steps release: ``run``, as soon as its workload's outcome is final and the artifacts are
safe (run_step.finish_run), and ``teardown``, Airflow's teardown task, which always runs and
releases whatever is still there. Whoever releases first records the held time; the other
finds the marker (``released.json``, naming the machine) and only makes sure the machine is
gone: every backend's ``teardown`` is idempotent and tolerates not-found.
"""

from __future__ import annotations

import json
import logging
import time

import tenacity

from accelmatrix.backends.base import Backend
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.contracts.machine_records import MachineResource
from accelmatrix.pricing import PricingError, hourly_price
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.timeouts import TEARDOWN_API_PATIENCE_SECONDS
from accelmatrix.steps.artifacts import FETCHED, machine_key, same_machine
from accelmatrix.steps.common import RunRef, _read_json, utcnow

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step

RELEASED = "released.json"


def released_by(cell: CellSpec, resource: MachineResource, ref: RunRef) -> dict | None:
    """The record of an earlier release of this very machine, or None."""
    marker = _read_json(ref.artifacts(cell.id) / RELEASED)
    return marker if same_machine(marker, resource) else None


def forget_earlier_machine(ref: RunRef, cell_id: str) -> None:
    """A new machine for the cell: the markers of the one before no longer apply."""
    art = ref.artifacts(cell_id)
    for name in (RELEASED, FETCHED):
        try:
            (art / name).unlink(missing_ok=True)
        except OSError as e:  # an unusable artifacts dir fails the step that writes to it
            log.warning("could not remove %s: %s", art / name, e)


def delete_machine(backend: Backend, resource: MachineResource, *, patience: float) -> None:
    """``backend.teardown(resource)``, tried again while the backend says the error means its
    API could not be reached, for up to ``patience`` seconds (backing off 2 s to 15 s).

    A delete is idempotent, so trying again is safe; giving up during a control-plane blip
    would leave the machine running until the janitor's next pass. Other errors (the API
    answered no) and the last unreachable one propagate: the task fails with them.
    """

    def warn(state: tenacity.RetryCallState) -> None:
        log.warning(
            "could not reach the API to delete %s (try %d; trying again in %.0f s, for up "
            "to %.0f s in all): %s",
            resource.name,
            state.attempt_number,
            state.next_action.sleep if state.next_action else 0.0,
            patience,
            state.outcome.exception() if state.outcome else None,
        )

    tenacity.Retrying(
        retry=tenacity.retry_if_exception(backend.unreachable),
        stop=tenacity.stop_before_delay(patience),
        wait=tenacity.wait_exponential(min=2, max=15),
        before_sleep=warn,
        reraise=True,
    )(backend.teardown, resource)


def release_machine(
    cell: CellSpec, resource: MachineResource, ref: RunRef, *, step: str
) -> dict[str, float]:
    """Delete the cell's machine (idempotent) and, the first time, record the held time.

    Returns ``held_seconds`` and ``workload_seconds`` of the first release.
    """
    earlier = released_by(cell, resource, ref)
    # `run` releases on the side and leaves a failure to the teardown task; the teardown
    # task is the last one that can, so it waits out an unreachable cloud API.
    patience = TEARDOWN_API_PATIENCE_SECONDS if step == "teardown" else 0.0
    delete_machine(get_backend(cell.machine_spec), resource, patience=patience)
    if earlier is not None:
        log.info(
            "%s was released by %s %.1f s after it was created; checked that it is gone",
            resource.name,
            earlier.get("step"),
            earlier.get("held_seconds") or 0.0,
        )
        return {k: earlier.get(k) for k in ("held_seconds", "workload_seconds")}
    ended = time.time()
    held = ended - float(resource.created_at or ended)
    art = ref.artifacts(cell.id)
    status = _read_json(art / "status.json") or {}
    workload = None
    if status.get("started_at") and status.get("ended_at"):
        workload = status["ended_at"] - status["started_at"]
    try:
        cost = held / 3600.0 * hourly_price(cell.machine_json)
    except PricingError as e:  # checked at plan time; a release must not fail over a price
        log.warning("no cost recorded: %s", e)
        cost = None
    results_store().upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell.id,
        fence=ref.fence,
        teardown_at=utcnow(),
        resource_held_seconds=held,
        workload_seconds=workload,
        cost=cost,
    )
    record = {
        **machine_key(resource),
        "step": step,
        "at": ended,
        "held_seconds": held,
        "workload_seconds": workload,
    }
    art.mkdir(parents=True, exist_ok=True)
    (art / RELEASED).write_text(json.dumps(record))
    log.info(
        "tore down %s; resource held %.1f s, workload ran %s s",
        resource.name,
        held,
        f"{workload:.1f}" if workload is not None else "-",
    )
    return {"held_seconds": held, "workload_seconds": workload}
