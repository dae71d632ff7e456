"""Perf history on the matrix page (issue 26, points 4 and 6): change points marked on the
trend charts, x-axis ticks on whole days, the history view ordered by logical date and
build with distinct headers, the change list (open regressions first) and its triage
forms, and the triage route's same-origin rule. Rendered from a real (temporary) results
store; change points and groups are planted as the gate stores them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from accelmatrix.contracts.change_point_records import ChangePoint
from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import history, model, render
from accelmatrix.ui.trend import H, x_ticks
from accelmatrix.ui.trend_model import Point, Series, Trend
from accelmatrix_testkit.matrix_results import PlantedCell, plant_run

APP = "/base/accelmatrix"
VIEW = "/base/plugin/accelmatrix"
DAG = "nightly"
# A backfill of 7 nightly builds: logical dates 11-21 .. 11-27 (a daily schedule: midnight).
DATES = [datetime(2026, 11, 21, tzinfo=UTC) + timedelta(days=i) for i in range(7)]
FIRST_BAD = 3  # 11-24: cell a's step time moves from 1.00 to 1.05 from this build on


VOID = {"input", "br", "meta", "img", "link", "hr"}


class Svg(HTMLParser):
    """Every start tag with its attributes (in order), the text of each <text> and <title>
    with the tag it belongs to, and the href of the link around each element."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: list[tuple[dict[str, str], str]] = []  # <text> attrs, its text
        self.titles: list[tuple[str, dict[str, str], str]] = []  # parent tag, attrs, title
        self._stack: list[tuple[str, dict[str, str]]] = []
        self.links: list[tuple[str, str, dict[str, str]]] = []  # href, child tag, attrs
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        for ptag, pa in reversed(self._stack):
            if ptag == "a":
                self.links.append((pa.get("href", ""), tag, a))
                break
        if tag not in VOID:
            self._stack.append((tag, a))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self._stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data: str) -> None:
        if not self._stack:
            return
        tag, a = self._stack[-1]
        if tag == "text":
            self.texts.append((a, data))
        elif tag == "title" and len(self._stack) >= 2:
            self.titles.append((*self._stack[-2], data))

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.tags
            if t == tag and (cls is None or cls in a.get("class", "").split())
        ]


# -- planting -------------------------------------------------------------------------------
@dataclass
class Planted:
    run_ids: list[str]  # by logical date
    group: int  # the build regression (untriaged)
    change: int  # its change point on cell a


def plant_backfill(store: ResultsStore, dag_id: str = DAG) -> Planted:
    """Today (11-28) a scheduled run for 11-27 ran at 00:05, then a backfill of 11-21 ..
    11-26 was started at 09:00 (its runs start after the scheduled one). Cell ``c=a`` steps
    up 5 % from build nightly-2026-11-24 on; the change point and its group are stored as
    the gate stores them."""
    today = datetime(2026, 11, 28, tzinfo=UTC)
    run_ids = []
    for i, when in enumerate(DATES):
        scheduled = i == len(DATES) - 1
        run_id = f"{'scheduled' if scheduled else 'backfill'}__{when:%Y-%m-%dT%H:%M:%S}+00:00"
        started = today + (timedelta(minutes=5) if scheduled else timedelta(hours=9, minutes=i))
        a = 1.05 if i >= FIRST_BAD else 1.0
        cells = [
            PlantedCell("c=a", {"c": "a"}, 0, step_time=a, benchmark="a", lower=0.9, upper=1.1),
            PlantedCell("c=b", {"c": "b"}, 1, step_time=2.0, benchmark="b", lower=1.8, upper=2.2),
        ]
        plant_run(
            store, dag_id, run_id, cells, logical_date=when, started_at=started, state="passed"
        )
        store.upsert_run(dag_id, run_id, runtime_version=f"nightly-{when:%Y-%m-%d}")
        run_ids.append(run_id)
    bad, good = DATES[FIRST_BAD], DATES[FIRST_BAD - 1]
    common = {
        "logical_date": bad,
        "runtime_version": f"nightly-{bad:%Y-%m-%d}",
        "prev_logical_date": good,
        "prev_runtime_version": f"nightly-{good:%Y-%m-%d}",
        "direction": "regression",
    }
    group = store.save_change_group(
        dag_id,
        **common,
        kind="build",
        run_id=run_ids[FIRST_BAD],
        summary="build nightly-2026-11-24 slowed step_time of 1 cell by 5.0 %",
        series_count=1,
        cells=["c=a"],
        machines=["cpu"],
        metrics=["step_time"],
        change_median=0.05,
        change_min=0.05,
        change_max=0.05,
    )
    change = store.save_change_point(
        dag_id,
        **common,
        cell_id="c=a",
        metric="step_time",
        benchmark="a",
        machine="cpu",
        backend="local",
        run_id=run_ids[FIRST_BAD],
        prev_run_id=run_ids[FIRST_BAD - 1],
        position=FIRST_BAD,
        n_before=3,
        n_after=4,
        mean_before=1.0,
        mean_after=1.05,
        median_before=1.0,
        median_after=1.05,
        std_before=0.0,
        std_after=0.0,
        change=0.05,
        effect=9.0,
        p_value=1.2e-5,
        group_id=group,
    )
    return Planted(run_ids, group, change)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultsStore:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "suites"))
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(tmp_path / "include"))
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    s.ensure_schema()
    yield s
    s.close()


