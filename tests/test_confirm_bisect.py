"""Confirm and bisect: the comparison and its verdicts by size, the search over builds, the
builds between two builds, the session's plan and its driver run for real, and the whole
loop against a real SQLite results store: a planted history night by night, the gate's
pass, the re-test started once, its sessions planted from the known truth (one machine per
session, as the session cell's log would show it) and advanced, until the change is
confirmed, bisected or dismissed.

The statistics' error rates over many generated fleets are bench/bench_confirm.py's;
these tests pin the behaviour on cases with known answers, and the rates on a small
number of generated trials each."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from accelmatrix.contracts.change_point_records import ChangeGroup, Confirmation
from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.history.change_points.report import changes_json, changes_table
from accelmatrix.history.change_points.tracking import groups_to_notify, update_changes
from accelmatrix.history.retests.bisect import AMBIGUOUS, FOUND, RUNNING, Search, spread
from accelmatrix.history.retests.builds import BuildsError, builds_between, date_template
from accelmatrix.history.retests.compare import (
    DIFFERENT,
    NEW_LEVEL,
    OLD_LEVEL,
    SAME,
    UNKNOWN,
    compare,
    judge,
    level,
)
from accelmatrix.history.retests.confirm import newest_point_suspect
from accelmatrix.history.retests.followup import advance, start_confirmations
from accelmatrix.history.retests.session import pairs_of, read_samples
from accelmatrix.history.series.detector import DEFAULT
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import (
    FOLLOWUP_KEY,
    Followup,
    base_cell,
    expand_followup,
    followup_of,
    session_order,
)
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.plan import PlanError
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix

ROOT = Path(__file__).resolve().parents[1]
TRACKED = {"step_time": "median"}

# -- the comparison ------------------------------------------------------------------------


def _session(rng, change: float, pairs: int, cv: float = 0.01, machine_sd: float = 0.03):
    """``pairs`` A/B pairs of one machine (its speed drawn once): base level 1, head
    ``1 + change``."""
    m = 1 + machine_sd * rng.standard_normal()
    a = m * (1 + cv * rng.standard_normal(pairs))
    b = m * (1 + change) * (1 + cv * rng.standard_normal(pairs))
    return compare(a, b, list(zip(a, b, strict=True)))


def test_compare_reports_both_sides_the_change_its_interval_and_the_tests() -> None:
    rng = np.random.default_rng(3)
    c = _session(rng, 0.05, 12)
    assert c.n_base == c.n_head == c.pairs == 12
    assert 0.035 < c.change < 0.065 and c.ci_low < c.change < c.ci_high
    assert c.ci_low > 0 and c.p_paired < 0.01 and c.p_greater < 0.01 and c.p_less > 0.5
    assert c.cliffs_delta > 0.3 and 0 <= c.p_mwu <= 1
    assert c.median_head > c.median_base
    # NaN, None and non-positive samples are no evidence; fewer than 2 pairs, no change.
    c = compare([1.0, float("nan")], [1.1, None], [(1.0, 1.1), (float("nan"), 1.0)])
    assert c.pairs == 1 and np.isnan(c.change) and judge(c, min_change=0.02) == UNKNOWN


def test_the_interval_covers_the_true_change_as_often_as_it_says() -> None:
    # 8 pairs is a re-test's first session: a percentile bootstrap alone covers ~88 %.
    rng = np.random.default_rng(11)
    trials = 300
    hits = sum(
        c.ci_low <= 0.02 <= c.ci_high for c in (_session(rng, 0.02, 8) for _ in range(trials))
    )
    assert hits / trials >= 0.92, hits / trials


def test_judge_weighs_size_as_well_as_significance() -> None:
    rng = np.random.default_rng(5)
    assert judge(_session(rng, 0.08, 16), min_change=0.02) == DIFFERENT
    assert judge(_session(rng, 0.0, 24, cv=0.005), min_change=0.02) == SAME
    # 0.5 % slower, tightly measured: significant, yet no change worth a page.
    tiny = _session(rng, 0.005, 40, cv=0.002)
    assert tiny.p_paired < 0.01 and judge(tiny, min_change=0.02) == SAME
    assert judge(_session(rng, 0.05, 4), min_change=0.02) == UNKNOWN  # too few pairs


def test_level_places_a_build_nearer_the_claimed_change_or_nearer_none() -> None:
    rng = np.random.default_rng(7)
    assert level(_session(rng, 0.05, 12), claimed=0.05) == NEW_LEVEL
    assert level(_session(rng, 0.0, 12), claimed=0.05) == OLD_LEVEL
    # A build 1 % slower by chance is at the old level of a 5 % change, not "bad".
    assert level(_session(rng, 0.01, 16), claimed=0.05) == OLD_LEVEL
    # For throughput lower is worse: the same samples read the other way.
    lower = _session(rng, -0.05, 12)
    assert level(lower, claimed=0.05, higher_is_better=True) == NEW_LEVEL
    assert level(lower, claimed=0.05) == OLD_LEVEL


def test_level_error_rates_on_generated_sessions() -> None:
    """A build 1 % off by itself (builds differ by +-1.5 %), a 3 % change: each placed on
    the wrong side in under 5 % of 200 sessions of 16 pairs, machines 3 % apart."""
    rng = np.random.default_rng(13)
    wrong_new = sum(level(_session(rng, 0.01, 16), claimed=0.03) == NEW_LEVEL for _ in range(200))
    wrong_old = sum(level(_session(rng, 0.03, 16), claimed=0.03) == OLD_LEVEL for _ in range(200))
    none = sum(level(_session(rng, 0.0, 16), claimed=0.03) == NEW_LEVEL for _ in range(200))
    assert wrong_new <= 10 and wrong_old <= 10 and none <= 2, (wrong_new, wrong_old, none)


def test_newest_point_suspect() -> None:
    rng = np.random.default_rng(0)
    x = list(100 + 2 * rng.standard_normal(30))
    assert newest_point_suspect(x) is None
    change, effect = newest_point_suspect([*x, 112.0])
    assert effect > 3 and 0.10 < change < 0.14
    # Faster is not a suspect regression; for throughput lower is.
    assert newest_point_suspect([*x, 88.0]) is None
    assert newest_point_suspect([*x, 88.0], higher_is_better=True) is not None
    assert newest_point_suspect([100.0] * 5 + [150.0]) is None  # too little history


def test_a_build_slow_by_itself_just_after_a_step_is_not_a_second_suspect() -> None:
    """A step 4 nights back that only the candidates' detector places, then a build 2.5 %
    slow by itself at the new level (builds differ by ~1 % by themselves): the newest night
    is judged against the nights since that step, so it is not a one-point change of its
    own. Judged against all 12 nights before it (a median between the two levels) it stood
    5-6 % out, 3 sigmas of the night-to-night noise, on ~1 try in 5: a second re-test and a
    second page for the one cause."""
    import pandas as pd

    from accelmatrix.history.change_points.tracking import find_changes

    rng = np.random.default_rng(7)
    nights = pd.date_range("2026-03-01", periods=13, freq="D", tz="UTC")
    second = 0
    for _ in range(200):
        builds = 1 + 0.01 * rng.standard_normal(13)
        builds[8:] *= 1.05
        builds[12] = builds[8:12].mean() * 1.025
        values = builds * (1 + 0.005 * rng.standard_normal(13))
        hist = pd.DataFrame(
            {
                "cell_id": "model=small",
                "metric": "step_time",
                "time": nights,
                "value": values,
                "run_id": [f"r{k}" for k in range(13)],
                "runtime_version": [f"b{k}" for k in range(13)],
                "machine": "cpu",
            }
        )
        points, _series = find_changes(hist, higher_is_better=lambda m: False, suspects=True)
        second += bool(len(points)) and bool((points["position"] == 12).any())
    assert second <= 2, second


# -- the search over builds --------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 7, 16])
def test_search_names_every_culprit_from_the_levels(n: int) -> None:
    builds = [f"b{i}" for i in range(n + 1)]
    for culprit in range(1, n + 1):
        levels = {b: (NEW_LEVEL if i >= culprit else OLD_LEVEL) for i, b in enumerate(builds)}
        s = Search(builds, levels)
        assert s.state == FOUND and s.culprit == f"b{culprit}" and s.last_good == f"b{culprit - 1}"
        # With only the ends known, every build between is still open.
        s = Search(builds, {builds[-1]: NEW_LEVEL})
        assert s.untested() == builds[1:-1] and (s.state == FOUND) == (n == 1 or len(builds) == 2)


def test_search_stops_ambiguous_on_a_level_that_does_not_hold() -> None:
    builds = [f"b{i}" for i in range(6)]
    s = Search(builds, {"b2": NEW_LEVEL, "b4": OLD_LEVEL, "b5": NEW_LEVEL})
    assert s.state == AMBIGUOUS and "b2 is at the new level" in s.contradiction
    s = Search(builds, {"b2": OLD_LEVEL, "b3": UNKNOWN, "b5": NEW_LEVEL})
    assert s.state == RUNNING and s.untested() == ["b3", "b4"]
    with pytest.raises(ValueError):
        Search(["a"], {})
    assert spread([f"x{i}" for i in range(20)], 6) == ["x2", "x5", "x8", "x11", "x14", "x17"]
    assert spread(["a", "b"], 6) == ["a", "b"] and spread(["a"], 0) == []


# -- the builds between two builds --------------------------------------------------------


def test_builds_named_by_date_are_the_days_between() -> None:
    out = builds_between("nightly-2026-03-01", "nightly-2026-03-05", template="nightly-${run.ds}")
    assert out == [f"nightly-2026-03-0{d}" for d in range(1, 6)]
    out = builds_between(
        "r20260301-py3", "r20260303-py3", template="r${run.ds_nodash}-${params.python}"
    )
    assert out == ["r20260301-py3", "r20260302-py3", "r20260303-py3"]
    assert date_template("v${params.version}") is None


def test_builds_from_an_argv_command(tmp_path: Path) -> None:
    script = tmp_path / "list_builds.py"
    script.write_text(
        "import sys\nb = ['abc1', 'abc2', 'abc3', 'abc4']\n"
        "print('\\n'.join(b[b.index(sys.argv[1]) : b.index(sys.argv[2]) + 1]))\n"
    )
    cmd = [sys.executable, str(script), "${from}", "${to}"]
    assert builds_between("abc1", "abc4", template=None, list_command=cmd) == [
        "abc1",
        "abc2",
        "abc3",
        "abc4",
    ]
    # A value with shell syntax reaches the command as one argument, never a shell.
    with pytest.raises(BuildsError, match="exited with 1"):
        builds_between("x; touch /tmp/pwned", "abc4", template=None, list_command=cmd)


def test_builds_errors_name_what_to_write() -> None:
    with pytest.raises(BuildsError, match="builds: \\{list"):
        builds_between("v1", "v2", template="v${params.v}")
    with pytest.raises(BuildsError, match="not after"):
        builds_between("n-2026-03-05", "n-2026-03-01", template="n-${run.ds}")
    with pytest.raises(BuildsError, match="does not match"):
        builds_between("n-2026-03-01", "other", template="n-${run.ds}")


# -- the session's plan and its driver -----------------------------------------------------


def test_session_order_is_palindromes_of_the_builds() -> None:
    assert session_order(2, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    assert session_order(3, 3) == [0, 1, 2, 2, 1, 0, 0, 1, 2]


def test_session_plan_is_one_cell_per_suspect_cell_running_every_build() -> None:
    suite = load_suite(ROOT / "include" / "suites" / "nightly_perf.yaml")
    builds = ["nightly-2026-03-05", "nightly-2026-03-06", "nightly-2026-03-07"]
    fu = Followup(
        kind="confirm", confirmation=1, round=2, cells=["model=small"], builds=builds, pairs=4
    )
    plan = expand_followup(suite, "nightly_perf", fu, params={"slow_from": "2026-03-07"})
    (cell,) = plan.cells
    assert cell.id == "model=small,retest=2" and base_cell(cell.id) == "model=small"
    assert cell.values["builds"] == builds
    run = cell.workload.run
    assert run[:2] == ["${python}", "-c"] and "##accelmatrix-sample" in run[2]
    session = json.loads(run[3])
    assert session["order"] == session_order(3, 4)
    assert [r["build"] for r in session["runs"]] == builds
    for r, b in zip(session["runs"], builds, strict=True):
        assert r["argv"][3] == b  # --build: each build's own rendered workload
    assert session["runs"][1]["env"] == {"BUILD_UNDER_TEST": builds[1]}
    assert cell.workload.timeout == 120 * 12  # the suite's per sample
    assert {c.type for c in cell.checks} == {"exit_status", "log_contains"}
    with pytest.raises(PlanError, match="not a cell of nightly_perf"):
        expand_followup(suite, "nightly_perf", fu.model_copy(update={"cells": ["model=big"]}))
    with pytest.raises(PlanError, match="listed twice"):
        followup_of({FOLLOWUP_KEY: {**fu.model_dump(), "builds": [builds[0], builds[0]]}})
    with pytest.raises(PlanError, match="builds"):
        followup_of({FOLLOWUP_KEY: {**fu.model_dump(), "builds": [builds[0]]}})


def test_the_driver_runs_the_builds_interleaved_and_the_reader_pairs_them(tmp_path) -> None:
    """The session's workload, run for real by this Python: two builds of a tiny script
    that prints its build's step time; the log read back gives each build's samples, in the
    recorded order, paired by half-palindrome."""
    suite = load_suite(ROOT / "include" / "suites" / "nightly_perf.yaml")
    builds = ["nightly-2026-03-06", "nightly-2026-03-07"]
    fu = Followup(
        kind="confirm", confirmation=1, round=1, cells=["model=small"], builds=builds, pairs=3
    )
    (cell,) = expand_followup(suite, "nightly_perf", fu, params={"slow_from": "2026-03-07"}).cells
    from accelmatrix.spec.templating import render_tree

    # The backend's placeholders, filled in as the run step fills them on the machine.
    argv = render_tree(
        cell.workload.run, {"python": sys.executable, "include_dir": str(ROOT / "include")}
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    (tmp_path / "output.log").write_text(out)
    session = read_samples(
        tmp_path / "output.log",
        builds=builds,
        round_=1,
        sources=suite.workload.metrics,
        statistics={"step_time": "median"},
    )
    assert session.failed == [] and session.ran == 6
    assert [s.build for s in session.samples] == [builds[k] for k in session_order(2, 3)]
    pairs = pairs_of(session.samples, builds[0], builds[1], "step_time")
    assert len(pairs) == 3
    # slow_from 03-07: the second build is 5 % slower, times the two builds' own levels
    # (1 % build-to-build noise drawn from their names: about -2.5 % for these two).
    assert all(1.005 < b / a < 1.08 for a, b in pairs), pairs


def test_a_failed_or_cut_short_sample_is_no_sample(tmp_path) -> None:
    from accelmatrix.backends.interleave import MARK

    def mark(i, build, event, **kw):
        return MARK + json.dumps({"i": i, "build": build, "event": event, **kw}) + "\n"

    log = tmp_path / "output.log"
    log.write_text(
        mark(0, "a", "begin") + "step_time: 1.0s\n" + mark(0, "a", "end", exit=0)
        + mark(1, "b", "begin") + "step_time: 2.0s\n" + mark(1, "b", "end", exit=3)
        + mark(2, "b", "begin") + "step_time: 2.0s\n"
    )  # fmt: skip
    suite = load_suite(ROOT / "include" / "suites" / "nightly_perf.yaml")
    s = read_samples(
        log,
        builds=["a", "b"],
        round_=1,
        sources=suite.workload.metrics,
        statistics={"step_time": "median"},
    )
    assert [(x.build, x.value) for x in s.samples] == [("a", 1.0)]
    assert s.failed == [
        "sample 1 (b) exited 3",
        "sample 2 (b) did not end (the session was cut short)",
    ]


# -- the loop, against a real results store ----------------------------------------------


@pytest.fixture(autouse=True)
def _artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session logs go where the gate reads them: this test's artifacts directory."""
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))


