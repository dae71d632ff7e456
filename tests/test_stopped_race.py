"""A cell cut short from outside stays ``cancelled`` even when its trigger outlives the marking.

"Mark run as failed" fails the deferred run task, and the triggerer cancels the task's
WorkloadTrigger at its next sync. On a loaded machine the cell's teardown can start first
and kill the workload while the trigger is still watching it: the trigger then sees an exit
(-15) and, before this fix, recorded ``run_failed`` over the cut-short cell (CI saw it once
in tests/test_run_marked_failed.py). Here the real trigger loop runs while the real teardown
kills the real workload, so the order that raced in CI happens every time.
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time

from accelmatrix import lifecycle
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.contracts.step_events import WorkloadEvent
from accelmatrix.steps.run.trigger import WorkloadTrigger

SUITE = """
description: one cell whose workload would tick for a minute
axes:
  n: {a: 1}
machines:
  cpu: {backend: local}
machine: cpu
workload:
  setup: []
  run: ["${python}", "-c", "import time\\nfor i in range(600): print('tick', i, flush=True); time.sleep(0.1)"]
  timeout: 300
"""


def test_teardown_before_the_trigger_hears_of_it_leaves_the_cell_cancelled(accel_home, tmp_path):
    suite = tmp_path / "race_me.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    ref = lifecycle.RunRef(dag_id="race_me", run_id="manual__race")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    resource = lifecycle.begin_provision(cell, ref)
    backend = get_backend(cell.machine_json)
    store = lifecycle.results_store()
    store.upsert_cell(ref.dag_id, ref.run_id, cell.id, state="running")
    handle = backend.submit(resource, ["python3", "-c", "import time; time.sleep(60)"], {})
    trigger = WorkloadTrigger(
        handle=handle,
        deadline=time.time() + 120,
        poll_interval=0.05,
        started_at=time.time(),
        cell=cell,
        dag_id=ref.dag_id,
        run_id=ref.run_id,
    )

    async def watch() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    torn_down = threading.Timer(0.5, lifecycle.teardown, (cell, resource, ref))
    torn_down.start()
    started = time.monotonic()
    event = asyncio.run(asyncio.wait_for(watch(), 30))
    torn_down.join()

    assert time.monotonic() - started < 20, "the teardown did not stop the workload"
    # The trigger saw the kill as an exit ...
    assert event["status"] == "exited" and event["exit_code"] != 0, event
    # ... and the cell still says what happened: stopped, not a failing workload.
    row = store.get_cell(ref.dag_id, ref.run_id, cell.id)
    assert row.state == "cancelled", row
    assert "stopped before it finished" in row.message, row.message
    assert row.teardown_at is not None
    # The resumed task (if 3.3.2 ever runs it) agrees, and records nothing over it.
    outcome = WorkloadEvent.from_json(event)
    assert lifecycle.record_run_outcome(cell, ref, outcome, handle)[0] == "cancelled"
    assert store.get_cell(ref.dag_id, ref.run_id, cell.id).state == "cancelled"


def test_a_workload_that_fails_on_its_own_is_still_run_failed(accel_home, tmp_path):
    """The guard is for cut-short cells only: an ordinary failure is recorded as before."""
    suite = tmp_path / "race_me.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    ref = lifecycle.RunRef(dag_id="race_me", run_id="manual__plain")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    lifecycle.results_store().upsert_cell(ref.dag_id, ref.run_id, cell.id, state="running")
    event = WorkloadEvent(status="exited", exit_code=3, detail="exit 3")
    assert lifecycle.record_run_outcome(cell, ref, event, None)[0] == "run_failed"
    row = lifecycle.results_store().get_cell(ref.dag_id, ref.run_id, cell.id)
    assert row.state == "run_failed" and row.exit_code == 3