# -- the x-axis -----------------------------------------------------------------------------
def _x_labels(svg: str) -> list[tuple[float, str]]:
    """(x, label) of the x-axis tick labels (the <text> on the axis line's baseline)."""
    dom = Svg(svg)
    return [(float(a["x"]), t) for a, t in dom.texts if a.get("y") == str(H - 12)]


def _points(svg: str) -> list[tuple[float, float, str]]:
    dom = Svg(svg)
    out = []
    for tag, a, title in dom.titles:
        if tag == "circle":
            out.append((float(a["cx"]), float(a["cy"]), title))
    return out


def _trend(times: list[datetime], values: list[float] | None = None) -> Trend:
    values = values or [1.0] * len(times)
    pts = [
        Point(t, v, 0.9, 1.1, run_id=f"r{i}", build=f"nightly-{t:%Y-%m-%d}")
        for i, (t, v) in enumerate(zip(times, values, strict=True))
    ]
    band = [(p.time, p.lower, p.upper) for p in pts]
    return Trend("a", "step_time", [Series("c=a", "ok", pts)], band, None)


@pytest.mark.parametrize("hour", [0, 2, 23])
def test_backfill_ticks_sit_on_whole_days_under_their_own_points(hour: int) -> None:
    """Issue 26 point 6: 7 nightly builds. The label nearest each point (what a reader
    reads under it) names the point's own logical date; every tick is a UTC midnight, whole
    days apart. Before, ticks fell at quarters of the span and the 11-23 point sat nearest
    the tick labelled 11-22, so a reader named the wrong first bad build."""
    from accelmatrix.ui.trend import render_trend

    times = [d + timedelta(hours=hour) for d in DATES]
    svg = render_trend(_trend(times), "t")
    labels = _x_labels(svg)
    points = _points(svg)
    assert len(points) == 7 and len(labels) >= 6
    names = lambda t: (f"{t:%Y-%m-%d}", f"{t:%m-%d}")  # noqa: E731
    for (cx, _, title), when in zip(points, times, strict=True):
        # The point lies right of its own day's tick and left of the next day's.
        left = [lb for x, lb in labels if x <= cx + 0.05]
        right = [lb for x, lb in labels if x > cx + 0.05]
        assert left and left[-1] in names(when), (when, labels)
        assert not right or right[0] in names(when + timedelta(days=1)), (when, labels)
        if hour < 12:  # a nightly point by its day's tick: the nearest label is its day
            nearest = min(labels, key=lambda lx: abs(lx[0] - cx))[1]
            assert nearest in names(when), (when, nearest, labels)
        # The tooltip names the build and the logical date.
        assert f"build nightly-{when:%Y-%m-%d}" in title and f"{when:%Y-%m-%d %H:%M}" in title
    ticks = [t for t, _, _ in x_ticks(times[0], times[-1], 666)]
    assert all((t.hour, t.minute, t.second) == (0, 0, 0) and t.tzinfo == UTC for t in ticks)
    assert {(b - a) for a, b in zip(ticks, ticks[1:], strict=False)} == {timedelta(days=1)}
    # Days in order left to right, one label each.
    xs = [x for x, _ in labels]
    assert xs == sorted(xs) and len({lb for _, lb in labels}) == len(labels)


