"""``run`` releases a cell's machine as soon as the workload's outcome is final.

Real cells on the local backend through the lifecycle functions the tasks call (real
workload processes, the SQLite results store): the machine (the cell's work dir) is gone
after ``finish_run``, collect reads the copy ``run`` made, teardown only checks and keeps the
held time ``run`` recorded; an infrastructure failure keeps its machine for the retry; a
failed copy keeps the machine for collect; a new machine for the cell starts clean.
"""

from __future__ import annotations

import logging
from pathlib import Path

from test_step_failures import _run, _suite

from accelmatrix import lifecycle
from accelmatrix.cell_state import CellState


def _cell(tmp_path: Path, name: str):
    suite = _suite(tmp_path, name, "m.json", '{"loss": 0.25}', "{type: json, path: out/m.json}")
    ref = lifecycle.RunRef(dag_id=name, run_id=f"manual__{name}")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    return cell, ref


def _row(cell, ref):
    return lifecycle.results_store().get_cell(ref.dag_id, ref.run_id, cell.id)


def test_a_passing_cell_is_released_by_run_and_teardown_only_checks(accel_home, tmp_path, caplog):
    cell, ref = _cell(tmp_path, "released")
    resource = _run(cell, ref)
    work = Path(resource.work_dir)
    assert work.is_dir()

    held = lifecycle.finish_run(cell, resource, ref, CellState.RAN)
    assert held is not None and held["held_seconds"] > 0
    assert not work.exists()  # the machine is gone before collect and teardown ran
    row = _row(cell, ref)
    assert row.teardown_at is not None
    assert row.resource_held_seconds == held["held_seconds"]
    art = ref.artifacts(cell.id)
    assert (art / "files" / "out" / "m.json").read_text() == '{"loss": 0.25}'

    # collect reads the copy: the machine is gone, the metric is stored all the same.
    assert lifecycle.collect(cell, resource, ref)["metrics"] >= 1
    metrics = lifecycle.results_store().metrics_frame(ref.dag_id, ref.run_id)
    assert dict(zip(metrics.name, metrics.value, strict=False))["loss"] == 0.25

    # A second finish (a resumed task after its trigger released) does nothing.
    assert lifecycle.finish_run(cell, resource, ref, CellState.RAN) is None
    with caplog.at_level(logging.INFO, logger="accelmatrix.lifecycle"):
        lifecycle.teardown(cell, resource, ref)
    assert "was released by run" in caplog.text
    assert _row(cell, ref).resource_held_seconds == held["held_seconds"]  # not re-recorded


def test_an_infrastructure_failure_keeps_the_machine_for_the_retry(accel_home, tmp_path):
    cell, ref = _cell(tmp_path, "infra")
    resource = _run(cell, ref)
    assert lifecycle.finish_run(cell, resource, ref, CellState.INFRA_FAILED) is None
    assert Path(resource.work_dir).is_dir()
    assert _row(cell, ref).teardown_at is None
    lifecycle.collect(cell, resource, ref)  # collect copies from the machine itself
    lifecycle.teardown(cell, resource, ref)  # and teardown releases it
    assert not Path(resource.work_dir).exists()
    assert _row(cell, ref).resource_held_seconds > 0


def test_a_failed_copy_keeps_the_machine_for_collect(accel_home, tmp_path):
    cell, ref = _cell(tmp_path, "nocopy")
    resource = _run(cell, ref)
    files = ref.artifacts(cell.id) / "files"
    files.write_text("in the way")  # the copy fails
    assert lifecycle.finish_run(cell, resource, ref, CellState.RAN) is None
    assert Path(resource.work_dir).is_dir()  # not released: its artifacts are not safe
    files.unlink()
    assert lifecycle.collect(cell, resource, ref)["artifacts"] == 1
    lifecycle.teardown(cell, resource, ref)
    assert not Path(resource.work_dir).exists()


def test_a_new_machine_for_the_cell_starts_without_the_old_markers(accel_home, tmp_path):
    """A cleared cell provisions again under the same name: collect must copy from the new
    machine, and its release must be recorded, not taken for the old one's."""
    cell, ref = _cell(tmp_path, "again")
    first = _run(cell, ref)
    lifecycle.finish_run(cell, first, ref, CellState.RAN)
    second = _run(cell, ref)  # provisions again: the markers of the first are removed
    assert second.name == first.name
    assert lifecycle.released_by(cell, second, ref) is None
    (Path(second.work_dir) / "out" / "m.json").write_text('{"loss": 0.5}')
    lifecycle.collect(cell, second, ref)
    metrics = lifecycle.results_store().metrics_frame(ref.dag_id, ref.run_id)
    assert dict(zip(metrics.name, metrics.value, strict=False))["loss"] == 0.5
    lifecycle.teardown(cell, second, ref)
    assert not Path(second.work_dir).exists()
    assert lifecycle.released_by(cell, second, ref)["step"] == "teardown"