class Loop:
    """The gate's pass night by night, and the follow-up runs it triggers, run from the
    planted truth: each cell of a follow-up run reports the value its build has (the
    matrix's level for the build's night, its causes, and fresh machine noise)."""

    def __init__(self, tmp_path: Path, pm: PerfMatrix, history: str = "") -> None:
        path = tmp_path / f"{pm.dag_id}.yaml"
        path.write_text(pm.suite_yaml(history))
        self.suite = load_suite(path)
        self.pm = pm
        self.store = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
        self.queue: list[tuple[str, dict]] = []
        self.triggered: list[str] = []
        self.rng = np.random.default_rng(pm.seed + 100)
        self.empty_runs = False  # follow-up cells that report nothing (infrastructure)
        self.now = 0  # the night the gate runs: the machines as they are then

    def trigger(self, run_id: str, conf: dict) -> bool:
        if run_id in self.triggered:
            return False
        self.triggered.append(run_id)
        self.queue.append((run_id, conf))
        return True

    def night(self, n: int) -> None:
        self.now = n
        self.pm.plant(self.store, range(n, n + 1))
        update_changes(self.store, self.pm.dag_id, self.suite.history, TRACKED)
        start_confirmations(self.store, self.suite, self.pm.dag_id, {}, self.trigger)
        while self.queue:
            run_id, conf = self.queue.pop(0)
            fu = Followup.model_validate(conf[FOLLOWUP_KEY])
            self._plant_followup(run_id, fu)
            advance(self.store, self.suite, self.pm.dag_id, run_id, fu, {}, self.trigger)

    def _plant_followup(self, run_id: str, fu: Followup) -> None:
        self.pm.plant_followup(
            self.store, self.suite, run_id, fu, self.rng, now=self.now, empty=self.empty_runs
        )

    def retests(self) -> list[Confirmation]:
        return self.store.get_confirmations(self.pm.dag_id)

    def due(self) -> list[ChangeGroup]:
        return groups_to_notify(self.store, self.pm.dag_id, DEFAULT, confirming=True)