def test_long_and_short_spans_get_readable_whole_unit_ticks() -> None:
    # 90 nightly points: whole days, a week or more apart, labels that do not collide.
    start = datetime(2026, 8, 1, 2, tzinfo=UTC)
    ticks = x_ticks(start, start + timedelta(days=89), 666)
    days = {(b[0] - a[0]).days for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(days) == 1 and days.pop() >= 7
    assert all(t.hour == 0 and t.minute == 0 for t, _, _ in ticks)
    assert 3 <= len(ticks) <= 14
    # Runs of one afternoon: whole hours, labelled with the time.
    start = datetime(2026, 11, 27, 13, 10, tzinfo=UTC)
    ticks = x_ticks(start, start + timedelta(hours=5), 666)
    assert ticks and all(t.minute == 0 and t.second == 0 for t, _, _ in ticks)
    assert all(":" in label for _, label, _ in ticks)
    assert len({label for _, label, _ in ticks}) == len(ticks)


# -- change points on the chart ---------------------------------------------------------------
def _mark(**kw: object) -> ChangePoint:
    bad, good = DATES[FIRST_BAD], DATES[FIRST_BAD - 1]
    fields: dict[str, object] = {
        "id": 11,
        "dag_id": DAG,
        "cell_id": "c=a",
        "metric": "step_time",
        "group_id": 7,
        "logical_date": bad,
        "run_id": "backfill__2026-11-24T00:00:00+00:00",
        "runtime_version": "nightly-2026-11-24",
        "prev_logical_date": good,
        "prev_run_id": "backfill__2026-11-23T00:00:00+00:00",
        "prev_runtime_version": "nightly-2026-11-23",
        "mean_before": 1.0,
        "mean_after": 1.05,
        "median_before": 1.0,
        "median_after": 1.04,
        "change": 0.05,
        "p_value": 1.2e-5,
        "direction": "regression",
        "state": "acknowledged",
        "state_by": "alice",
        "state_at": datetime(2026, 11, 28, 9, 30, tzinfo=UTC),
    }
    fields.update(kw)
    return ChangePoint(**fields)  # type: ignore[arg-type]


def test_change_point_marked_at_its_first_run_with_tooltip_and_links() -> None:
    from accelmatrix.ui.trend import render_trend

    values = [1.0 if i < FIRST_BAD else 1.05 for i in range(7)]
    trend = _trend(DATES, values)
    trend.series[0].changes = [_mark()]
    svg = render_trend(trend, "t", suite_url=f"{APP}/suites/{DAG}")
    dom = Svg(svg)
    (g,) = dom.find("g", "change")
    assert g["data-change-id"] == "11" and g["data-group-id"] == "7"
    assert g["data-time"] == DATES[FIRST_BAD].isoformat() and g["data-state"] == "acknowledged"
    assert "c-regression" in g["class"].split()
    # The vertical line is at the first run's point, the diamond on it.
    cx, cy, _ = _points(svg)[FIRST_BAD]
    lines = dom.find("line", "cp-line")
    assert len(lines) == 1 and float(lines[0]["x1"]) == pytest.approx(cx, abs=0.06)
    (diamond,) = dom.find("path", "cp-mark")
    nums = [float(v) for v in re.findall(r"[-0-9.]+", diamond["d"])]
    assert sum(nums[0::2]) / 4 == pytest.approx(cx, abs=0.1)
    assert sum(nums[1::2]) / 4 == pytest.approx(cy, abs=0.1)
    # Hover: before -> after, % change, significance, builds, state.
    tips = [t for tag, a, t in dom.titles if tag in ("a", "g") and "cp-" in a.get("class", "")]
    assert len(tips) == 2
    tip = tips[0]
    assert "regression of step_time on c=a: +5.0 %" in tip
    assert "mean 1 -> 1.05" in tip and "median 1 -> 1.04" in tip
    assert "p-value 1.2e-05" in tip
    assert "builds nightly-2026-11-23 (2026-11-23) -> nightly-2026-11-24 (2026-11-24)" in tip
    assert "state acknowledged by alice at 2026-11-28 09:30 UTC" in tip
    # Click: the group's entry on the history page (the line) and the run (the diamond).
    hrefs = {child_a.get("class"): href for href, _, child_a in dom.links}
    assert hrefs["cp-line"] == f"{APP}/suites/{DAG}/history#group-7"
    assert hrefs["cp-mark"] == f"{APP}/suites/{DAG}?run_id=backfill__2026-11-24T00:00:00%2B00:00"
    assert "+5.0 %" in [t for a, t in dom.texts if a.get("class") == "cp-label"]
    # Without a group the link names the change point itself; a change outside the chart's
    # window is not drawn.
    trend.series[0].changes = [
        _mark(group_id=None),
        _mark(id=12, logical_date=DATES[0] - timedelta(9)),
    ]
    dom = Svg(render_trend(trend, "t", suite_url=f"{APP}/suites/{DAG}"))
    assert [g["data-change-id"] for g in dom.find("g", "change")] == ["11"]
    assert {h for h, _, _ in dom.links} >= {f"{APP}/suites/{DAG}/history#change-11"}


def test_run_page_marks_stored_change_points(store: ResultsStore) -> None:
    planted = plant_backfill(store)
    view = model.load_run_view(store, DAG, planted.run_ids[-1])
    assert view is not None and view.run.run_id == planted.run_ids[-1]
    (a,) = [t for t in view.trends if t.benchmark == "a"]
    (b,) = [t for t in view.trends if t.benchmark == "b"]
    assert [c.id for c in a.series[0].changes] == [planted.change]
    assert b.series[0].changes == []  # cell b did not move
    assert [p.build for p in a.series[0].points] == [f"nightly-{d:%Y-%m-%d}" for d in DATES]
    page = render.run_page(view, ui_base="/base", app_base=APP, page_base=VIEW)
    dom = Svg(page)
    (g,) = dom.find("g", "change")
    assert g["data-cell-id"] == "c=a" and g["data-build"] == "nightly-2026-11-24"
    assert g["data-group-id"] == str(planted.group) and g["data-state"] == "untriaged"
    hrefs = [h for h, _, a in dom.links if a.get("class") == "cp-line"]
    assert hrefs == [f"{VIEW}/suites/{DAG}/history#group-{planted.group}"]
    # Accepted later: the mark says so.
    store.set_triage("group", planted.group, "accepted", by="bob")
    view = model.load_run_view(store, DAG, planted.run_ids[-1])
    assert "t-accepted" in Svg(render.run_page(view, ui_base="", app_base=APP)).find("g", "change")[
        0
    ]["class"].split(" ")


# -- the history view --------------------------------------------------------------------------
def test_history_orders_runs_by_logical_date_and_build(store: ResultsStore) -> None:
    """The scheduled run of 11-27 started before the backfill of 11-21 .. 11-26 did: the
    columns still read 11-21 .. 11-27, each header distinct."""
    planted = plant_backfill(store)
    # The run page's "latest run" is the newest build too, not the backfill run that
    # started last.
    assert store.get_runs(DAG, limit=1)[0].run_id == planted.run_ids[-1]
    view = history.load_history(store, DAG, 30)
    assert [r.run_id for r in view.runs] == planted.run_ids
    labels = history.run_labels(view.runs)
    assert labels == [f"{d:%m-%d} nightly-{d:%Y-%m-%d}" for d in DATES]
    # The last N runs are the N latest builds, not the N latest starts.
    short = history.load_history(store, DAG, 3)
    assert [r.run_id for r in short.runs] == planted.run_ids[-3:]

    # Two manual runs of today (same logical date, no build) and a re-run of 11-27's build:
    # every header still distinct.
    for i, minute in enumerate((10, 40)):
        when = datetime(2026, 11, 28, 15, minute, tzinfo=UTC)
        plant_run(store, DAG, f"manual__{i}", [], logical_date=when, started_at=when)
    rerun = DATES[-1]
    plant_run(
        store, DAG, "manual__rerun", [], logical_date=rerun, started_at=rerun + timedelta(days=1)
    )
    store.upsert_run(DAG, "manual__rerun", runtime_version=f"nightly-{rerun:%Y-%m-%d}")
    view = history.load_history(store, DAG, 30)
    ids = [r.run_id for r in view.runs]
    assert ids[:6] == planted.run_ids[:6]
    assert set(ids[6:8]) == {planted.run_ids[-1], "manual__rerun"}
    assert ids[8:] == ["manual__0", "manual__1"]
    labels = history.run_labels(view.runs)
    assert len(set(labels)) == len(labels), labels
    assert labels[-2:] == ["11-28 15:10", "11-28 15:40"]
    dom = Svg(render.history_page(view, page_base=APP, n_runs=30))
    heads = [a for t, a in dom.tags if t == "a" and a.get("class") == "run"]
    assert len(heads) == len(ids)
    assert "build nightly-2026-11-21" in heads[0]["title"]


def _group(store: ResultsStore, when: datetime, state: str, direction: str, kind: str) -> int:
    return store.save_change_group(
        DAG,
        kind=kind,
        direction=direction,
        logical_date=when,
        runtime_version=f"nightly-{when:%Y-%m-%d}",
        summary=f"{kind} {direction} {state}",
        series_count=2,
        cells=["c=a", "c=b"],
        machines=["cpu"],
        metrics=["step_time"],
        change_median=0.05 if direction == "regression" else -0.05,
        state=state,
    )


def test_change_list_open_regressions_first_with_triage_forms(store: ResultsStore) -> None:
    planted = plant_backfill(store)
    d = DATES
    older_open = _group(store, d[1], "acknowledged", "regression", "infrastructure")
    newest_closed = _group(store, d[6], "accepted", "regression", "build")
    improvement = _group(store, d[5], "untriaged", "improvement", "build")
    invalid = _group(store, d[4], "invalid", "regression", "series")
    store.set_triage("group", older_open, "acknowledged", by="carol", note="bisecting")
    view = history.load_history(store, DAG, 30)
    order = [(e.what, e.id) for e in view.changes]
    assert order == [
        ("group", planted.group),  # open regressions, newest first
        ("group", older_open),
        ("group", newest_closed),  # then the rest, newest first
        ("group", improvement),
        ("group", invalid),
    ]
    # Read-only: the states, who and when, but no form.
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=False)
    dom = Svg(page)
    rows = [a for t, a in dom.tags if t == "tr" and "change-entry" in a.get("class", "")]
    assert [r["id"] for r in rows] == [f"group-{i}" for _, i in order]
    assert [r["data-state"] for r in rows[:2]] == ["untriaged", "acknowledged"]
    assert [("open" in r["class"].split()) for r in rows] == [True, True, False, False, False]
    assert not dom.find("form", "triage")
    assert "by carol" in page and "bisecting" in page
    assert "build nightly-2026-11-24 slowed step_time of 1 cell by 5.0 %" in page
    assert "nightly-2026-11-23 (2026-11-23) &rarr; " in page  # last good -> first bad
    # Ordered above the grid.
    assert page.index('id="changes"') < page.index('id="history"')

    # An editor gets one form per entry, POSTing to the app (not the view), current state
    # selected; inside the view a hidden field brings the redirect back there.
    page = render.history_page(view, page_base=VIEW, n_runs=30, form_base=APP, can_edit=True)
    dom = Svg(page)
    forms = dom.find("form", "triage")
    assert [f["action"] for f in forms] == [
        f"{APP}/suites/{DAG}/changes/group/{i}/triage" for _, i in order
    ]
    assert all(f["method"] == "post" for f in forms)
    selected = [a["value"] for t, a in dom.tags if t == "option" and "selected" in a]
    assert selected == ["untriaged", "acknowledged", "accepted", "untriaged", "invalid"]
    assert len([a for t, a in dom.tags if t == "input" and a.get("name") == "embed"]) == 5
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    assert 'name="embed"' not in page

    # A change point no group holds is listed on its own, triaged as a change.
    store.save_change_group(DAG, state="fixed", id=planted.group)
    store.save_change_point(DAG, group_id=None, id=planted.change)
    view = history.load_history(store, DAG, 30)
    assert ("change", planted.change) in [(e.what, e.id) for e in view.changes]
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    assert f'id="change-{planted.change}"' in page
    assert f"/changes/change/{planted.change}/triage" in page


