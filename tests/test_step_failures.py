"""A cell is ``passed`` only when every step of its life succeeded, and cells never mix.

Each test drives real cells through the real lifecycle functions on the local backend
(real workload processes, the runner's sampler, the SQLite results store, Great
Expectations): the same code the DAG's tasks call, without a scheduler in the way.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from accelmatrix import lifecycle, settings
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.contracts.step_events import WorkloadEvent
from accelmatrix.spec.templating import render_tree
from accelmatrix_testkit import records

SUITE = """
description: one cell whose workload writes the metrics file given in argv
axes:
  n: {a: 1}
machines:
  cpu: {backend: local}
machine: cpu
workload:
  setup: []
  run: ["${python}", "-c", "import os, sys; os.makedirs('out', exist_ok=True); open('out/' + sys.argv[1], 'w').write(sys.argv[2]); print('done')", "%(file)s", %(content)s]
  timeout: 120
  artifacts: ["out/**"]
  metrics: [%(metrics)s]
checks:
  - {type: log_contains, pattern: done}
"""


def _suite(tmp_path: Path, name: str, file: str, content: str, metrics: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    text = SUITE % {"file": file, "content": json.dumps(content), "metrics": metrics}
    path.write_text(textwrap.dedent(text))
    return path


def _run(cell: dict[str, Any], ref: lifecycle.RunRef) -> dict[str, Any]:
    """provision, setup and run one cell to its exit; returns the resource."""
    resource = lifecycle.begin_provision(cell, ref)
    lifecycle.setup(cell, resource, ref)
    run_workload(cell, resource, ref)
    return resource


def run_workload(cell: dict[str, Any], resource: dict[str, Any], ref: lifecycle.RunRef) -> None:
    """Run the cell's workload on ``resource`` to its exit and record the outcome (``ran``)."""
    backend = get_backend(cell.machine_json)
    variables = backend.variables(resource)
    argv = render_tree(cell.workload.run, variables)
    handle = backend.submit(resource, argv, lifecycle.workload_env(cell, resource, variables))
    deadline = time.monotonic() + 60
    while not (status := backend.poll(handle)).done:
        assert time.monotonic() < deadline, "workload did not finish"
        time.sleep(0.1)
    event = WorkloadEvent(status="exited", exit_code=status.exit_code, detail=status.detail)
    assert lifecycle.record_run_outcome(cell, ref, event, handle)[0] == "ran"


def _evaluate(cell: dict[str, Any], ref: lifecycle.RunRef) -> str:
    """evaluate and record, as the evaluate task does; the cell's state afterwards."""
    try:
        lifecycle.record_evaluation(cell, ref, lifecycle.run_checks(cell, ref))
    except lifecycle.CellFailed:
        pass
    return lifecycle.results_store().get_cell(ref.dag_id, ref.run_id, cell.id).state


def test_tasks_get_the_planned_cell_from_a_small_reference(accel_home, tmp_path):
    """What Airflow maps over is a reference per cell (id, index, machine), so a task start
    does not fetch the whole plan; each task gets the cell plan decided from the store."""
    suite = _suite(tmp_path, "refs", "m.json", "{}", "")
    ref = lifecycle.RunRef(dag_id="refs", run_id="manual__refs")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    (small,) = lifecycle.cell_refs([cell])
    assert small == {"id": cell.id, "index": 0, "machine": "cpu"}
    assert lifecycle.cell_spec(ref, small) == cell
    assert lifecycle.cell_spec(ref, cell) is cell  # a full cell passes through
    assert lifecycle.planned_cells(ref, [small, cell]) == [cell, cell]
    lifecycle.results_store().reset_run(ref.dag_id, ref.run_id)
    with pytest.raises(
        RuntimeError, match=r"no planned spec for cell 'n=a' of refs / manual__refs"
    ):
        lifecycle.cell_spec(ref, small)


def test_a_workload_metric_named_like_a_sampled_one_is_kept_beside_it(accel_home, tmp_path):
    """Found: `wall_seconds` in the workload's JSON crashed every collect (the sampler emits
    it too). The runner's samples now live in `runner.`: both values are stored."""
    suite = _suite(
        tmp_path, "clash", "m.json", '{"wall_seconds": 2.5, "loss": 0.25}',
        "{type: json, path: out/m.json}",
    )  # fmt: skip
    ref = lifecycle.RunRef(dag_id="clash", run_id="manual__clash")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    resource = _run(cell, ref)
    result = lifecycle.collect(cell, resource, ref)
    assert result["errors"] == []
    metrics = lifecycle.results_store().metrics_frame("clash", ref.run_id)
    values = dict(zip(metrics.name, metrics.value, strict=True))
    assert values["wall_seconds"] == 2.5 and values["loss"] == 0.25
    assert 0 < values["runner.wall_seconds"] < 60
    assert _evaluate(cell, ref) == "passed"
    lifecycle.teardown(cell, resource, ref)
    assert lifecycle.gate([cell], ref)["passed"] == [cell.id]


