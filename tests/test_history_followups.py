"""History that stays readable (issue 37, part 5): a suite's follow-up runs (confirm,
bisect and compare re-tests of named builds) are never its latest run, nor rows or columns
of its history grid; they have their own section on the history page, linked from the
change they re-test; and accepting a change clears its cell's regression badge at once.

Measured on main before: the grid of a 1-cell suite showed 16 cells (one row per
follow-up sample, ``model=small,build=...,repeat=1``) and a column per follow-up run; the
suite's landing page opened the newest follow-up run, whose 30-day chart hid the backfill;
an accepted change kept its cell's "regression" badge. Planted in a real (temporary)
results store the way the lifecycle records runs, the gate its verdicts and change points,
and history.retests.followup its re-tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from test_history_page import Svg

from accelmatrix.contracts.series_records import SeriesStatus
from accelmatrix.history.change_points.triage import apply_triage
from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import history, model, render
from accelmatrix_testkit.matrix_results import PlantedCell, plant_run

DAG = "perf_one"
APP = "/base/accelmatrix"
CELL = "model=small"
# A backfill of 10 nightly builds (03-01 .. 03-10) started two months later; the model is
# 5 % slower from build 03-07 on (inside the +-10 % bounds: only the change point sees it).
DATES = [datetime(2026, 3, 1, tzinfo=UTC) + timedelta(days=i) for i in range(10)]
FIRST_BAD = 6
TODAY = datetime(2026, 5, 12, 9, tzinfo=UTC)  # more than 30 days after the backfill


def build(d: datetime) -> str:
    return f"nightly-{d:%Y-%m-%d}"


@dataclass
class Planted:
    nightlies: list[str]  # by logical date
    followups: list[str]  # oldest first
    group: int
    confirmation: int


def _cell(cell_id: str, index: int, value: float) -> PlantedCell:
    axes = dict(kv.split("=", 1) for kv in cell_id.split(","))
    return PlantedCell(
        cell_id, axes, index, step_time=value, benchmark="small", lower=0.9, upper=1.1
    )


def _followup(
    store: ResultsStore,
    run_id: str,
    *,
    run_type: str,
    cells: list[PlantedCell],
    block: dict | None,
    logical_date: datetime | None,
    started: datetime,
) -> str:
    plant_run(
        store,
        DAG,
        run_id,
        cells,
        logical_date=logical_date,
        started_at=started,
        state="passed",
        run_type=run_type,
    )
    fields: dict = {"runtime_version": (block or {}).get("builds", [None])[-1]}
    if block is not None:
        fields["params"] = {"accelmatrix_followup": block}
    store.upsert_run(DAG, run_id, **fields)
    return run_id


def plant(store: ResultsStore) -> Planted:
    """The nightlies, the open regression the gate found (change point, group, series
    verdict), its re-test (a confirm run and a bisect run with one cell per sample, as
    follow-up runs were planned before sessions: the measured 16 cells) and two runs of
    today's design: a compare run (one session cell per suspect cell) and a run known only
    by its conf block."""
    nightlies = []
    for i, when in enumerate(DATES):
        scheduled = i == len(DATES) - 1
        run_id = f"{'scheduled' if scheduled else 'backfill'}__{when:%Y-%m-%dT%H:%M:%S}+00:00"
        started = TODAY + timedelta(minutes=i) if not scheduled else TODAY - timedelta(hours=8)
        plant_run(
            store,
            DAG,
            run_id,
            [_cell(CELL, 0, 1.05 if i >= FIRST_BAD else 1.0)],
            logical_date=when,
            started_at=started,
            state="passed",
            run_type="scheduled" if scheduled else "backfill",
        )
        store.upsert_run(DAG, run_id, runtime_version=build(when))
        nightlies.append(run_id)
    bad, good = DATES[FIRST_BAD], DATES[FIRST_BAD - 1]
    common = {
        "logical_date": bad,
        "runtime_version": build(bad),
        "prev_logical_date": good,
        "prev_runtime_version": build(good),
        "direction": "regression",
        "run_id": nightlies[FIRST_BAD],
    }
    group = store.save_change_group(
        DAG,
        **common,
        kind="series",
        summary=f"step_time of {CELL} +5.0 % from {build(bad)}",
        series_count=1,
        cells=[CELL],
        machines=["cpu"],
        metrics=["step_time"],
        change_median=0.05,
    )
    store.save_change_point(
        DAG,
        **common,
        cell_id=CELL,
        metric="step_time",
        benchmark="small",
        machine="cpu",
        prev_run_id=nightlies[FIRST_BAD - 1],
        position=FIRST_BAD,
        n_before=FIRST_BAD,
        n_after=len(DATES) - FIRST_BAD,
        mean_before=1.0,
        mean_after=1.05,
        median_before=1.0,
        median_after=1.05,
        change=0.05,
        p_value=1e-5,
        group_id=group,
    )
    # The gate's verdict: an open regression change point makes the series a regression
    # (its points never left the bounds: trailing 0).
    store.replace_series_status(
        DAG,
        [
            SeriesStatus(
                dag_id=DAG,
                benchmark="small",
                cell_id=CELL,
                metric="step_time",
                status="regression",
                points=len(DATES),
                flips=0,
                trailing=0,
            )
        ],
        window_days=30,
    )
    confirm_id, bisect_id = "accelmatrix_confirm__1_1", "accelmatrix_bisect__1_2"
    conf = store.start_confirmation(
        DAG,
        group,
        state="found",
        good_build=build(DATES[4]),
        suspect_build=build(DATES[8]),
        run_ids=[confirm_id, bisect_id],
        round=2,
        culprit=build(bad),
        last_good=build(good),
    )
    assert conf is not None
    # The confirm run: 8 cells, one per sample (build x repeat), triggered by the gate of
    # the newest nightly: an Airflow 3 triggered run without a logical date, started today.
    pair = [build(DATES[4]), build(DATES[8])]
    samples = [
        _cell(f"{CELL},build={b},repeat={k}", 2 * k + j, 1.0 + 0.05 * j)
        for k in range(4)
        for j, b in enumerate(pair)
    ]
    followups = [
        _followup(
            store,
            confirm_id,
            run_type="confirm",
            cells=samples,
            block={"kind": "confirm", "confirmation": conf.id, "round": 1, "cells": [CELL],
                   "builds": pair, "repeats": 4},
            logical_date=None,
            started=TODAY + timedelta(hours=1),
        )
    ]  # fmt: skip
    pair = [build(good), build(bad)]
    samples = [
        _cell(f"{CELL},build={b},repeat={k}", 2 * k + j, 1.0 + 0.05 * j)
        for k in range(3)
        for j, b in enumerate(pair)
    ]
    followups.append(
        _followup(
            store,
            bisect_id,
            run_type="bisect",
            cells=samples,
            block={"kind": "bisect", "confirmation": conf.id, "round": 2, "cells": [CELL],
                   "builds": pair, "repeats": 3},
            logical_date=TODAY + timedelta(hours=2),  # a trigger that sets one
            started=TODAY + timedelta(hours=2),
        )
    )  # fmt: skip
    # Today's design: a compare run, one session cell per suspect cell (every build on one
    # machine, interleaved).
    followups.append(
        _followup(
            store,
            "accelmatrix_compare__7_1",
            run_type="compare",
            cells=[_cell(f"{CELL},retest=1", 0, 1.02)],
            block={
                "kind": "compare",
                "confirmation": 7,
                "round": 1,
                "cells": [CELL],
                "builds": pair,
                "pairs": 5,
            },
            logical_date=None,
            started=TODAY + timedelta(hours=3),
        )
    )
    # A re-test Airflow recorded as a manual run, known only by its conf block.
    followups.append(
        _followup(
            store,
            "manual__2026-05-12T12:30:00+00:00",
            run_type="manual",
            cells=[_cell(f"{CELL},retest=1", 0, 1.0)],
            block={"kind": "compare", "cells": [CELL], "builds": pair},
            logical_date=TODAY + timedelta(hours=3, minutes=30),
            started=TODAY + timedelta(hours=3, minutes=30),
        )
    )
    return Planted(nightlies, followups, group, conf.id)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultsStore:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "suites"))
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(tmp_path / "include"))
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    s.ensure_schema()
    yield s
    s.close()


def test_grid_shows_the_suites_cell_and_nightly_columns_only(store: ResultsStore) -> None:
    planted = plant(store)
    view = history.load_history(store, DAG, 30)
    assert view is not None
    assert [r.cell_id for r in view.rows] == [CELL]
    assert [r.run_id for r in view.runs] == planted.nightlies
    assert history.run_labels(view.runs) == [f"{d:%m-%d} {build(d)}" for d in DATES]
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    dom = Svg(page)
    rows = [a for t, a in dom.tags if t == "tr" and "data-cell-id" in a]
    assert [r["data-cell-id"] for r in rows] == [CELL]
    heads = [a for t, a in dom.tags if t == "a" and a.get("class") == "run"]
    grid = page[page.index('id="history"') : page.index('id="retests"')]
    assert "1 cells;" in page and "build=" not in grid and "session=" not in grid
    assert len([h for h in heads if h["href"].split("run_id=")[1][:9] == "backfill_"]) == 9
    assert all(f not in grid for f in planted.followups)
    # The last N columns are the N newest nightlies, whatever re-tests ran since.
    short = history.load_history(store, DAG, 3)
    assert [r.run_id for r in short.runs] == planted.nightlies[-3:]


def test_latest_run_is_the_newest_nightly(store: ResultsStore) -> None:
    planted = plant(store)
    newest = planted.nightlies[-1]
    # The landing page (the list of suites) and the suite's page open the newest nightly.
    (summary,) = model.list_suites(store)
    assert summary.latest.run_id == newest and summary.runs == len(DATES)
    view = model.load_run_view(store, DAG)
    assert view.run.run_id == newest and view.is_latest
    assert view.verdict_source == "series_status"
    # Its 30-day chart holds the backfill, and no sample of a re-test.
    (trend,) = view.trends
    (series,) = trend.series
    assert series.cell_id == CELL
    assert [p.run_id for p in series.points] == planted.nightlies
    # The run picker lists the suite's runs; a re-test opens by its id, never as latest.
    assert [r.run_id for r in view.runs] == planted.nightlies[::-1]
    page = render.run_page(view, ui_base="", app_base=APP)
    assert all(f not in page for f in planted.followups)
    assert "retest-note" not in page
    retest = model.load_run_view(store, DAG, planted.followups[0])
    assert retest.run.run_id == planted.followups[0] and not retest.is_latest
    assert len(retest.cells) == 8
    page = render.run_page(retest, ui_base="", app_base=APP)
    assert "a confirm run re-testing builds, not a run of the suite" in page
    assert f'href="{APP}/suites/{DAG}/history#retests"' in page
    # The gate's "is this run older than the latest?" asks the same.
    assert store.latest_logical_date(DAG) == DATES[-1]
    from accelmatrix.results.runs import is_followup

    assert all(is_followup(store.get_run(DAG, r)) for r in planted.followups)
    assert not any(is_followup(store.get_run(DAG, r)) for r in planted.nightlies)


def test_retests_section_lists_the_followup_runs_linked_both_ways(store: ResultsStore) -> None:
    planted = plant(store)
    view = history.load_history(store, DAG, 30)
    assert [rt.run.run_id for rt in view.retests] == planted.followups[::-1]
    confirm, bisect = view.retests[-1], view.retests[-2]
    assert (confirm.kind, confirm.round, confirm.samples) == ("confirm", 1, 8)
    assert (bisect.kind, bisect.round, bisect.samples) == ("bisect", 2, 6)
    assert confirm.group_id == bisect.group_id == planted.group
    assert confirm.group is not None and confirm.group.id == planted.group
    assert [rt.kind for rt in view.retests[:2]] == ["compare", "compare"]
    assert view.retests[0].group_id is None
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    dom = Svg(page)
    rows = [a for t, a in dom.tags if t == "tr" and "retest-run" in a.get("class", "")]
    assert [r["data-run-id"] for r in rows] == planted.followups[::-1]
    assert [r["data-kind"] for r in rows] == ["compare", "compare", "bisect", "confirm"]
    # Each row links to its run's page and to the change it re-tests ...
    links = {a["href"] for t, a in dom.tags if t == "a" and "href" in a}
    for run_id in planted.followups:
        assert f"{APP}/suites/{DAG}?run_id={run_id.replace('+', '%2B')}" in links
    assert [a for t, a in dom.tags if t == "a" and a.get("class") == "change-link"] == [
        {"class": "change-link", "href": f"#group-{planted.group}"}
    ] * 2
    # ... and the change's entry links to its runs in the section.
    (entry,) = [a for t, a in dom.tags if t == "tr" and a.get("id") == f"group-{planted.group}"]
    assert entry["data-state"] == "untriaged"
    assert f'href="#retests-group-{planted.group}"' in page
    assert page.count(f'id="retests-group-{planted.group}"') == 1
    assert page.index('id="history"') < page.index('id="retests"')


def test_accepting_a_change_clears_the_regression_badge(store: ResultsStore) -> None:
    planted = plant(store)
    view = history.load_history(store, DAG, 30)
    assert view.rows[0].marks == ["regression"]
    run = model.load_run_view(store, DAG)
    assert run.cells[0].badges == ["regression"]
    assert 'class="badge b-regression"' in render.run_page(run, ui_base="", app_base=APP)
    apply_triage(store, "group", planted.group, "accepted", by="alice", dag_id=DAG)
    view = history.load_history(store, DAG, 30)
    assert view.rows[0].marks == [] and view.counts["regression"] == 0
    page = render.history_page(view, page_base=APP, n_runs=30)
    assert 'class="badge b-regression"' not in page
    run = model.load_run_view(store, DAG)
    assert run.cells[0].badges == []
    assert [s.status for t in run.trends for s in t.series] == ["ok"]
    page = render.run_page(run, ui_base="", app_base=APP)
    assert 'class="badge b-regression"' not in page and 'class="badge b-suspicious"' not in page


def test_a_settled_change_leaves_what_the_bounds_say(store: ResultsStore) -> None:
    """Closed as something else than accepted (invalid, fixed, ...): no regression, but a
    series whose last points lie out of its bounds is still suspicious; a new open change
    on it brings the badge back."""
    planted = plant(store)
    row = store.get_series_status(DAG)[0]
    store.replace_series_status(DAG, [msgspec.structs.replace(row, trailing=2)], window_days=30)
    apply_triage(store, "group", planted.group, "invalid", by="alice", dag_id=DAG)
    assert history.load_history(store, DAG, 30).rows[0].marks == []
    assert model.load_run_view(store, DAG).cells[0].badges == ["suspicious"]
    point = store.get_change_points(DAG)[0]
    store.save_change_point(
        DAG,
        **{k: getattr(point, k) for k in ("cell_id", "metric", "direction", "run_id")}, logical_date=DATES[-1], position=9, n_before=9, n_after=1,
    )  # fmt: skip
    assert history.load_history(store, DAG, 30).rows[0].marks == ["regression"]
