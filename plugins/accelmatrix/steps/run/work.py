"""run: turn what WorkloadTrigger saw (exit, timeout, hang, infrastructure) into the cell's
run state, and release the machine once that state is final. The watching itself is in
steps/run/operator.py and steps/run/trigger.py."""

from __future__ import annotations

import logging

from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.cleanup.stopped import STOPPED
from accelmatrix.contracts.machine_records import JobHandle, MachineResource
from accelmatrix.contracts.step_events import WorkloadEvent
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.artifacts import fetch_artifacts, fetched_artifacts
from accelmatrix.steps.common import RunRef, utcnow
from accelmatrix.steps.release import release_machine, released_by

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def record_run_outcome(
    cell: CellSpec, ref: RunRef, event: WorkloadEvent, handle: JobHandle | None
) -> tuple[str, str]:
    """Turn a WorkloadTrigger event into the cell's run state; kill what must be killed.

    Called once per outcome: by the trigger before it fires, or by the run task when the
    workload ended within its inline wait or the trigger could not record it. Idempotent
    all the same: a retried task may record the same outcome again.
    """
    status = event.status
    exit_code = event.exit_code
    if status in ("timeout", "hung") and handle:
        _kill(cell, handle)
    expected = cell.expected_exit
    if status == "timeout":
        state = CellState.TIMED_OUT
        msg = f"workload timed out after {cell.workload.timeout} s and was killed"
    elif status == "hung":
        state, msg = CellState.HUNG, f"workload {event.detail}; it was killed"
    elif status == "infra_failed":
        state, msg = CellState.INFRA_FAILED, f"infrastructure failure: {event.detail}"
    elif exit_code != expected:
        state = CellState.RUN_FAILED
        msg = f"workload exited with {exit_code}, expected {expected} ({event.detail})"
    else:
        state, msg = CellState.RAN, f"workload exited {exit_code} as expected"
    store = results_store()
    row = store.get_cell(ref.dag_id, ref.run_id, cell.id)
    if row is not None and row.state == STOPPED:
        # The run was stopped from outside and the teardown killed the workload before the
        # trigger heard of it: the exit it saw is the kill's, not the workload's verdict.
        log.warning("%s: stays cancelled (%s); the exit seen was %s", cell.id, row.message, msg)
        return STOPPED, row.message or msg
    store.upsert_cell(
        ref.dag_id,
        ref.run_id,
        cell.id,
        fence=ref.fence,
        run_ended_at=utcnow(),
        exit_code=exit_code,
        state=state,
        message="" if state == CellState.RAN else msg,
    )
    return state, msg


def _kill(cell: CellSpec, handle: JobHandle) -> None:
    """Stop a timed-out or hung workload. When this is the second recording (the task
    resumed after its trigger), the trigger already killed it and may have released the
    machine: a kill that cannot reach a machine that is gone is not a failure of the step,
    and a machine that is still there is released by run or teardown with its workload."""
    try:
        get_backend(cell.machine_spec).cancel(handle)
    except Exception as e:
        _not_fatal(f"could not stop the workload of {cell.id}; releasing its machine stops it", e)


def _not_fatal(message: str, error: Exception) -> None:
    """Log a failure that must not change the run's verdict (a later step does the work)."""
    log.warning("%s (%s: %s)", message, type(error).__name__, error)


# Outcomes after which the cell's machine has nothing more to do: the workload passed, or
# failed as a test failure (never retried). An infrastructure failure keeps its machine for
# a retry (teardown releases it when there is none); a cancelled cell is the teardown's.
FINAL_RUN_STATES = frozenset(
    {CellState.RAN, CellState.RUN_FAILED, CellState.TIMED_OUT, CellState.HUNG}
)


def finish_run(
    cell: CellSpec, resource: MachineResource, ref: RunRef, state: str
) -> dict[str, float] | None:
    """Fetch the artifacts and release the machine as soon as the workload's outcome is final.

    Without this the machine would wait, idle, for two more task starts (collect, then
    teardown): on a busy scheduler that is most of the time a cell holds its accelerator.
    The teardown task still runs and makes sure the machine is gone. Never raises: the run's
    verdict is the workload's; if fetching or releasing fails here, collect and teardown do
    it again (and fail loudly if it still does not work). Idempotent.
    """
    if state not in FINAL_RUN_STATES or not resource.name:
        return None
    if released_by(cell, resource, ref) is not None:  # the trigger did, before a resume
        return None
    try:
        if fetched_artifacts(cell, resource, ref) is None:
            fetch_artifacts(cell, resource, ref)
    except Exception as e:
        _not_fatal(f"could not collect the artifacts of {cell.id}; keeping the machine", e)
        return None
    try:
        return release_machine(cell, resource, ref, step="run")
    except Exception as e:
        _not_fatal(f"could not release {resource.name}; the teardown task will", e)
        return None
