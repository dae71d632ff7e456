"""Clearing one failed cell re-runs that cell only, on a real scheduler.

Airflow 3.3.2 widens a clear of one mapped task to the setup and teardown tasks of every
map index of its group (shared notes): the dry run below shows it. accelmatrix's provision
step skips itself for cells that were only swept up by that widening (accelmatrix.cleanup.clearing),
so the other cells get no second machine (which nothing would tear down: their teardowns
are not selected) and keep their results. The cleared cell gets exactly one new machine and one results row.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from accelmatrix.cleanup.clearing import pending_machine_steps
from accelmatrix.contracts.run_records import CellRecord
from accelmatrix_testkit import AirflowStack

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "clear_one"
GROUP = "cpu"

SUITE = """
description: three cells, one fails until its marker file exists
axes:
  x:
    a: {n: 1}
    b: {n: 2}
    c: {n: 3}
machines:
  cpu:
    backend: local
machine: cpu
workload:
  setup:
    - ["${python}", "SCRIPT", "setup", "${work_dir}"]
  run: ["${python}", "SCRIPT", "run", "${work_dir}", "${axis.x}", "MARKER"]
  timeout: 60
"""

# Setup leaves a file on the machine that the run needs (as a pip install would). Cell b
# exits 3 until the marker exists: the test creates it before clearing the cell, as an
# engineer fixes a flaky dependency and re-runs the one red cell.
SCRIPT = """
import pathlib, sys
step, work = sys.argv[1], pathlib.Path(sys.argv[2])
if step == "setup":
    (work / "deps-installed").write_text("ok")
    sys.exit(0)
cell, marker = sys.argv[3], pathlib.Path(sys.argv[4])
if not (work / "deps-installed").exists():
    print(f"cell {cell}: setup did not run on this machine", flush=True)
    sys.exit(4)
if cell == "b" and not marker.exists():
    print(f"cell {cell}: dependency missing ({marker})", flush=True)
    sys.exit(3)