def test_change_list_is_escaped_and_closed_groups_capped(store: ResultsStore) -> None:
    plant_backfill(store)
    hostile = '<script>alert("x")</script>'
    store.save_change_group(
        DAG,
        kind="series",
        direction="regression",
        logical_date=DATES[0],
        runtime_version=hostile,
        prev_runtime_version=hostile,
        summary=hostile,
        cells=[hostile],
        state="untriaged",
        note=hostile,
    )
    for i in range(history.MAX_OTHER_GROUPS + 3):
        _group(store, DATES[0] - timedelta(days=i + 1), "fixed", "regression", "series")
    view = history.load_history(store, DAG, 30)
    assert view.changes_hidden == 3
    assert len(view.changes) == 2 + history.MAX_OTHER_GROUPS
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "3 older closed change(s) not listed" in page


def test_no_change_tables_no_list(store: ResultsStore) -> None:
    plant_backfill(store)
    store.delete_change_points([p.id for p in store.get_change_points(DAG)])
    store.delete_change_groups([g.id for g in store.get_change_groups(DAG)])
    view = history.load_history(store, DAG, 30)
    assert view.changes == []
    page = render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=True)
    assert "No change point found" in page and 'class="triage"' not in page


# -- the triage route's same-origin rule ------------------------------------------------------
def _request(headers: dict[str, str]):  # noqa: ANN202 - starlette's Request
    from starlette.requests import Request

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({"Host": "airflow:8080", "Origin": "http://airflow:8080"}, True),
        ({"Host": "airflow:8080", "Origin": "https://AIRFLOW:8080"}, True),
        ({"Host": "airflow:8080", "Referer": "http://airflow:8080/accelmatrix/x"}, True),
        ({"Host": "10.0.0.1:8080", "Origin": "https://airflow.example.com"}, True),  # base_url
        ({"Host": "proxy", "X-Forwarded-Host": "airflow.example.com",
          "Origin": "https://airflow.example.com"}, True),
        ({"Host": "airflow:8080", "Authorization": "Bearer x"}, True),  # no cookie riding
        ({"Host": "airflow:8080", "Origin": "http://evil.example"}, False),
        ({"Host": "airflow:8080", "Origin": "http://airflow:9999"}, False),  # another port
        ({"Host": "airflow:8080", "Origin": "null"}, False),
        ({"Host": "airflow:8080"}, False),  # neither Origin nor Referer
        ({"Host": "airflow:8080", "Referer": "http://evil.example/airflow:8080"}, False),
        ({"Host": "airflow:8080", "Origin": "javascript://airflow:8080"}, False),
    ],
)  # fmt: skip
def test_same_origin_rule(headers: dict[str, str], ok: bool) -> None:
    from accelmatrix.ui.app import same_origin

    assert same_origin(_request(headers), "https://airflow.example.com/") is ok