def test_nightly_regression_is_confirmed_with_its_build_as_culprit(tmp_path: Path) -> None:
    pm = PerfMatrix(causes=[Cause("build", 30, 0.08, model="m1")], nights=36, seed=2)
    loop = Loop(tmp_path, pm)
    for n in range(30):
        loop.night(n)
    # 12 series x 30 nights of noise: a 3-sigma night may be re-tested, never confirmed.
    noise = loop.retests()
    assert all(r.state == "not_reproduced" for r in noise) and loop.due() == [], noise
    # The slow build lands on night 30: re-tested the night a candidate shows (the newest
    # point alone when it stands 3 sigmas out, else the detector's report a night or two
    # later), confirmed, and its culprit is night 30's build, whichever night noticed.
    night = 30
    while len(loop.retests()) == len(noise) and night < 34:
        loop.night(night)
        night += 1
    (retest,) = loop.retests()[len(noise) :]
    # Confirmed across the builds around it; bisected when the detector placed it (its
    # re-test spans a night more each side, as its position is uncertain by a night).
    assert retest.state in ("confirmed", "found"), retest
    assert retest.culprit == f"nightly-{pm.date(30):%Y-%m-%d}"
    assert retest.last_good == f"nightly-{pm.date(29):%Y-%m-%d}"
    assert retest.run_ids[0] == f"accelmatrix_confirm__{retest.id}_1"
    assert set(retest.run_ids) <= set(loop.triggered)
    assert {t["cell_id"] for t in retest.targets} <= {pm.cell("m1", k) for k in pm.machines}
    (group,) = loop.due()
    assert group.id == retest.group_id
    points = loop.store.get_change_points(pm.dag_id, group_id=group.id)
    assert any(p.confirm_state == "confirmed" for p in points)
    # Later nights and a re-run gate start nothing more for it, and the change stays.
    for n in range(night, 36):
        loop.night(n)
    before = len(loop.triggered)
    start_confirmations(loop.store, loop.suite, pm.dag_id, {}, loop.trigger)
    assert len(loop.triggered) == before
    assert len([r for r in loop.retests() if r.group_id == group.id]) == 1
    assert loop.store.get_change_points(pm.dag_id, group_id=group.id)
    # The follow-up runs are not points of the series.
    assert not any(
        p.run_id.startswith("accelmatrix_") for p in loop.store.get_change_points(pm.dag_id)
    )
    assert "first bad build nightly-" in changes_table(loop.store, pm.dag_id)
    js = changes_json(loop.store, pm.dag_id)["groups"]
    assert any((g["confirmation"] or {}).get("culprit") == retest.culprit for g in js)


