"""On-call's path on the matrix page: a failed cell links the log of its failing step and
both the `run` (workload output) and `evaluate` (verdict table) logs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_matrix_page import APP, UI, Dom

from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import model, oncall, render
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


def _panel(view: model.RunView, query: list[tuple[str, str]], **kw: object) -> tuple[Dom, str]:
    f = oncall.parse_filters(query)
    shown = oncall.apply(view.cells, f)
    args = dict(
        cells=view.cells,
        shown=shown,
        axes=view.axes,
        filters=f,
        dag_id=view.dag_id,
        run_id=view.run.run_id,
        page_base=APP,
        app_base=APP,
        embedded=False,
        can_rerun=True,
        cost=(0.25, 4, 5),
        owners=["ml-infra", "alice"],
        reruns=[],
    )
    args.update(kw)
    panel = oncall.render_panel(**args)  # type: ignore[arg-type]
    html = render.run_page(view, ui_base=UI, app_base=APP, panel=panel, cells=shown)
    return Dom(html), html


def test_failed_only_and_axis_filters(store: ResultsStore) -> None:
    plant_demo(store)
    view = model.load_run_view(store, "demo", None)
    dom, _ = _panel(view, [("failed", "1")])
    # Failed checks and the infrastructure failure; not passed, quarantined-passed, excluded.
    assert set(dom.cells) == {"model=a,config=y", "model=a,config=z"}
    dom, html = _panel(view, [("axis", "config=y"), ("axis", "")])
    assert set(dom.cells) == {"model=a,config=y", "model=b,config=y"}
    assert "2 of 6 cells shown" in html
    (sel,) = dom.find("option", value="config=y")
    assert "selected" in sel
    dom, _ = _panel(view, [("failed", "1"), ("axis", "model=b")])
    assert dom.cells == {}
    # The legend still counts the whole run; the links keep the run.
    dom, html = _panel(view, [("axis", "model=a")])
    assert 'data-count="failed">1<' in html and 'data-count="passed">1<' in html
    (only,) = dom.find("a", class_="only-failed")
    run_q = "scheduled__2026-11-20T02%3A00%3A00%2B00%3A00"
    assert only["href"] == f"{APP}/suites/demo?run_id={run_q}&failed=1"


def test_rerun_targets_first_failing_step_and_run_for_checks(store: ResultsStore) -> None:
    plant_demo(store)
    view = model.load_run_view(store, "demo", None)
    todo, skipped = oncall.targets(view.cells)
    got = {(t.cell_id, t.task_id, t.map_index) for t in todo}
    # Failed checks: `run` (not evaluate, which the log link opens); the machine failure of
    # the workload: `run` too (its first failing step).
    assert got == {("model=a,config=y", "cpu.run", 1), ("model=a,config=z", "cpu.run", 2)}
    assert skipped == []
    cells = {c.cell_id: c for c in view.cells}
    steps = {
        "setup_failed": "setup",
        "collect_failed": "collect",
        "evaluation_failed": "evaluate",
        "run_failed": "run",
        "timed_out": "run",
        "failed": "run",
    }
    for state, step in steps.items():
        c = replace(cells["model=a,config=y"], state=state, step=None, kind="failed")
        assert oncall.rerun_step(c) == step, state
    c = replace(cells["model=a,config=y"], state="preflight_failed", step="preflight")
    assert oncall.rerun_step(c) is None
    prov = replace(cells["model=a,config=z"], step="provision", message="provision failed: quota")
    assert oncall.rerun_step(prov) == "provision"
    for passed in ("model=a,config=x", "model=b,config=x", "model=b,config=y"):
        assert oncall.rerun_step(cells[passed]) is None


def test_rerun_form_owners_and_cost(store: ResultsStore) -> None:
    plant_demo(store)
    view = model.load_run_view(store, "demo", None)
    dom, html = _panel(view, [("failed", "1")])
    (form,) = dom.find("form", class_="rerun")
    assert form["method"] == "post" and form["action"] == f"{APP}/suites/demo/rerun"
    cells = sorted(a["value"] for a in dom.find("input", name="cell"))
    assert cells == ["model=a,config=y", "model=a,config=z"]
    assert "re-run 2 failed cells" in html and 'name="failed" value="1"' in html
    assert "owners <b>ml-infra, alice</b>" in html and "cost <b>$0.2500</b> (4 of 5" in html
    # Filtered to passed cells only: nothing to re-run.
    dom, html = _panel(view, [("axis", "config=x")])
    assert not dom.find("input", name="cell") and "no failed cell shown" in html
    # Read-only users see why there is no button.
    dom, html = _panel(view, [], can_rerun=False)
    assert not dom.find("button", name="go") and "needs edit access" in html
    # Embedded in Airflow's UI, the form asks to come back to the view; recorded re-runs show.
    note = oncall.RerunNote("admin", None, ["model=a,config=y"])
    dom, html = _panel(view, [], embedded=True, reruns=[note], cost=(None, 0, 5))
    assert dom.find("input", name="view", value="1")
    assert "re-run of 1 failed cell by admin: model=a,config=y" in html
    assert "not priced" in html


def test_cross_origin_posts_are_refused() -> None:
    from accelmatrix.ui.rerun import Refused, check_same_origin

    base = "http://airflow.example:8080/"
    ok = [
        {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"},
        {"host": "127.0.0.1:8080", "origin": "http://airflow.example:8080"},
        {"host": "x", "referer": "http://x/plugin/accelmatrix/suites/d"},
        {"host": "x", "authorization": "Bearer t"},  # an API client, not a cookie session
    ]
    for headers in ok:
        check_same_origin(headers, "http", base)
    bad = [
        {"host": "127.0.0.1:8080", "origin": "http://evil.example"},
        {"host": "127.0.0.1:8080", "origin": "https://127.0.0.1:8080"},
        {"host": "127.0.0.1:8080", "origin": "null"},
        {"host": "127.0.0.1:8080", "referer": "http://evil.example/x"},
        {"host": "127.0.0.1:8080"},  # a cookie session with neither header
        {"host": "127.0.0.1:8080", "origin": "http://evil.example", "authorization": "Bearer t"},
    ]
    for headers in bad:
        with pytest.raises(Refused) as e:
            check_same_origin(headers, "http", base)
        assert e.value.status == 403, headers
