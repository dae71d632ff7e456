"""teardown: release the cell's machine (a cut-short cell gets its verdict first) and record
how long it was held and what it cost."""

from __future__ import annotations

import logging
import time
from typing import Any

from accelmatrix.backends.base import get_backend
from accelmatrix.lifecycle.common import RunRef, _read_json, utcnow
from accelmatrix.store_access import results_store

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def teardown(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    backend = get_backend(cell["machine_spec"])
    # Before the machine goes: a trigger still watching a cut-short workload would otherwise
    # see the teardown's kill as the workload's exit and record it as a failure.
    _settle_cut_short(cell, ref, resource)
    backend.teardown(resource)
    ended = time.time()
    held = ended - float(resource["created_at"])
    status = _read_json(ref.artifacts(cell["id"]) / "status.json") or {}
    workload = None
    if status.get("started_at") and status.get("ended_at"):
        workload = status["ended_at"] - status["started_at"]
    from accelmatrix.pricing import PricingError, hourly_price

    try:
        cost = held / 3600.0 * hourly_price(cell["machine_spec"])
    except PricingError as e:  # checked at plan time; teardown must not fail over a price
        log.warning("no cost recorded: %s", e)
        cost = None
    results_store().upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        teardown_at=utcnow(),
        resource_held_seconds=held,
        workload_seconds=workload,
        cost=cost,
    )
    log.info(
        "tore down %s; resource held %.1f s, workload ran %s s",
        resource["name"],
        held,
        f"{workload:.1f}" if workload is not None else "-",
    )
    return {"held_seconds": held, "workload_seconds": workload}


def _settle_cut_short(cell: dict[str, Any], ref: RunRef, resource: dict[str, Any]) -> None:
    """A cell whose work ended without an outcome (its run marked failed from outside, its
    worker killed) gets a verdict here, before its machine goes: see accelmatrix.stopped."""
    from accelmatrix import stopped

    row = results_store().get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    if row.get("state") not in stopped.IN_FLIGHT:
        return
    states = {}
    if ref.task_group is not None and ref.map_index is not None:
        states = stopped.owner_states(ref.dag_id, ref.run_id, ref.task_group, ref.map_index)
    message = (
        f"stopped before it finished ({stopped.describe(states)}; was {row['state']}); "
        f"machine {resource['name']} and its workload torn down by the cell's teardown"
    )
    if stopped.settle_cell(results_store(), ref.dag_id, ref.run_id, cell["id"], message):
        log.warning("cell %s: %s", cell["id"], message)
