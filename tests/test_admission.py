"""Admission on a real Airflow: a machine is created only when Airflow can drive its cell.

With ``ACCELMATRIX_CELLS_BETWEEN_STEPS=2`` and 8 executor slots, a run of 8 cells must not
create 8 machines at once (which is what Airflow does without admission: all 8 provisions
are schedulable together). The provisions that find the run full defer; their trigger
admits them as cells leave, provisions and ends the task itself (one worker start). The run
is green, every cell passed, nothing is left.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import yaml

from accelmatrix.testing import AirflowStack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
POOL = "accelmatrix_cpu"
CAP = 2
CELLS = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admission")
    suites = tmp / "suites"
    suites.mkdir()
    suite = {
        "description": "8 short cells, admitted two between steps at a time",
        "schedule": None,
        "axes": {"i": list(range(CELLS))},
        "machines": {"cpu": {"backend": "local", "pool": POOL, "pool_slots": 16}},
        "machine": "cpu",
        "workload": {
            "run": ["${python}", "-c", "import time; time.sleep(1); print('Finished')"],
            "timeout": 120,
        },
        "checks": [{"type": "log_contains", "pattern": "Finished"}],
    }
    (suites / "admit8.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    with AirflowStack(
        home=tmp / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=suites,
        parallelism=8,
        env_extra={"ACCELMATRIX_CELLS_BETWEEN_STEPS": str(CAP)},
    ) as s:
        s.create_pool(POOL, 16, include_deferred=True)
        s.wait_for_dag("admit8")
        yield s


def _peak(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    open_, peak = 0, 0
    for _, step in edges:  # an end sorts before a start at the same instant
        open_ += step
        peak = max(peak, open_)
    return peak


def test_machines_created_only_when_airflow_can_drive_them(stack):
    from accelmatrix.results.store import ResultsStore

    run_id = stack.trigger("admit8")
    state = stack.wait_for_run("admit8", run_id, timeout=400)
    tis = stack.task_instances("admit8", run_id)
    summary = "\n".join(
        f"{ti['task_id']}[{ti['rendered_map_index']}] {ti['state']} try {ti['try_number']}"
        for ti in tis
    )
    assert state == "success", summary
    assert {ti["state"] for ti in tis} == {"success"}, summary

    store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
    try:
        cells = store.get_cells("admit8", run_id)
    finally:
        store.close()
    assert len(cells) == CELLS and {c["state"] for c in cells} == {"passed"}, cells
    held = [(c["provisioned_at"], c["teardown_at"]) for c in cells]
    assert all(a and b for a, b in held), cells
    # Without admission all 8 machines exist at once (8 provisions on 8 free slots).
    peak = _peak(held)
    print(f"machines held at once: at most {peak} of {CELLS}")
    assert peak < CELLS, held

    # Some provisions found the run full: they deferred, were admitted in the triggerer,
    # which provisioned and ended them (no second worker start).
    provisions = [ti for ti in tis if ti["task_id"] == "cpu.provision"]
    waited = 0
    for ti in provisions:
        log = stack.task_log("admit8", run_id, ti["task_id"], map_index=ti["map_index"])
        if "before creating this one" not in log:
            continue
        waited += 1
        assert "admitted after" in log, log[-3000:]
        assert log.count("::group::Pre Execute") == 1, log[-3000:]
    assert waited >= 1, "no provision waited for admission"
    assert not list((stack.accel_home / "work" / "admit8").rglob("resource.json"))
