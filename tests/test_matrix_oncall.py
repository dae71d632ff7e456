"""On-call's path on the matrix page: a failed cell links the log of its failing step and
both the `run` (workload output) and `evaluate` (verdict table) logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_matrix_page import APP, UI, Dom

from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import model, render
from accelmatrix_testkit.matrix_results import plant_demo


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultsStore:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def test_a_failed_cell_links_its_run_and_evaluate_logs(store: ResultsStore) -> None:
    plant_demo(store)
    view = model.load_run_view(store, "demo", None)
    dom = Dom(render.run_page(view, ui_base=UI, app_base=APP))
    q = "scheduled__2026-11-20T02%3A00%3A00%2B00%3A00"
    tasks = f"{UI}/dags/demo/runs/{q}/tasks"
    failed = dom.cells["model=a,config=y"]["links"]  # failed checks: evaluate first
    assert failed["log"] == f"{tasks}/cpu.evaluate/mapped/1"
    assert failed["runlog"] == f"{tasks}/cpu.run/mapped/1"
    assert "evallog" not in failed  # the log link is the evaluate log already
    infra = dom.cells["model=a,config=z"]["links"]  # the workload's machine failed: run first
    assert infra["log"] == f"{tasks}/cpu.run/mapped/2"
    assert infra["evallog"] == f"{tasks}/cpu.evaluate/mapped/2"
    for cid in ("model=a,config=x", "model=b,config=x", "model=b,config=y"):
        assert not {"runlog", "evallog"} & set(dom.cells[cid]["links"]), cid
