"""Bounds live in the results store: the bounds files under include/ (git's) are never
written. Accepting a change and the maintenance re-centering append rows with who, when
and why; the newest row of a benchmark is in force for the checks, the pages and the next
re-centering; ``python -m accelmatrix bounds export`` prints the file with them, for a PR.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from accelmatrix.contracts.series_records import BoundsRecord, BoundsValues
from accelmatrix.evaluation.bounds import (
    BenchmarkBounds,
    apply_stored,
    load_bounds,
    load_bounds_in_force,
)
from accelmatrix.results.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
DAG = "nightly_perf"
DAY0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
KEY = "bounds/b.yaml"
FILE_TEXT = """\
# Bounds a team keeps by hand (this comment must survive every re-centering).
benchmarks:
  m0:
    name: Model zero  # shown on the dashboard
    step_time_lower_bound: 0.9
    step_time_upper_bound: 1.1   # +-10 %
    target_loss: 0.15
  m1:
    name: Model one
    step_time_lower_bound: 1.8
    step_time_upper_bound: 2.2
metadata:
  source: other-system
"""


@pytest.fixture
def store(tmp_path: Path):
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


@pytest.fixture
def include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An include dir with a bounds file and a suite (nightly_perf) whose perf check reads
    it; the settings point at it, and the process's results store is a fresh file."""
    inc = tmp_path / "include"
    (inc / "bounds").mkdir(parents=True)
    (inc / "suites").mkdir()
    (inc / "bounds" / "b.yaml").write_text(FILE_TEXT)
    suite = yaml.safe_load((ROOT / "include" / "suites" / "nightly_perf.yaml").read_text())
    suite["checks"] = [
        {"type": "step_time_within_bounds", "bounds_file": KEY, "benchmark": "m0"},
    ]
    suite.pop("notify", None)
    (inc / "suites" / f"{DAG}.yaml").write_text(yaml.safe_dump(suite))
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(inc))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(inc / "suites"))
    monkeypatch.setenv("ACCELMATRIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ACCELMATRIX_RESULTS_URL", raising=False)
    return inc


def _accepted_group(store: ResultsStore, level: float = 1.25) -> int:
    """A change group of DAG with one change point of benchmark m0 at ``level``."""
    gid = store.save_change_group(
        DAG,
        kind="series",
        direction="regression",
        logical_date=DAY0 + timedelta(days=8),
        summary="step_time of model=small +25 %",
    )
    store.save_change_point(
        DAG,
        cell_id="model=small",
        metric="step_time",
        benchmark="m0",
        run_id="scheduled__8",
        logical_date=DAY0 + timedelta(days=8),
        position=8,
        n_before=8,
        n_after=6,
        median_before=1.0,
        median_after=level,
        change=level - 1.0,
        direction="regression",
        group_id=gid,
    )
    return gid


# -- the store -----------------------------------------------------------------------------
def test_rows_are_appended_and_the_newest_of_each_benchmark_is_in_force(store):
    store.add_bounds(
        KEY,
        [
            BoundsValues(benchmark="m0", step_time_lower_bound=1.0, step_time_upper_bound=1.2),
            BoundsValues(benchmark="m1", step_time_lower_bound=2.0, step_time_upper_bound=2.4),
        ],
        reason="maintenance",
        by="accelmatrix-maintenance",
        detail={"window_days": 30},
    )
    store.add_bounds(
        KEY,
        [BoundsValues(benchmark="m0", step_time_lower_bound=1.1, step_time_upper_bound=1.3)],
        reason="accepted change",
        by="ann",
        detail={"group_id": 7},
        note="new kernel",
    )
    store.add_bounds(
        "bounds/other.yaml",
        [BoundsValues(benchmark="m0", step_time_lower_bound=5.0, step_time_upper_bound=6.0)],
        reason="maintenance",
        by="accelmatrix-maintenance",
    )
    now = store.bounds_in_force(KEY)
    assert set(now) == {"m0", "m1"}
    assert (now["m0"].step_time_lower_bound, now["m0"].by, now["m0"].note) == (
        1.1,
        "ann",
        "new kernel",
    )
    assert now["m0"].detail == {"group_id": 7} and now["m0"].at.tzinfo is not None
    assert now["m1"].reason == "maintenance"
    rows = store.get_bounds_history([KEY], benchmark="m0")
    assert [r.by for r in rows] == ["ann", "accelmatrix-maintenance"]  # newest first
    assert store.bounds_in_force("bounds/none.yaml") == {}
    with pytest.raises(ValueError, match="reason"):
        store.add_bounds(KEY, [BoundsValues(benchmark="m0")], reason="because", by="ann")
    with pytest.raises(ValueError, match="by"):
        store.add_bounds(KEY, [BoundsValues(benchmark="m0")], reason="maintenance", by="")
    with pytest.raises(TypeError, match="row 0 must be a BoundsValues"):
        store.add_bounds(KEY, [{"benchmark": "m0"}], reason="maintenance", by="x")
    with pytest.raises(ValueError, match="benchmark must be a non-empty string"):
        store.add_bounds(KEY, [BoundsValues(benchmark="")], reason="maintenance", by="x")
    with pytest.raises(ValueError, match="benchmark is 1000 characters long"):
        store.add_bounds(KEY, [BoundsValues(benchmark="m" * 1000)], reason="maintenance", by="x")


