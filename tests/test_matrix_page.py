"""The matrix page's HTML and SVG, rendered from a real (temporary) results store with
planted runs: cell colours and links, series verdicts, trends, escaping, file serving."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from accelmatrix import settings
from accelmatrix.contracts.series_records import SeriesStatus
from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import files, grid, model, render
from accelmatrix_testkit.matrix_results import (
    END,
    PlantedCell,
    cell_id,
    plant_demo,
    plant_run,
    planted_docs,
)

ROOT = Path(__file__).resolve().parents[1]
UI, APP = "/base", "/base/accelmatrix"


class Dom(HTMLParser):
    """Every start tag with its attributes, the text, and per-td-cell links."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.cells: dict[str, dict[str, object]] = {}
        self._cell: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "td" and "data-cell-id" in a:
            self._cell = a["data-cell-id"]
            self.cells[self._cell] = {"class": a["class"], "kind": a["data-kind"], "links": {}}
            self.cells[self._cell]["badges"] = []
        elif tag == "a" and self._cell is not None:
            self.cells[self._cell]["links"][a["class"]] = a["href"]  # type: ignore[index]
        elif tag == "span" and self._cell is not None and "badge" in a.get("class", ""):
            self.cells[self._cell]["badges"].append(a["class"].split("b-")[1])  # type: ignore[union-attr]
        if tag == "span" and self._cell is not None and a.get("class") in ("st", "why", "attempt"):
            self._span = a["class"]
        if tag == "a" and self._cell is not None:
            self.cells[self._cell].setdefault("steps", {})[a["class"]] = a.get("data-step")  # type: ignore[union-attr]

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None
        if tag == "span":
            self._span = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None and getattr(self, "_span", None):
            self.cells[self._cell].setdefault(self._span, []).append(data)  # type: ignore[union-attr]

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.tags
            if t == tag
            and all(
                v in a.get(k.rstrip("_").replace("_", "-"), "").split() for k, v in attrs.items()
            )
        ]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "suites"))
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(tmp_path / "include"))
    (tmp_path / "suites").mkdir()
    return tmp_path


@pytest.fixture
def store(env: Path) -> ResultsStore:
    s = ResultsStore(f"sqlite:///{env / 'results.db'}")
    yield s
    s.close()


def _page(store: ResultsStore, run_id: str | None = None) -> tuple[model.RunView, Dom]:
    view = model.load_run_view(store, "demo", run_id)
    assert view is not None
    return view, Dom(render.run_page(view, ui_base=UI, app_base=APP))