def test_weekly_regression_is_bisected_to_the_mid_week_build(tmp_path: Path) -> None:
    pm = PerfMatrix(
        models=["m0", "m1"],
        machines=["k0"],
        causes=[Cause("build", 7 * 10 + 3, 0.08, model="m1")],
        nights=7 * 12,
        seed=5,
    )
    loop = Loop(tmp_path, pm)
    for n in range(0, 7 * 12, 7):
        loop.night(n)
    (retest,) = loop.retests()
    assert retest.state == "found", retest
    assert retest.good_build == f"nightly-{pm.date(70):%Y-%m-%d}"
    assert retest.suspect_build == f"nightly-{pm.date(77):%Y-%m-%d}"
    assert retest.culprit == f"nightly-{pm.date(73):%Y-%m-%d}"
    assert retest.last_good == f"nightly-{pm.date(72):%Y-%m-%d}"
    assert len(retest.builds) == 8
    # One session, one machine: the two Mondays and the six days between, interleaved.
    assert retest.run_ids == [f"accelmatrix_confirm__{retest.id}_1"]
    steps = {s["build"]: s["verdict"] for s in retest.steps}
    assert len(steps) == 7 and all(v in ("good", "bad") for v in steps.values()), steps
    assert [steps[f"nightly-{pm.date(n):%Y-%m-%d}"] for n in (71, 72, 73, 74)] == [
        "good",
        "good",
        "bad",
        "bad",
    ]
    table = changes_table(loop.store, pm.dag_id)
    assert "bisect of 8 builds" in table and f"{pm.date(73):%Y-%m-%d}" in table
    assert len(loop.due()) == 1
    # The history page shows the verdict, the culprit and the steps, with the runs linked.
    from accelmatrix.ui.history import load_history, render_changes

    view = load_history(loop.store, pm.dag_id)
    html = render_changes(view, page_base="/accelmatrix", n_runs=30, form_base=None, can_edit=False)
    assert f"first bad build <b>nightly-{pm.date(73):%Y-%m-%d}</b>" in html
    assert html.count("<tr><td>nightly-") == len(retest.steps)
    assert "run_id=accelmatrix_confirm__" in html and 'class="rt-found"' in html