def test_a_step_logged_twice_is_collapsed_to_its_last_value_not_a_failed_collect(
    accel_home, tmp_path
):
    """A (metric, step) one source logged twice (a resume from a checkpoint): collect keeps
    the last value, says how many rows it collapsed, and the run is judged by its checks;
    a ``steps_complete`` check names the repeated step (tests/test_metrics_tables.py)."""
    lines = '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n{"step": 1, "loss": 0.4}\n'
    suite = _suite(tmp_path, "dup", "m.jsonl", lines, "{type: jsonl, path: out/m.jsonl}")
    ref = lifecycle.RunRef(dag_id="dup", run_id="manual__dup")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    resource = _run(cell, ref)
    result = lifecycle.collect(cell, resource, ref)
    assert result["errors"] == [] and result["collapsed"] == 1
    store = lifecycle.results_store()
    metrics = store.metrics_frame("dup", ref.run_id)
    loss = metrics[metrics.name == "loss"].sort_values("step")
    assert list(loss.value) == [1.0, 0.4]  # the last value of step 1 is kept
    assert (metrics.name == "runner.wall_seconds").any()  # the sampler's rows too
    assert _evaluate(cell, ref) == "passed"
    lifecycle.teardown(cell, resource, ref)
    assert lifecycle.gate([cell], ref)["passed"] == [cell.id]


def test_a_crashed_collect_is_collect_failed_with_the_error(accel_home, tmp_path):
    """Any exception in collect (here: the artifacts' `files` folder is a file) records the
    step and the error; a later successful attempt clears it."""
    suite = _suite(tmp_path, "crash", "m.json", '{"loss": 0.25}', "{type: json, path: out/m.json}")
    ref = lifecycle.RunRef(dag_id="crash", run_id="manual__crash")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    resource = _run(cell, ref)
    files = ref.artifacts(cell.id) / "files"
    files.write_text("in the way")
    with pytest.raises(OSError):
        lifecycle.collect(cell, resource, ref)
    row = lifecycle.results_store().get_cell("crash", ref.run_id, cell.id)
    assert row.state == "collect_failed"
    assert row.message.startswith("collect failed: ") and "Error" in row.message
    assert _evaluate(cell, ref) == "collect_failed"
    files.unlink()  # a retry of collect that works
    lifecycle.collect(cell, resource, ref)
    assert _evaluate(cell, ref) == "passed"
    lifecycle.teardown(cell, resource, ref)


def test_an_evaluation_that_could_not_run_is_evaluation_failed(accel_home, tmp_path):
    suite = _suite(tmp_path, "ev", "m.json", "{}", "")
    ref = lifecycle.RunRef(dag_id="ev", run_id="manual__ev")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    store = lifecycle.results_store()
    store.upsert_cell("ev", ref.run_id, cell.id, state="ran")
    lifecycle.record_evaluation_error(cell, ref, "RuntimeError: GX exploded")
    row = store.get_cell("ev", ref.run_id, cell.id)
    assert (row.state, row.message) == (
        "evaluation_failed",
        "evaluation could not run: RuntimeError: GX exploded",
    )
    with pytest.raises(lifecycle.CellFailed, match=r"\(evaluation_failed\)"):
        lifecycle.gate([cell], ref)
    # A more specific earlier failure keeps its state; the error is added to its message.
    store.upsert_cell("ev", ref.run_id, cell.id, state="timed_out", message="timed out")
    lifecycle.record_evaluation_error(cell, ref, "boom")
    row = store.get_cell("ev", ref.run_id, cell.id)
    assert row.state == "timed_out"
    assert row.message == "timed out; evaluation could not run: boom"


PUNCT = """
description: two cells whose ids differ only in punctuation
axes:
  runtime: ["torch-2.13+cpu", "torch-2.13_cpu"]
machines:
  cpu: {backend: local}
machine: cpu
workload:
  setup: []
  run: ["${python}", "-c", "import os; os.makedirs('out', exist_ok=True); open('out/who', 'w').write(os.environ['ACCELMATRIX_CELL_ID'])"]
  timeout: 120
  artifacts: ["out/**"]
checks:
  - {type: exit_status}
"""