def test_a_file_changed_since_the_row_was_stored_wins(tmp_path):
    """A stored row holds while the file has the bounds it was made over; a file changed
    since (the exported bounds merged, a person's new baseline) is the newer decision."""
    path = tmp_path / "b.yaml"
    path.write_text(FILE_TEXT)
    row = BoundsRecord(
        id=1,
        file=KEY,
        benchmark="m0",
        step_time_lower_bound=1.15,
        step_time_upper_bound=1.35,
        average=1.25,
        file_lower_bound=0.9,
        file_upper_bound=1.1,
        reason="maintenance",
        by="accelmatrix-maintenance",
        at=DAY0,
    )
    b = load_bounds_in_force(path, stored={"m0": row, "gone": row})
    assert (b.benchmarks["m0"].step_time_lower_bound, b.benchmarks["m0"].average) == (1.15, 1.25)
    assert (
        b.benchmarks["m0"].target_loss == 0.15 and b.benchmarks["m1"].step_time_upper_bound == 2.2
    )
    assert "gone" not in b.benchmarks
    assert load_bounds(path).benchmarks["m0"].step_time_lower_bound == 0.9  # a copy
    edited = load_bounds(path)
    edited.benchmarks["m0"] = BenchmarkBounds(step_time_lower_bound=1.0, step_time_upper_bound=1.2)
    assert apply_stored(edited, {"m0": row}).benchmarks["m0"].step_time_lower_bound == 1.0


# -- accepting a change ----------------------------------------------------------------------
def test_accepting_a_change_stores_the_bounds_and_the_check_judges_with_them(include):
    """Through apply_triage (what the page's form and the CLI call): the bounds file stays
    byte-identical, a row records who, why and the note, and the step-time check of a cell
    at the accepted level then passes, judged against the stored bounds."""
    from test_evaluation import make_cell, series

    from accelmatrix.evaluation import evaluate_cell
    from accelmatrix.history.change_points.triage import apply_triage
    from accelmatrix.results import results_store
    from accelmatrix.spec.checks import parse_checks

    path = include / "bounds" / "b.yaml"
    before = path.read_bytes()
    store = results_store()
    checks = parse_checks(
        [{"type": "step_time_within_bounds", "bounds_file": KEY, "benchmark": "m0"}]
    )

    def judge(tmp: Path):
        outputs = make_cell(tmp, metrics=series("step_time", [1.24, 1.25, 1.26]))
        (v,) = evaluate_cell(checks, outputs, include_dir=include).verdicts
        return v

    include.joinpath("cell1").mkdir()
    v = judge(include / "cell1")
    assert not v.passed and "above the upper bound" in v.message  # the file's 0.9..1.1

    gid = _accepted_group(store, level=1.25)
    res = apply_triage(store, "group", gid, "accepted", by="ann", note="new kernel", dag_id=DAG)
    assert res.bounds and "width kept" in res.bounds[0] and "b.yaml unchanged" in res.bounds[0]
    assert path.read_bytes() == before
    row = store.bounds_in_force(KEY)["m0"]
    assert (row.reason, row.by, row.note) == ("accepted change", "ann", "new kernel")
    assert row.detail["group_id"] == gid and row.detail["dag_id"] == DAG
    assert row.step_time_lower_bound == pytest.approx(1.15)
    assert row.step_time_upper_bound == pytest.approx(1.35)
    assert (row.file_lower_bound, row.file_upper_bound) == (0.9, 1.1)
    assert "m1" not in store.bounds_in_force(KEY)

    include.joinpath("cell2").mkdir()
    v = judge(include / "cell2")
    assert v.passed, v.message
    assert v.expected == "1.15 <= step_time <= 1.35 (bounds m0)"
    assert (v.perf["lower_bound"], v.perf["upper_bound"]) == pytest.approx((1.15, 1.35))


def test_accepting_again_moves_the_stored_bounds_not_the_files(include):
    """A second accepted change re-centers from the bounds in force (the stored ones),
    width kept, and appends a row; the history keeps both."""
    from accelmatrix.history.change_points.triage import apply_triage
    from accelmatrix.results import results_store

    store = results_store()
    apply_triage(store, "group", _accepted_group(store, 1.25), "accepted", by="ann")
    store.save_change_point(
        DAG,
        cell_id="model=small",
        metric="step_time",
        benchmark="m0",
        run_id="scheduled__20",
        logical_date=DAY0 + timedelta(days=20),
        position=20,
        n_before=12,
        n_after=5,
        median_after=1.5,
        direction="regression",
    )
    (cp,) = [p for p in store.get_change_points(DAG) if p.group_id is None]
    apply_triage(store, "change", cp.id, "accepted", by="bob")
    rows = store.get_bounds_history([KEY])
    assert [(r.by, r.detail.get("change_id")) for r in rows] == [
        ("bob", cp.id),
        ("ann", None),
    ]
    assert (rows[0].step_time_lower_bound, rows[0].step_time_upper_bound) == pytest.approx(
        (1.4, 1.6)
    )
    assert (include / "bounds" / "b.yaml").read_text() == FILE_TEXT


