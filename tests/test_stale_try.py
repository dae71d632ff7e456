"""A superseded task try cannot move a cell's row back.

The fault matrix's api-server row once ended a passing k8s-job cell as ``cancelled``: the
first ``provision`` try's Execution API calls outlasted the api-server restart, Airflow
started a second try, and the cell went on to run and collect. The first try, told to stop
but not yet killed, then wrote ``state=provisioning``; teardown found the row back in flight
and settled the cell as cut short. Each step's write now carries its task try, and the
store refuses a write from a try older than one that has written the cell.

Real lifecycle steps on the local backend with the SQLite results store, each step under
its own task id and try number, in the order that run saw.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path

import msgspec
import pytest
from test_step_failures import _evaluate, _suite, run_workload

from accelmatrix import lifecycle
from accelmatrix.results.fence import StepTry, SupersededTry
from accelmatrix.results.store import ResultsStore

pytest_plugins = ["celery_services"]


def _step(ref: lifecycle.RunRef, task: str, try_number: int) -> lifecycle.RunRef:
    """The ref a task try of the cell's group sees (RunRef.from_context)."""
    return dataclasses.replace(
        ref, task_id=f"cell.{task}", try_number=try_number, task_group="cell", map_index=0
    )


def _row(cell, ref):
    return lifecycle.results_store().get_cell(ref.dag_id, ref.run_id, cell.id)


def _planned(tmp_path: Path, name: str):
    suite = _suite(tmp_path, name, "m.json", '{"loss": 0.25}', "{type: json, path: out/m.json}")
    ref = lifecycle.RunRef(dag_id=name, run_id=f"manual__{name}")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    return cell, ref


def _run_and_collect(cell, ref: lifecycle.RunRef, resource: dict) -> None:
    """setup, run to its exit, release and collect, each as its own task's first try."""
    lifecycle.setup(cell, resource, _step(ref, "setup", 1))
    run = _step(ref, "run", 1)
    run_workload(cell, resource, run)
    lifecycle.finish_run(cell, resource, run, "ran")
    lifecycle.collect(cell, resource, _step(ref, "collect", 1))


def test_a_stale_provision_try_after_collect_leaves_the_cell_passing(accel_home, tmp_path):
    cell, ref = _planned(tmp_path, "stale")
    resource = lifecycle.begin_provision(cell, _step(ref, "provision", 2))
    _run_and_collect(cell, ref, resource)
    before = _row(cell, ref)
    assert before.state == "ran" and before.teardown_at is not None

    # Try 1 of provision wakes up after its Execution API calls waited out the restart.
    with pytest.raises(SupersededTry) as refused:
        lifecycle.begin_provision(cell, _step(ref, "provision", 1))
    assert "try 1 of task cell.provision" in str(refused.value)
    assert "try 2 has written" in str(refused.value)
    after = _row(cell, ref)
    assert msgspec.structs.replace(after, updated_at=None) == msgspec.structs.replace(
        before, updated_at=None
    )

    # So teardown finds nothing cut short, and evaluate passes the cell.
    lifecycle.teardown(cell, resource, _step(ref, "teardown", 1))
    assert _row(cell, ref).state == "ran"
    assert _evaluate(cell, _step(ref, "evaluate", 1)) == "passed"


def test_the_fence_is_per_task_and_lets_the_same_or_a_newer_try_write(accel_home, tmp_path):
    cell, ref = _planned(tmp_path, "fence")
    store = lifecycle.results_store()
    key = (ref.dag_id, ref.run_id, cell.id)
    store.upsert_cell(*key, fence=StepTry("cell.run", 2), state="running")
    # The same try writes again (a deferred task resumes with its try number).
    store.upsert_cell(*key, fence=StepTry("cell.run", 2), state="ran")
    # Another task's first try is not fenced by run's second.
    store.upsert_cell(*key, fence=StepTry("cell.collect", 1), state="collected")
    # A cleared task's next try writes.
    store.upsert_cell(*key, fence=StepTry("cell.run", 3), message="again")
    with pytest.raises(SupersededTry):
        store.upsert_cell(*key, fence=StepTry("cell.run", 2), state="run_failed")
    assert _row(cell, ref).state == "collected"
    assert _row(cell, ref).message == "again"
    # Unfenced writers (plan, the gate, the janitor) are not refused.
    store.upsert_cell(*key, state="passed")
    assert _row(cell, ref).state == "passed"


def test_a_run_planned_again_starts_its_fences_afresh(accel_home, tmp_path):
    """A run re-created under the same run_id numbers its tries from 1 again."""
    cell, ref = _planned(tmp_path, "again")
    store = lifecycle.results_store()
    store.upsert_cell(ref.dag_id, ref.run_id, cell.id, fence=StepTry("cell.provision", 3))
    (cell,) = lifecycle.plan_run(str(tmp_path / "again.yaml"), ref, {})
    lifecycle.begin_provision(cell, _step(ref, "provision", 1))
    assert _row(cell, ref).state == "provisioned"


def test_racing_tries_on_postgresql_end_with_the_newest_trys_write(results_postgres):
    """Tries of one task writing at once (PostgreSQL, a connection each), in shuffled
    order, over several cells: every row ends as its newest try wrote it, and the older
    tries that came after it were refused."""
    store = ResultsStore(results_postgres.url("accelmatrix"))
    store.ensure_schema()
    rng = random.Random(7)
    try:
        for cell in range(6):
            key = ("race_dag", "run_1", f"n={cell}")
            store.upsert_cell(*key, state="planned")
            tries = list(range(1, 13))
            rng.shuffle(tries)
            start = threading.Barrier(len(tries))
            refused: list[int] = []

            def write(n: int, key=key, start=start, refused=refused) -> None:
                start.wait()
                try:
                    store.upsert_cell(*key, fence=StepTry("cell.run", n), state=f"try {n}")
                except SupersededTry:
                    refused.append(n)

            threads = [threading.Thread(target=write, args=(n,)) for n in tries]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert store.get_cell(*key).state == "try 12", (tries, sorted(refused))
            assert 12 not in refused
            with pytest.raises(SupersededTry):
                store.upsert_cell(*key, fence=StepTry("cell.run", 11), state="late")
    finally:
        store.close()
