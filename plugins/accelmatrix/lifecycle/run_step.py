"""run: turn what WorkloadTrigger saw (exit, timeout, hang, infrastructure) into the cell's
run state. The watching itself is in operators/run.py and triggers/workload.py."""

from __future__ import annotations

import logging
from typing import Any

from accelmatrix.backends.base import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.lifecycle.common import RunRef, utcnow
from accelmatrix.store_access import results_store

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def record_run_outcome(
    cell: dict[str, Any], ref: RunRef, event: dict[str, Any], handle: dict[str, Any]
) -> tuple[str, str]:
    """Turn a WorkloadTrigger event into the cell's run state; kill what must be killed.

    Idempotent: called by the trigger before it fires and again by the resumed task.
    """
    status = event.get("status")
    exit_code = event.get("exit_code")
    if status in ("timeout", "hung") and handle:
        get_backend(cell["machine_spec"]).cancel(handle)
    expected = next(
        (int(c.get("expected", 0)) for c in cell["checks"] if c.get("type") == "exit_status"), 0
    )
    if status == "timeout":
        state = CellState.TIMED_OUT
        msg = f"workload timed out after {cell['workload']['timeout']} s and was killed"
    elif status == "hung":
        state, msg = CellState.HUNG, f"workload {event.get('detail')}; it was killed"
    elif status == "infra_failed":
        state, msg = CellState.INFRA_FAILED, f"infrastructure failure: {event.get('detail')}"
    elif exit_code != expected:
        state = CellState.RUN_FAILED
        msg = f"workload exited with {exit_code}, expected {expected} ({event.get('detail')})"
    else:
        state, msg = CellState.RAN, f"workload exited {exit_code} as expected"
    store = results_store()
    row = store.get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    from accelmatrix.stopped import STOPPED

    if row.get("state") == STOPPED:
        # The run was stopped from outside and the teardown killed the workload before the
        # trigger heard of it: the exit it saw is the kill's, not the workload's verdict.
        log.warning(
            "%s: stays cancelled (%s); the exit seen was %s", cell["id"], row.get("message"), msg
        )
        return STOPPED, row.get("message") or msg
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell["id"],
        run_ended_at=utcnow(),
        exit_code=exit_code,
        state=state,
        message="" if state == CellState.RAN else msg,
    )
    return state, msg