def test_grid_cells_colours_and_links(store: ResultsStore) -> None:
    run_ids = plant_demo(store)
    latest = run_ids[-1]
    view, dom = _page(store)
    assert view.run.run_id == latest and view.is_latest
    assert view.axes == ["model", "config"]
    kinds = {cid: c["kind"] for cid, c in dom.cells.items()}
    assert kinds == {
        "model=a,config=x": "passed",
        "model=a,config=y": "failed",
        "model=a,config=z": "infra",
        "model=b,config=x": "quarantined",
        "model=b,config=y": "excluded",
        "model=b,config=z": "flaky",
    }
    for cid, c in dom.cells.items():
        assert f"k-{kinds[cid]}" in str(c["class"]).split()
    # Rows are the first axis, columns the second, in YAML order.
    rows = [a["scope"] for a in dom.find("th", class_="row")]
    assert len(rows) == 2
    cols = [t for t, a in dom.tags if t == "th" and "col" in a.get("class", "").split()]
    assert len(cols) == 3
    order = [cid for cid in dom.cells]
    assert order == [f"model={m},config={c}" for m in "ab" for c in "xyz"]
    # The run task's log in the Airflow UI: <machine>.run mapped by rank within its machine.
    q = "scheduled__2026-11-20T02%3A00%3A00%2B00%3A00"
    logs = {cid: c["links"].get("log") for cid, c in dom.cells.items()}
    assert logs == {
        "model=a,config=x": f"{UI}/dags/demo/runs/{q}/tasks/cpu.run/mapped/0",
        # failed checks: the verdict table is in the evaluate task's log
        "model=a,config=y": f"{UI}/dags/demo/runs/{q}/tasks/cpu.evaluate/mapped/1",
        "model=a,config=z": f"{UI}/dags/demo/runs/{q}/tasks/cpu.run/mapped/2",
        "model=b,config=x": f"{UI}/dags/demo/runs/{q}/tasks/gpu.run/mapped/0",
        "model=b,config=y": None,
        "model=b,config=z": f"{UI}/dags/demo/runs/{q}/tasks/gpu.run/mapped/1",
    }
    docs = {cid: c["links"].get("docs") for cid, c in dom.cells.items()}
    assert docs.pop("model=a,config=x") == (
        f"{APP}/suites/demo/files/scheduled__2026-11-20T02_00_00_00_00~79e57e5b764c/"
        "model%3Da%2Cconfig%3Dx/data_docs/index.html"
    )
    assert set(docs.values()) == {None}
    # The docs link names a file the app would serve.
    rel = view.cells[0].data_docs
    assert rel is not None and files.data_docs_file("demo", rel) is not None
    assert dom.cells["model=a,config=y"]["badges"] == ["regression"]
    assert dom.cells["model=b,config=z"]["badges"] == ["flaky"]
    assert dom.cells["model=b,config=x"]["badges"] == ["quarantined"]
    counts = {a["data-count"]: None for a in dom.find("b") if "data-count" in a}
    assert set(counts) == set(model.KINDS)
    assert view.counts == {
        "passed": 1,
        "failed": 1,
        "infra": 1,
        "cancelled": 0,
        "quarantined": 1,
        "flaky": 1,
        "excluded": 1,
        "pending": 0,
    }
    assert view.verdict_source == "computed"  # no series_status rows stored
    # The run picker lists every run, the shown one selected.
    options = dom.find("option")
    assert [o["value"] for o in options] == list(reversed(run_ids))
    assert [o["value"] for o in options if "selected" in o] == [latest]


def test_stored_series_status_is_used_for_the_latest_run(store: ResultsStore) -> None:
    run_ids = plant_demo(store)
    store.replace_series_status(
        "demo",
        [
            SeriesStatus(
                dag_id="demo",
                benchmark="a",
                cell_id="model=a,config=x",
                metric="step_time",
                status="flaky",
                points=7,
                flips=4,
                trailing=0,
            )
        ],
        window_days=30,
    )
    view, dom = _page(store)
    assert view.verdict_source == "series_status"
    assert dom.cells["model=a,config=x"]["kind"] == "flaky"
    assert dom.cells["model=b,config=z"]["kind"] == "passed"  # not in the stored table
    # An older run is judged over its own window instead.
    old, dom_old = _page(store, run_ids[-2])
    assert old.verdict_source == "computed" and not old.is_latest
    assert old.run.run_id == run_ids[-2]
    assert {a["value"] for a in dom_old.find("option") if "selected" in a} == {run_ids[-2]}