# -- the pages -------------------------------------------------------------------------------
def test_pages_show_the_bounds_in_force_with_who_when_why_and_the_earlier_rows(include):
    from accelmatrix.history.change_points.triage import apply_triage
    from accelmatrix.results import results_store
    from accelmatrix.ui.history import HistoryView, load_bounds_entries, render_bounds
    from accelmatrix.ui.trend_model import current_bounds

    store = results_store()
    assert current_bounds(DAG, store)["m0"] == (0.9, 1.1)
    view = HistoryView(DAG, [], [])
    view.bounds, view.bounds_files = load_bounds_entries(store, DAG)
    assert view.bounds == [] and view.bounds_files == [KEY]
    assert "No benchmark has been re-centered" in render_bounds(view)

    store.add_bounds(
        KEY,
        [
            BoundsValues(
                benchmark="m0",
                step_time_lower_bound=0.95,
                step_time_upper_bound=1.15,
                sample_size=30,
                file_lower_bound=0.9,
                file_upper_bound=1.1,
            )
        ],
        reason="maintenance",
        by="accelmatrix-maintenance",
        detail={
            "query_start": "2026-02-01T00:00:00+00:00",
            "query_end": "2026-03-03T00:00:00+00:00",
            "window_days": 30,
            "confidence_level": 0.95,
            "samples": {"m0": 30},
        },
    )
    gid = _accepted_group(store, 1.25)
    apply_triage(store, "group", gid, "accepted", by="ann", note="expected: new kernel")
    assert current_bounds(DAG, store)["m0"] == pytest.approx((1.15, 1.35))
    view.bounds, _ = load_bounds_entries(store, DAG)
    (entry,) = view.bounds
    assert (entry.benchmark, entry.file, entry.row.by) == ("m0", KEY, "ann")
    assert (entry.lower, entry.upper) == pytest.approx((1.15, 1.35))
    html = render_bounds(view)
    assert 'data-benchmark="m0"' in html and 'data-source="store"' in html
    assert "by ann" in html and "expected: new kernel" in html
    assert f'href="#group-{gid}"' in html and f"accepted change group {gid}" in html
    assert "maintenance: 30 sample(s) from 2026-02-01 to 2026-03-03" in html  # earlier row
    assert "by accelmatrix-maintenance" in html


# -- export -----------------------------------------------------------------------------------
def test_export_prints_the_file_with_the_stored_bounds_and_its_comments(include, capsys):
    from accelmatrix.cli import main
    from accelmatrix.history.change_points.triage import apply_triage
    from accelmatrix.results import results_store

    assert main(["bounds", "export", KEY]) == 0
    out = capsys.readouterr()
    assert out.out == FILE_TEXT and "no stored bounds" in out.err

    store = results_store()
    gid = _accepted_group(store, 1.25)
    apply_triage(store, "group", gid, "accepted", by="ann")
    assert main(["bounds", "export", str(include / "bounds" / "b.yaml")]) == 0
    out = capsys.readouterr()
    text = out.out
    assert "# Bounds a team keeps by hand (this comment must survive" in text
    assert "name: Model zero  # shown on the dashboard" in text
    assert "step_time_upper_bound: 1.35  # +-10 %" in text
    raw = yaml.safe_load(text)
    m0 = raw["benchmarks"]["m0"]
    assert (m0["step_time_lower_bound"], m0["step_time_upper_bound"]) == pytest.approx((1.15, 1.35))
    assert m0["average"] == pytest.approx(1.25) and m0["target_loss"] == 0.15
    assert raw["benchmarks"]["m1"] == {
        "name": "Model one",
        "step_time_lower_bound": 1.8,
        "step_time_upper_bound": 2.2,
    }
    assert raw["metadata"] == {"source": "other-system"}
    assert "by ann" in out.err and f"accepted change group {gid}" in out.err
    assert (include / "bounds" / "b.yaml").read_text() == FILE_TEXT

    assert main(["bounds", "history", KEY]) == 0
    assert "m0  [1.15, 1.35" in capsys.readouterr().out
    assert main(["bounds", "export", "../etc/passwd"]) == 2
    assert "'..'" in capsys.readouterr().err
    assert main(["bounds", "export", "bounds/nope.yaml"]) == 2
    assert "not found" in capsys.readouterr().err