def test_a_lone_outlier_night_is_not_reproduced_and_never_notifies(tmp_path: Path) -> None:
    pm = PerfMatrix(models=["m0"], machines=["k0"], nights=31, seed=1)
    loop = Loop(tmp_path, pm)
    for n in range(30):
        loop.night(n)
    # Night 30 lands 20 % slow on a machine hiccup; its build is as fast as ever.
    loop.now = 30
    loop.pm.plant(loop.store, range(30, 31))
    run = f"scheduled__{pm.date(30).isoformat()}"
    cid = pm.cell("m0", "k0")
    loop.store.replace_metrics(
        pm.dag_id, run, cid, [MetricValue(name="step_time", value=1.2, step=None)]
    )
    update_changes(loop.store, pm.dag_id, loop.suite.history, TRACKED)
    start_confirmations(loop.store, loop.suite, pm.dag_id, {}, loop.trigger)
    while loop.queue:
        run_id, conf = loop.queue.pop(0)
        fu = Followup.model_validate(conf[FOLLOWUP_KEY])
        loop._plant_followup(run_id, fu)
        advance(loop.store, loop.suite, pm.dag_id, run_id, fu, {}, loop.trigger)
    (retest,) = loop.retests()
    assert retest.state == "not_reproduced", retest
    assert loop.due() == []
    group = loop.store.get_change_group(retest.group_id)
    assert group.state == "invalid" and group.state_by == "accelmatrix-confirm"
    assert "not reproduced" in group.note