def test_trend_charts_band_violations_regression(store: ResultsStore, env: Path) -> None:
    plant_demo(store)
    (env / "include" / "bounds").mkdir(parents=True)
    (env / "include" / "bounds" / "demo.yaml").write_text(
        "benchmarks:\n  a: {step_time_lower_bound: 0.95, step_time_upper_bound: 1.05}\n"
        "  b: {step_time_lower_bound: 1.9, step_time_upper_bound: 2.1}\n"
    )
    # A whole suite: the page reads it with the loader, as the DAG does.
    (env / "suites" / "demo.yaml").write_text(
        "axes: {model: [a, b], config: [x, y, z]}\n"
        "machines: {cpu: {backend: local}}\n"
        "workload: {run: [echo]}\n"
        "checks:\n  - {type: step_time_within_bounds, bounds_file: bounds/demo.yaml,"
        " benchmark: '${axis.model}'}\n"
    )
    view, dom = _page(store)
    assert [(t.benchmark, t.metric) for t in view.trends] == [
        ("a", "step_time"),
        ("b", "step_time"),
    ]
    a, b = view.trends
    assert a.regressions == ["model=a,config=y"] and b.regressions == []
    assert a.current == (0.95, 1.05)
    svgs = dom.find("svg", class_="trend")
    assert len(svgs) == 2
    assert len(dom.find("polygon", class_="band")) == 2
    assert len(dom.find("line", class_="current")) == 4  # lower and upper, two charts
    reg = dom.find("g", class_="s-regression")
    assert [g["data-cell-id"] for g in reg] == ["model=a,config=y"]
    assert [g["data-cell-id"] for g in dom.find("g", class_="s-flaky")] == ["model=b,config=z"]
    # Red rings: a,y's last 2 points and b,z's 3 odd days: one per violating point.
    assert len(dom.find("circle", class_="violation")) == 2 + 3
    assert "regression" in "".join(dom.text)
    # Without the suite file the history is still drawn, just without today's bounds.
    (env / "suites" / "demo.yaml").unlink()
    view2, dom2 = _page(store)
    assert view2.trends[0].current is None and not dom2.find("line", class_="current")
    assert len(dom2.find("polygon", class_="band")) == 2


HOSTILE = '<script>alert("x")</script>'
HOSTILE_ATTR = '"><img src=x onerror=alert(1)>'


def test_hostile_ids_and_values_are_escaped(store: ResultsStore) -> None:
    run_id = "manual__<b>run</b>"
    cells = []
    for i, v in enumerate([HOSTILE, HOSTILE_ATTR, "a&b'c"]):
        axes = {"model<i>": v, "cfg": f"{v}!"}
        cells.append(
            PlantedCell(
                cell_id=cell_id(axes),
                axes=axes,
                index=i,
                machine=f"m{HOSTILE_ATTR}",
                state="failed",
                message=HOSTILE,
                failed_checks=(HOSTILE_ATTR,),
                step_time=1.0 + i,
                benchmark=HOSTILE,
                lower=0.0,
                upper=1.5,
            )
        )
    plant_run(store, "demo", run_id, cells, logical_date=END, started_at=END)
    view = model.load_run_view(store, "demo")
    assert view is not None
    out = render.run_page(view, ui_base=UI, app_base=APP)
    out += render.suites_page(model.list_suites(store), APP)
    dom = Dom(out)
    tags = {t for t, _ in dom.tags}
    assert "script" not in tags and "img" not in tags
    for t, attrs in dom.tags:
        assert not any(k.startswith("on") for k in attrs), (t, attrs)
    assert "<script" not in out.lower() and "<img" not in out.lower()
    # The values survive as text and attribute values, exactly.
    assert set(dom.cells) == {c.cell_id for c in cells}
    text = "".join(dom.text)
    assert HOSTILE in text and HOSTILE_ATTR in text and run_id in text
    assert view.axes == ["model<i>", "cfg"]
    # Links stay inside their path segments: nothing hostile breaks out of the URL.
    for c in dom.cells.values():
        href = c["links"]["log"]
        assert href.startswith(f"{UI}/dags/demo/runs/manual__%3Cb%3Erun%3C%2Fb%3E/tasks/m%22")
        assert "<" not in href and '"' not in href


def test_axis_order_recovered_from_ids_with_separators() -> None:
    axes = {"b": "1,a=2", "a": "x=y"}  # stored JSON has sorted keys; the id has YAML order
    cv = model.CellView(
        cell_id="b=1,a=2,a=x=y",
        axes=axes,
        state="passed",
        kind="passed",
        quarantined=False,
        message="",
        machine="m",
        map_index=0,
        data_docs=None,
    )
    assert model.axis_order([cv]) == ["b", "a"]
    assert model._order_from_id("a=1,b=2", {"b": "2", "a": "1"}) == ["a", "b"]
    assert model._order_from_id("nonsense", {"a": "1"}) is None