def test_tracked_metric_without_bounds_is_drawn_with_its_change(
    store: ResultsStore, tmp_path: Path
) -> None:
    """A metric the suite's ``history.track`` follows with no perf check (no bounds) gets
    its own chart, its points the statistic the detector reads (here the mean of the steps),
    and its change point marked."""
    planted = plant_backfill(store)
    suite = (Path(__file__).parents[1] / "include" / "suites" / "local_smoke.yaml").read_text()
    suite += "\nhistory:\n  track: {tokens_per_s: mean}\n  higher_is_better: [tokens_per_s]\n"
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / f"{DAG}.yaml").write_text(suite)
    for i, run_id in enumerate(planted.run_ids):
        level = 100.0 if i < FIRST_BAD else 90.0
        steps = [
            MetricValue(name="tokens_per_s", step=s, value=level + d)
            for s, d in enumerate((-1, 0, 4))
        ]
        store.replace_metrics(DAG, run_id, "c=b", steps)
    store.save_change_point(
        DAG,
        cell_id="c=b",
        metric="tokens_per_s",
        run_id=planted.run_ids[FIRST_BAD],
        logical_date=DATES[FIRST_BAD],
        runtime_version=f"nightly-{DATES[FIRST_BAD]:%Y-%m-%d}",
        position=FIRST_BAD,
        n_before=3,
        n_after=4,
        mean_before=101.0,
        mean_after=91.0,
        change=-0.099,
        direction="regression",
    )
    view = model.load_run_view(store, DAG, planted.run_ids[-1])
    (t,) = [t for t in view.trends if t.metric == "tokens_per_s"]
    assert t.benchmark == "" and t.band == [] and [s.cell_id for s in t.series] == ["c=b"]
    assert [round(p.value, 3) for p in t.series[0].points] == [101.0] * 3 + [91.0] * 4
    assert [c.runtime_version for c in t.series[0].changes] == ["nightly-2026-11-24"]
    page = render.run_page(view, ui_base="", app_base=APP)
    assert "<b>tokens_per_s</b> &middot; tracked, no bounds" in page
    assert page.count('class="change ') == 2  # step_time of c=a, tokens_per_s of c=b
    # Without the suite file: no such chart, the page still renders.
    (tmp_path / "suites" / f"{DAG}.yaml").unlink()
    view = model.load_run_view(store, DAG, planted.run_ids[-1])
    assert [t.metric for t in view.trends] == ["step_time", "step_time"]