def test_an_infrastructure_failure_is_never_a_not_reproduced(tmp_path: Path) -> None:
    pm = PerfMatrix(
        models=["m0"],
        machines=["k0"],
        causes=[Cause("build", 30, 0.1, model="m0")],
        nights=31,
        seed=4,
    )
    loop = Loop(tmp_path, pm)
    for n in range(30):
        loop.night(n)
    loop.empty_runs = True  # every follow-up cell ends without a number
    loop.night(30)
    (retest,) = loop.retests()
    assert retest.state == "failed" and "not a verdict" in retest.reason
    assert [g.id for g in loop.due()] == [retest.group_id]  # it notifies, saying why


def test_a_retest_over_its_budget_is_refused_before_anything_runs(tmp_path: Path) -> None:
    pm = PerfMatrix(
        models=["m0"],
        machines=["k0"],
        causes=[Cause("build", 30, 0.1, model="m0")],
        nights=31,
        seed=4,
    )
    loop = Loop(tmp_path, pm, history="history:\n  confirm: {max_usd: 0.001}\n")
    for n in range(31):
        loop.night(n)
    (retest,) = loop.retests()
    assert retest.state == "refused" and loop.triggered == []
    assert re.search(r"estimated \d+\.\d+ USD .* over history.confirm.max_usd 0.00", retest.reason)
    (point,) = loop.store.get_change_points(pm.dag_id, group_id=retest.group_id)
    assert point.confirm_state == "refused" and "max_usd" in point.confirm["reason"]
    assert len(loop.due()) == 1


def test_a_stale_followup_run_changes_nothing(tmp_path: Path) -> None:
    pm = PerfMatrix(
        models=["m0"],
        machines=["k0"],
        causes=[Cause("build", 30, 0.1, model="m0")],
        nights=31,
        seed=4,
    )
    loop = Loop(tmp_path, pm)
    for n in range(31):
        loop.night(n)
    (retest,) = loop.retests()
    fu = Followup(
        kind="confirm",
        confirmation=retest.id,
        round=1,
        cells=["model=m0,machine=k0"],
        builds=["a", "b"],
        pairs=8,
    )
    again = advance(loop.store, loop.suite, pm.dag_id, retest.run_ids[0], fu, {}, loop.trigger)
    assert again.state == retest.state and loop.retests() == [retest]