def test_three_axes_rows_and_combined_columns() -> None:
    cells = []
    for m in ("m1", "m2"):
        for r in ("r1", "r2"):
            for s in ("s1", "s2", "s3"):
                axes = {"model": m, "rt": r, "size": s}
                cells.append(
                    model.CellView(cell_id(axes), axes, "passed", "passed", False, "", "c", 0, None)
                )
    g = grid.layout(cells, ["model", "rt", "size"])
    assert g.rows == ["m1", "m2"]
    assert g.cols == [(r, s) for r in ("r1", "r2") for s in ("s1", "s2", "s3")]
    html = grid.render_grid(
        cells, ["model", "rt", "size"], ui_base="", app_base="", dag_id="d", run_id="r"
    )
    dom = Dom(html)
    spans = [
        a.get("colspan") for t, a in dom.tags if t == "th" and "col" in a.get("class", "").split()
    ]
    assert spans[:2] == ["3", "3"] and spans[2:] == [None] * 6


def test_data_docs_file_refuses_everything_but_data_docs(env: Path) -> None:
    docs = planted_docs("demo", "run1", "model=a")
    cell_dir = docs["dir"].parent
    (cell_dir / "output.log").write_text("workload log")
    (docs["dir"] / "static").mkdir()
    (docs["dir"] / "static" / "x.css").write_text("body{}")
    secret = env / "secret.txt"
    secret.write_text("secret")
    (docs["dir"] / "link.html").symlink_to(secret)
    (docs["dir"] / "inside.html").symlink_to(docs["index"])
    other = planted_docs("other", "run1", "c")
    ok = files.data_docs_file("demo", "run1/model=a/data_docs/index.html")
    assert ok == docs["index"].resolve()
    assert files.data_docs_file("demo", "run1/model=a/data_docs/static/x.css") is not None
    assert files.data_docs_file("demo", "run1/model=a/data_docs/inside.html") is not None
    refused = [
        "run1/model=a/output.log",  # an artifact, not Data Docs
        "run1/model=a/data_docs",  # a directory
        "run1/model=a/data_docs/missing.html",
        "run1/model=a/data_docs/link.html",  # symlink out of the tree
        "run1/model=a/data_docs/../output.log",
        "../other/run1/c/data_docs/index.html",  # another suite's
        "run1/../../other/run1/c/data_docs/index.html",
        str(other["index"]),  # absolute
        "/etc/passwd",
        "run1/model=a/data_docs/index.html\x00",
        "run1\\model=a\\data_docs\\index.html",
        "",
    ]
    for rel in refused:
        assert files.data_docs_file("demo", rel) is None, rel


def test_no_runs_and_unknown_run(store: ResultsStore) -> None:
    store.ensure_schema()
    assert model.load_run_view(store, "demo") is None
    assert model.list_suites(store) == []
    assert "No runs recorded yet" in render.suites_page([], APP)
    plant_demo(store)
    assert model.load_run_view(store, "demo", "nope") is None
    (s,) = model.list_suites(store)
    assert s.dag_id == "demo" and s.runs == 7 and s.latest.run_id.endswith("11-20T02:00:00+00:00")


