"""A run, or one of its tasks, stopped from outside: "Mark as failed/success", a deleted run.

Nothing may leak when a person stops a run half way, and the results must say what happened.
What Airflow 3.3.2 does (read in its source, checked on a real scheduler and triggerer by
tests/test_run_marked_failed.py):

* ``PATCH /api/v2/dags/D/dagRuns/R {"state": "failed"}`` (the UI's "Mark run as failed"):
  running and deferred task instances become ``failed`` (``success`` for "Mark as success"),
  every other unfinished one ``skipped``, *except teardown tasks*, which are left to run; as
  long as one is pending the run stays ``running`` (api/common/mark_tasks.py
  ``_set_dag_run_terminal_state``). So each provisioned cell's ``teardown`` still runs.
  But with an ordinary gate the run then ended ``success``: the gate (its only leaf) was
  skipped, and failed run tasks are no leaves. The gate is therefore a teardown task with
  ``on_failure_fail_dagrun`` (dag_factory.py): it survives the marking, runs after every
  cell's teardown, settles the results and keeps the run red.
* A deferred task acted on by a person (mark failed/success, clear) or whose run was deleted
  has its trigger cancelled with Airflow's "user action" message, and the triggerer awaits
  the trigger's ``on_kill()`` (jobs/triggerer_job_runner.py ``run_trigger``; bounded by
  ``[triggerer] on_kill_timeout``, 30 s). Not on a triggerer restart, a deferral timeout or
  a normal exit; ``cleanup()`` runs on every exit and must never stop a workload.
  ``WorkloadTrigger.on_kill`` stops the workload at once (its log goes to the run task's
  log) instead of letting it burn the machine until the teardown.
* The listener hook ``on_dag_run_failed`` fires inside the api-server's request and on
  every ordinary failure in the scheduler: the wrong place to delete machines. A DAG's
  ``on_failure_callback`` runs in the dag-processor only when the scheduler finishes the
  run, not when a person sets the state. Neither is used.

Cells whose work was cut short end in state ``cancelled`` (a red cell: it did not pass)
with a message naming what stopped it, so the gate, the grid and the history agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from accelmatrix.airflow_state import SdkOwnerLookup
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.cell_state import IN_FLIGHT, CellState
from accelmatrix.contracts.machine_records import JobHandle
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec

log = logging.getLogger(__name__)

STOPPED = CellState.CANCELLED
# IN_FLIGHT (from accelmatrix.cell_state): a cell still in one of these once its tasks are
# over was cut short (or its worker died) and never got a verdict.
__all__ = ["IN_FLIGHT", "STOPPED", "describe", "owner_states", "settle_cell"]


def describe(states: dict[str, str | None]) -> str:
    """``run=failed, collect=skipped`` from ``{"cpu.run": "failed", ...}`` (teardowns left out)."""
    parts = [
        f"{task.rsplit('.', 1)[-1]}={state or 'none'}"
        for task, state in sorted(states.items())
        if not task.endswith(".teardown")
    ]
    return ", ".join(parts) or "task states unknown"


def settle_cell(store: Any, dag_id: str, run_id: str, cell_id: str, message: str) -> bool:
    """Record ``cell_id`` as cancelled with ``message`` if it has no verdict yet.

    Idempotent and never overwrites an outcome a step already recorded (a workload that
    exited, a failed setup): True when it changed the cell.
    """
    row = store.get_cell(dag_id, run_id, cell_id)
    if row is None or row.state not in IN_FLIGHT:
        return False
    fields: dict[str, Any] = {"state": STOPPED, "message": message[:2000]}
    if row.state == CellState.RUNNING:
        fields["run_ended_at"] = datetime.now(UTC)
    store.upsert_cell(dag_id, run_id, cell_id, **fields)
    return True


def owner_states(dag_id: str, run_id: str, task_group: str, map_index: int) -> dict[str, Any]:
    """State of each task of one cell through the Task SDK (inside a task or trigger);
    empty when they cannot be read (under ``dag.test()`` some calls are missing)."""
    try:
        return SdkOwnerLookup().cell_states(dag_id, run_id, task_group, map_index)
    except Exception as e:  # noqa: BLE001 - a description, never a reason to fail cleanup
        log.warning("task states of %s[%s] not readable: %s", task_group, map_index, e)
        return {}


def stop_workload(
    cell: CellSpec,
    dag_id: str,
    run_id: str,
    handle: JobHandle,
    say: Callable[[str], None],
) -> str:
    """What ``WorkloadTrigger.on_kill`` does (blocking: run it in a thread).

    Airflow 3.3.2 calls on_kill only when a person acted on the deferred run task (mark
    failed, mark success, clear) or deleted its run: nothing will resume this wait, so the
    workload is cancelled at once and the cell recorded. After a clear the new attempt
    starts the workload afresh. The task's own state is not asked: the Task SDK calls
    (blocking from a thread, or ``asend``) did not answer from inside on_kill on 3.3.2.
    """
    why = "run task marked failed/success or cleared from outside (REST/UI), or its run deleted"
    say(f"{cell.id}: {why}; cancelling the workload {_handle_name(handle)}")
    get_backend(cell.machine_spec).cancel(handle)
    settle_cell(
        results_store(), dag_id, run_id, cell.id, f"{why}; workload cancelled by its trigger"
    )
    say(f"{cell.id}: workload cancelled; cell recorded as {STOPPED}")
    return f"cancelled: {why}"


def _handle_name(handle: JobHandle) -> str:
    for key in ("pgid", "job_name", "name", "pid"):
        value = getattr(handle, key, None)
        if value:
            return f"{key} {value}"
    return ""