print(f"cell {cell}: ok", flush=True)
"""


def test_pending_machine_steps():
    done = {"g.setup": "success", "g.run": "failed", "g.collect": "success"}
    assert pending_machine_steps(done, "g") == []
    assert pending_machine_steps({**done, "g.run": None}, "g") == ["run"]
    assert pending_machine_steps({**done, "g.collect": "scheduled"}, "g") == ["collect"]
    # A provision retry: nothing downstream ran yet.
    assert pending_machine_steps({}, "g") == ["setup", "run", "collect"]
    # Evaluation needs no machine: clearing evaluate alone provisions nothing.
    assert pending_machine_steps({**done, "g.evaluate": None}, "g") == []


def _by_cell(tis: list[dict]) -> dict[tuple[str, str], dict]:
    return {
        (ti["task_id"].rsplit(".", 1)[-1], ti["rendered_map_index"]): ti
        for ti in tis
        if ti["map_index"] >= 0
    }


@pytest.mark.integration
@pytest.mark.slow(120)
def test_clearing_one_failed_cell_reruns_only_that_cell(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    script = tmp_path / "flaky.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "dependency-fixed"
    (suites / f"{DAG_ID}.yaml").write_text(
        textwrap.dedent(SUITE).replace("SCRIPT", str(script)).replace("MARKER", str(marker))
    )
    home = tmp_path / "airflow"
    with AirflowStack(
        home=home, dags_folder=ROOT / "dags", suites_dir=suites, parallelism=8
    ) as stack:
        stack.create_pool(f"accelmatrix_{GROUP}", 3, include_deferred=True)
        run_id = stack.trigger(DAG_ID)
        assert stack.wait_for_run(DAG_ID, run_id, timeout=240) == "failed"
        first = _by_cell(stack.task_instances(DAG_ID, run_id))
        assert first[("run", "x=b")]["state"] == "failed", first
        b_index = first[("run", "x=b")]["map_index"]
        store_before = _cells(home, run_id)
        assert store_before["x=b"].state == "run_failed", store_before["x=b"]

        clear = {
            "dag_run_id": run_id,
            "task_ids": [[f"{GROUP}.run", b_index]],
            "include_downstream": True,
            "only_failed": False,
        }
        path = f"dags/{DAG_ID}/clearTaskInstances"
        preview = stack.api("POST", path, json={**clear, "dry_run": True})
        selected = {(t["task_id"], t["map_index"]) for t in preview["task_instances"]}
        # Airflow's own widening: the provision (setup task) of EVERY cell is selected.
        # The other cells' teardowns are not: re-provisioning them would leak a machine
        # per cell, which is why provision must refuse (accelmatrix.cleanup.clearing).
        for cell in first.values():
            if cell["task_id"] == f"{GROUP}.provision":
                assert (cell["task_id"], cell["map_index"]) in selected, selected
        print("clear of one cell selects:", sorted(selected))
        # ... while the other cells' work is not.
        assert not any(t == f"{GROUP}.run" and i != b_index for t, i in selected), selected

        marker.write_text("fixed\n")
        stack.api("POST", path, json={**clear, "dry_run": False})
        deadline = time.monotonic() + 30
        while stack.get_run(DAG_ID, run_id)["state"] == "failed":
            assert time.monotonic() < deadline, "the cleared run never left 'failed'"
            time.sleep(0.5)
        state = stack.wait_for_run(DAG_ID, run_id, timeout=240)
        after = _by_cell(stack.task_instances(DAG_ID, run_id))
        raced = stack.stale_success_failures()
        logs = {
            cell: stack.task_log(
                DAG_ID,
                run_id,
                f"{GROUP}.provision",
                map_index=after[("provision", cell)]["map_index"],
                try_number=after[("provision", cell)]["try_number"],
            )
            for cell in ("x=a", "x=b", "x=c")
        }
    assert stack.leftovers == []
    summary = "\n".join(f"{k}: {v['state']} try {v['try_number']}" for k, v in after.items())
    # Airflow 3.3.2's defer/resume race (tests/test_real_scheduler.py): named, never tolerated.
    summary += f"\nscheduler's stale-success failures (defer/resume race): {sorted(raced)}"

    # The cleared cell: provisioned again (one new machine), ran, passed, torn down.
    assert after[("provision", "x=b")]["state"] == "success", summary
    assert after[("provision", "x=b")]["try_number"] == 2, summary
    assert after[("teardown", "x=b")]["state"] == "success", summary
    assert after[("run", "x=b")]["state"] == "success", summary
    assert state == "success", summary
    # Clearing run (with downstream) does not clear setup, upstream of it; the new machine
    # is set up by provision itself, or the run would exit 4.
    assert "provisioning again: this cell's run, collect will run" in logs["x=b"], logs["x=b"]
    assert "the setup step was not cleared: setting up the new machine" in logs["x=b"]

    # The others: no second machine, their earlier work untouched.
    for cell in ("x=a", "x=c"):
        assert after[("provision", cell)]["state"] == "skipped", summary
        teardown = after[("teardown", cell)]
        if (teardown["task_id"], teardown["map_index"]) in selected:
            assert teardown["state"] == "skipped", summary  # its only setup was skipped
        else:
            assert teardown["try_number"] == first[("teardown", cell)]["try_number"], summary
        for step in ("setup", "run", "collect", "evaluate"):
            assert after[(step, cell)]["try_number"] == first[(step, cell)]["try_number"]
            assert after[(step, cell)]["state"] == first[(step, cell)]["state"], summary
        assert "this cell was not cleared" in logs[cell], logs[cell][-2000:]

    # One results row per cell; the untouched cells' rows are what they were.
    store_after = _cells(home, run_id)
    assert sorted(store_after) == ["x=a", "x=b", "x=c"]
    assert store_after["x=b"].state == "passed", store_after["x=b"]
    assert store_after["x=b"].provisioned_at > store_before["x=b"].provisioned_at
    for cell in ("x=a", "x=c"):
        assert store_after[cell].state == "passed"
        assert store_after[cell].provisioned_at == store_before[cell].provisioned_at
        assert store_after[cell].teardown_at == store_before[cell].teardown_at

    # Nothing left on the machine: every work dir of the run is gone.
    work = home / "accelmatrix" / "work" / DAG_ID
    assert not any(p.is_dir() for p in work.glob("*/*")), list(work.glob("*/*"))


def _cells(home: Path, run_id: str) -> dict[str, CellRecord]:
    from accelmatrix.results.store import ResultsStore

    store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
    try:
        return {c.cell_id: c for c in store.get_cells(DAG_ID, run_id)}
    finally:
        store.close()