def test_cells_differing_only_in_punctuation_never_share_a_directory(accel_home, tmp_path):
    """Found: `torch-2.13+cpu` and `torch-2.13_cpu` shared one work dir, artifacts dir and
    Data Docs. Each cell now gets its own, keeps its own output, and teardown leaves no
    empty run folder behind."""
    suite = tmp_path / "punct.yaml"
    suite.write_text(textwrap.dedent(PUNCT))
    ref = lifecycle.RunRef(dag_id="punct", run_id="manual__2026-11-24T00:00:00+00:00")
    cells = lifecycle.plan_run(str(suite), ref, {})
    assert len(cells) == 2
    resources = [_run(c, ref) for c in cells]
    assert resources[0].work_dir != resources[1].work_dir
    assert ref.artifacts(cells[0].id) != ref.artifacts(cells[1].id)
    for cell, resource in zip(cells, resources, strict=True):
        lifecycle.collect(cell, resource, ref)
        who = ref.artifacts(cell.id) / "files" / "out" / "who"
        assert who.read_text() == cell.id
        assert _evaluate(cell, ref) == "passed"
        lifecycle.teardown(cell, resource, ref)
    run_dir = settings.work_root() / "punct" / settings.safe_name(ref.run_id)
    assert not run_dir.exists() and not run_dir.parent.exists()
    assert settings.work_root().exists()


@pytest.mark.parametrize(
    "ids",
    [
        ["torch-2.13+cpu", "torch-2.13_cpu", "torch-2.13:cpu", "torch-2.13/cpu", "torch-2.13 cpu"],
        ["a.", "a", ".a", "a..", "_"],
        ["x" * 200, "x" * 201, "x" * 200 + "+"],
        ["é", "e", "_", "ü"],
    ],
)
def test_safe_name_is_one_to_one_and_a_plain_path_component(ids):
    names = [settings.safe_name(i) for i in ids]
    assert len(set(names)) == len(ids), names
    for n in names:
        assert "/" not in n and n not in ("", ".", "..") and len(n) <= 140
    assert settings.safe_name("model=tiny-mlp,config=baseline") == "model=tiny-mlp,config=baseline"


@pytest.mark.parametrize("state", ["collect_failed", "evaluation_failed"])
def test_step_failure_states_show_as_failures_everywhere(tmp_path, state):
    """The matrix page colours them failed, the run report red, never pending or passed."""
    from accelmatrix.reports.run_page import STATE_COLOURS, write_run_index
    from accelmatrix.ui.model import cell_kind

    assert cell_kind(state, quarantined=False, flaky=False) == "failed"
    cells = [records.cell("n=a", state=state, cell_index=0)]
    page = write_run_index(tmp_path, "d", "r", cells, []).read_text()
    assert f"<td>{state}</td>" in page and state not in STATE_COLOURS
    assert 'style="background:#f4cccc"' in page


def test_a_planned_cell_that_never_reported_fails_the_runs_validation(accel_home, tmp_path):
    """The gate validates the run's table of cells with Great Expectations: a planned cell
    with no result row fails the run, named, and the run's Data Docs list it."""
    suite = _suite(tmp_path, "ghost", "m.json", '{"loss": 0.25}', "{type: json, path: out/m.json}")
    ref = lifecycle.RunRef(dag_id="ghost", run_id="manual__ghost")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    resource = _run(cell, ref)
    lifecycle.collect(cell, resource, ref)
    assert _evaluate(cell, ref) == "passed"
    lifecycle.teardown(cell, resource, ref)
    ghost = cell.model_copy(update={"id": "n=ghost"})  # planned, but no step of it ran
    with pytest.raises(lifecycle.CellFailed) as info:
        lifecycle.gate([cell, ghost], ref, str(suite))
    message = str(info.value)
    assert "the run's table failed validation" in message
    assert "every planned cell reported once: never reported: n=ghost" in message
    assert "every planned cell has a verdict: no verdict: n=ghost (missing)" in message
    store = lifecycle.results_store()
    assert store.get_run("ghost", ref.run_id).state == "failed"
    run_dir = ref.artifacts(cell.id).parent
    assert "n=ghost" in (run_dir / "data_docs" / "index.html").read_text()
    # The run report links them, and the matrix page's file route serves them.
    assert 'href="data_docs/index.html">run Data Docs' in (run_dir / "index.html").read_text()
    from accelmatrix.ui import files

    assert files.run_docs("ghost", ref.run_id) == "manual__ghost/data_docs/index.html"
    assert files.evidence_file("ghost", "manual__ghost/data_docs/index.html") is not None