def test_plugin_module_is_cheap_to_import() -> None:
    """Every Airflow component imports the plugin (the ``airflow.plugins`` entry point, or
    the plugins folder's shim): it adds nothing but the lazy wrapper and the trigger guard's
    middleware class and the tabs' table (standard library only).
    (Airflow's settings already loaded the package and its cluster policy,
    accelmatrix.deploy.policy, through the ``airflow.policy`` entry point: that much and no
    more.)"""
    code = (
        "import sys; import airflow.plugins_manager; before = set(sys.modules); "
        "assert sorted(m for m in before if m.startswith('accelmatrix')) == "
        "['accelmatrix', 'accelmatrix.deploy', 'accelmatrix.deploy.policy'], before; "
        "import accelmatrix_plugin; import accelmatrix.ui.plugin as p; "
        "added = sorted(set(sys.modules) - before); print(added); "
        "assert added == ['accelmatrix.ui', 'accelmatrix.ui.asgi', 'accelmatrix.ui.plugin', "
        "'accelmatrix.ui.tabs', 'accelmatrix.ui.trigger_guard', 'accelmatrix_plugin'], added; "
        "(a,) = p.AccelmatrixPlugin.fastapi_apps; assert a['url_prefix'] == '/accelmatrix'; "
        "v, *tabs = p.AccelmatrixPlugin.react_apps; assert v['url_route'] == 'accelmatrix'; "
        "assert [t['destination'] for t in tabs] == ['dag', 'dag', 'dag_run', 'task_instance']; "
        "assert v['bundle_url'] == 'accelmatrix/static/matrix-view.js'"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    r = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_rerun_of_a_logical_date_replaces_its_point_and_runs_are_newest_first(
    store: ResultsStore,
) -> None:
    axes = {"model": "a"}
    cid = cell_id(axes)

    def cell(value: float) -> PlantedCell:
        return PlantedCell(cid, axes, 0, step_time=value, benchmark="a", lower=0.9, upper=1.1)

    day = END - timedelta(days=1)
    plant_run(store, "demo", "nightly", [cell(1.0)], logical_date=day, started_at=day)
    # The same build re-tested later under another run id (a backfill): its point wins.
    later = END - timedelta(hours=1)
    plant_run(store, "demo", "backfill", [cell(1.05)], logical_date=day, started_at=later)
    plant_run(store, "demo", "manual", [cell(0.95)], logical_date=None, started_at=END)
    assert [r.run_id for r in store.get_runs("demo")] == ["manual", "backfill", "nightly"]
    hist = model._history(store, "demo", END - timedelta(days=30), END)
    points = hist[("a", "step_time", cid)]
    assert [(p.time, p.value) for p in points] == [(day, 1.05), (END, 0.95)]
    # Outside the window: nothing.
    assert model._history(store, "demo", END - timedelta(days=60), END - timedelta(days=31)) == {}


def test_each_failure_shows_its_cause_and_links_the_failing_task(
    store: ResultsStore, env: Path
) -> None:
    """The why on the grid (issue 13 item 2): one or two lines per non-passing cell and a
    log link to the step that failed, for every failure state, new and unknown ones too."""
    when = END
    run_id = "manual__2026-11-20T02:00:00+00:00"
    specs = [
        ("checks", "failed", "", [("final_loss", "loss <= 1.5", "2.31")], "evaluate"),
        ("setup", "setup_failed", "setup command exited 1: pip install x", [], "setup"),
        ("exit", "run_failed", "workload exited with 3, expected 0 (exit 3)", [], "run"),
        ("timeout", "timed_out", "workload timed out after 300 s and was killed", [], "run"),
        ("hung", "hung", "workload printed nothing for 600 s; it was killed", [], "run"),
        ("prov", "infra_failed", "provision failed: stockout in us-central2-b", [], "provision"),
        ("node", "infra_failed", "infrastructure failure: node preempted", [], "run"),
        ("collect", "collect_failed", "collect failed: scp: connection reset", [], "collect"),
        ("judge", "evaluation_failed", "evaluation failed: KeyError 'loss'", [], "evaluate"),
        ("novel", "frobnicated", "the frobnicator broke", [], "run"),
    ]
    cells = []
    for i, (name, state, message, checks, _) in enumerate(specs):
        axes = {"case": name}
        cells.append(
            PlantedCell(
                cell_id(axes),
                axes,
                index=i,
                state=state,
                message=message,
                failed_checks=tuple(checks),
                exit_code=3 if name == "exit" else None,
            )
        )
    plant_run(store, "demo", run_id, cells, logical_date=None, started_at=when)
    log = settings.cell_artifacts_dir("demo", run_id, "case=exit")
    log.mkdir(parents=True)
    (log / "output.log").write_text("step 1\nTraceback ...\nRuntimeError: CUDA OOM\n\n")

    view = model.load_run_view(store, "demo", log_tails=True)
    dom = Dom(render.run_page(view, ui_base=UI, app_base=APP))
    why = {cid: " | ".join(c.get("why", [])) for cid, c in dom.cells.items()}
    assert why["case=checks"] == "final_loss: expected loss <= 1.5, observed 2.31"
    assert why["case=setup"] == "setup command exited 1: pip install x"
    assert why["case=exit"] == (
        "workload exited with 3, expected 0 (exit 3) | last log line: RuntimeError: CUDA OOM"
    )
    assert why["case=prov"] == "provision failed: stockout in us-central2-b"
    assert why["case=novel"] == "the frobnicator broke"
    for i, (name, state, _, _, step) in enumerate(specs):
        c = dom.cells[f"case={name}"]
        assert c["steps"]["log"] == step, name
        assert c["links"]["log"].endswith(f"/tasks/cpu.{step}/mapped/{i}"), name
        assert c["kind"] == ("infra" if state == "infra_failed" else "failed"), name
    # Without log access the workload's output stays out of the page.
    quiet = model.load_run_view(store, "demo")
    (exit_cell,) = [c for c in quiet.cells if c.cell_id == "case=exit"]
    assert exit_cell.cause == ["workload exited with 3, expected 0 (exit 3)"]


def test_cancelled_run_own_colour_no_progress_and_attempts(store: ResultsStore) -> None:
    """After "Mark run as failed": cancelled cells are not failures, a finished run has
    nothing in progress, and a cleared cell shows its attempt and time (item 3)."""
    run_id = "manual__2026-11-20T02:00:00+00:00"
    cut = "run task marked failed/success or cleared from outside (REST/UI), or its run deleted"
    cells = [
        PlantedCell("m=a", {"m": "a"}, index=0, state="cancelled", message=cut),
        PlantedCell("m=b", {"m": "b"}, index=1, state="ran"),  # ended just after the stop
        PlantedCell("m=c", {"m": "c"}, index=2, state="passed", attempt=2),
        PlantedCell("m=d", {"m": "d"}, index=3, state="failed", failed_checks=("x",)),
    ]
    plant_run(store, "demo", run_id, cells, logical_date=None, started_at=END, state="failed")
    view = model.load_run_view(
        store,
        "demo",
        stopped_by="stopped by admin at 2026-11-20 02:03 UTC: patch_dag_run (state=failed)",
        tries={("cpu.run", 3): (3, END + timedelta(minutes=9))},
    )
    dom = Dom(render.run_page(view, ui_base=UI, app_base=APP))
    kinds = {cid: c["kind"] for cid, c in dom.cells.items()}
    assert kinds == {"m=a": "cancelled", "m=b": "cancelled", "m=c": "passed", "m=d": "failed"}
    assert view.counts["cancelled"] == 2 and view.counts["failed"] == 1
    assert view.counts["pending"] == 0
    assert dom.cells["m=b"]["st"] == ["no verdict (ran)"]
    assert dom.cells["m=a"]["why"][0].startswith("stopped by admin at 2026-11-20 02:03")
    assert dom.cells["m=c"]["attempt"] == ["attempt 2 11-20 02:00"]  # store: its last write
    assert dom.cells["m=d"]["attempt"] == ["attempt 3 11-20 02:09"]  # from Airflow's tries
    legend = [a["data-count"] for a in dom.find("b") if "data-count" in a]
    assert "cancelled" in legend
    # The same cell in a run still going is in progress, not cancelled.
    plant_run(store, "demo", run_id, cells[1:2], logical_date=None, started_at=END, state="running")
    with store._writing() as conn:  # noqa: SLF001 - a run that has not finished
        from accelmatrix.results import schema

        conn.execute(schema.runs.update().values(finished_at=None))
    live = model.load_run_view(store, "demo")
    assert [c.kind for c in live.cells] == ["pending"] and live.cells[0].cause == []


def test_chart_axes_span_their_data() -> None:
    """Item 6: millisecond step times against a file's 0.54 s upper bound are drawn on a
    millisecond axis, and one run's chart has no invented +-12 h time span."""
    import re

    from accelmatrix.ui.trend import render_trend

    pts = [
        model.Point(END - timedelta(days=3 - i), v, 0.001, 0.009)
        for i, v in enumerate((0.002, 0.004, 0.008))
    ]
    band = [(p.time, p.lower, p.upper) for p in pts]
    trend = model.Trend("b", "step_time", [model.Series("m=a", "ok", pts)], band, (0.0, 0.54))

    def y_ticks(svg: str) -> list[float]:
        return [float(v) for v in re.findall(r'text-anchor="end">([-0-9.e]+)</text>', svg)]

    svg = render_trend(trend, "t")
    ys = y_ticks(svg)
    assert ys and min(ys) < 0.002 and 0.008 < max(ys) < 0.0105, ys
    assert 'class="current upper"' not in svg  # 0.54 is off this axis: not drawn
    # Points spread over the plot's height rather than sitting on one line.
    cys = [float(v) for v in re.findall(r'<circle[^>]* cy="([0-9.]+)"', svg)]
    assert max(cys) - min(cys) > 100

    one = model.Trend("b", "step_time", [model.Series("m=a", "ok", pts[:1])], band[:1], None)
    svg = render_trend(one, "t1")
    labels = re.findall(r'y="248" text-anchor="[a-z]+">([^<]+)</text>', svg)
    assert labels == [f"{pts[0].time:%Y-%m-%d %H:%M}"]


def test_history_marks_flaky_new_and_broken_cells(store: ResultsStore) -> None:
    """Item 4: cells x the last runs; each square links to that run's cell; a flaky, a
    newly failing and a broken cell are marked and listed first; infra failures and
    cancellations are no verdicts (they neither flip nor break a cell)."""
    from accelmatrix.ui import history

    seqs = {
        "c=steady": "PPPPPP",
        "c=flaky": "PFPPFP",
        "c=new": "PPPPPF",
        "c=broken": "PPPFFF",
        "c=infra": "PPIPCP",  # infra, cancelled: no flips
    }
    state = {"P": "passed", "F": "failed", "I": "infra_failed", "C": "cancelled"}
    run_ids = []
    for day in range(6):
        when = END - timedelta(days=5 - day)
        run_id = f"scheduled__{when:%Y-%m-%dT%H:%M:%S}+00:00"
        cells = [
            PlantedCell(cid, {"c": cid[2:]}, index=i, state=state[seq[day]])
            for i, (cid, seq) in enumerate(seqs.items())
        ]
        plant_run(store, "demo", run_id, cells, logical_date=when, started_at=when)
        run_ids.append(run_id)
    view = history.load_history(store, "demo", 30)
    assert [r.run_id for r in view.runs] == run_ids  # oldest first
    marks = {r.cell_id: r.marks for r in view.rows}
    assert marks == {
        "c=steady": [],
        "c=flaky": ["flaky"],
        "c=new": ["new"],
        "c=broken": ["broken"],
        "c=infra": [],
    }
    assert [r.cell_id for r in view.rows][:3] == ["c=new", "c=broken", "c=flaky"]
    (broken,) = [r for r in view.rows if r.cell_id == "c=broken"]
    assert broken.since == run_ids[3]
    dom = Dom(render.history_page(view, page_base=APP, n_runs=30))
    squares = [a for t, a in dom.tags if t == "a" and a.get("class", "").startswith("k-")]
    assert len(squares) == 5 * 6
    # c=new (plan index 2) in the oldest run: the run's page at that cell.
    assert squares[0]["href"] == (f"{APP}/suites/demo?run_id={run_ids[0].replace('+', '%2B')}#c2")
    assert [a["class"] for a in squares[:6]] == ["k-passed"] * 5 + ["k-failed"]
    _, run_dom = _page(store, run_ids[0])
    (anchored,) = [a for t, a in run_dom.tags if t == "td" and a.get("id") == "c2"]
    assert anchored["data-cell-id"] == "c=new"
    # Only the last 2 runs: the flaky cell flipped once there, not flaky.
    short = history.load_history(store, "demo", 2)
    assert len(short.runs) == 2 and "flaky" not in {m for r in short.rows for m in r.marks}
