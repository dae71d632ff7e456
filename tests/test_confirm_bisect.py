"""Confirm and bisect: the two-sample verdict, the binary search over builds, the builds
between two builds, the follow-up run's plan, and the whole loop against a real SQLite
results store: a planted history night by night, the gate's pass, the re-test started once,
its follow-up runs planted from the known truth (as the suite's cells would report them)
and advanced, until the change is confirmed, bisected or dismissed.

The statistics' rates over many generated histories are bench/bench_confirm.py's; these
tests pin the behaviour on cases with known answers."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from accelmatrix.history.bisect import AMBIGUOUS, FOUND, Bisect, Step, max_steps
from accelmatrix.history.builds import BuildsError, builds_between, date_template
from accelmatrix.history.changepoints import DEFAULT
from accelmatrix.history.changes import groups_to_notify, update_changes
from accelmatrix.history.confirm import (
    CONFIRMED,
    NOT_REPRODUCED,
    UNDECIDED,
    Policy,
    decide,
    newest_point_suspect,
    next_repeats,
)
from accelmatrix.history.followup import advance, start_confirmations
from accelmatrix.history.report import changes_json, changes_table
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup import FOLLOWUP_KEY, Followup, base_cell, expand_followup
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.plan import PlanError
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix

ROOT = Path(__file__).resolve().parents[1]
TRACKED = {"step_time": "median"}

# -- the verdict ---------------------------------------------------------------------------


def test_decide_confirms_a_clear_step_and_rejects_an_equal_pair() -> None:
    rng = np.random.default_rng(3)
    good = 100 + 2 * rng.standard_normal(5)
    slow = 108 + 2 * rng.standard_normal(5)
    d = decide(good, slow, claimed=0.08)
    assert d.verdict == CONFIRMED and d.p_worse < 0.01, d
    assert d.n_good == d.n_suspect == 5 and 0.05 < d.change < 0.11
    same = 100 + 2 * rng.standard_normal(5)
    d = decide(good, same, claimed=0.08)
    assert d.verdict == NOT_REPRODUCED and d.p_same < 0.05, d


def test_decide_is_undecided_on_overlapping_small_samples_and_drops_nan() -> None:
    d = decide([100, 103, 99], [101, 104, 100, float("nan")], claimed=0.03)
    assert d.verdict == UNDECIDED and d.n_suspect == 3, d
    # Fewer than 2 finite values a side: no verdict either way.
    assert decide([1.0], [2.0, 3.0], claimed=0.5).verdict == UNDECIDED


def test_decide_follows_the_metrics_direction() -> None:
    good = [1000, 1010, 990, 1005, 995]
    lower = [900, 910, 890, 905, 895]  # 10 % less throughput: worse
    assert decide(good, lower, claimed=0.1, higher_is_better=True).verdict == CONFIRMED
    # The same samples for a lower-is-better metric are an improvement, not the claimed
    # regression: ruled out.
    assert decide(good, lower, claimed=0.1).verdict == NOT_REPRODUCED


def test_repeats_double_up_to_the_cap() -> None:
    p = Policy(repeats=5, max_repeats=20)
    done, rounds = 0, []
    while (k := next_repeats(done, p)) > 0:
        rounds.append(k)
        done += k
    assert rounds == [5, 5, 10] and done == 20


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


# -- the bisect ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 7, 16, 32])
def test_bisect_names_every_culprit_within_its_step_limit(n: int) -> None:
    for culprit in range(1, n + 1):
        b = Bisect([f"b{i}" for i in range(n + 1)])
        while (nxt := b.next_build()) is not None:
            i, name = nxt
            b.record(Step(i, name, CONFIRMED if i >= culprit else NOT_REPRODUCED))
        assert b.state == FOUND and b.culprit == f"b{culprit}" and b.last_good == f"b{culprit - 1}"
        assert len(b.steps) <= math.ceil(math.log2(n)) <= max_steps(n) - 2


def test_bisect_stops_ambiguous_and_refuses_a_step_not_due() -> None:
    b = Bisect([f"b{i}" for i in range(9)])
    i, name = b.next_build()
    with pytest.raises(ValueError, match="not the one due"):
        b.record(Step(i + 1, f"b{i + 1}", CONFIRMED))
    b.record(Step(i, name, UNDECIDED))
    assert b.state == AMBIGUOUS and b.next_build() is None and b.culprit is None
    assert Bisect(["a", "b"]).state == FOUND  # adjacent: the bad end is the culprit
    with pytest.raises(ValueError):
        Bisect(["a"])


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


# -- the follow-up run's plan -------------------------------------------------------------


def test_followup_plan_interleaves_builds_and_each_cell_tests_its_build() -> None:
    suite = load_suite(ROOT / "include" / "suites" / "nightly_perf.yaml")
    fu = Followup(
        kind="confirm",
        confirmation=1,
        round=1,
        cells=["model=small"],
        builds=["nightly-2026-03-01", "nightly-2026-03-02"],
        repeats=3,
    )
    plan = expand_followup(suite, "nightly_perf", fu, params={"slow_from": "2026-03-02"})
    ids = [c.id for c in plan.cells]
    assert ids == [
        f"model=small,build=nightly-2026-03-0{b},repeat={r}" for r in (1, 2, 3) for b in (1, 2)
    ]
    for c in plan.cells:
        build = c.axes["build"]
        assert c.workload.run[3] == build and c.workload.env["BUILD_UNDER_TEST"] == build
        assert base_cell(c.id) == ("model=small", build)
    with pytest.raises(PlanError, match="not a cell of nightly_perf"):
        expand_followup(suite, "nightly_perf", fu.model_copy(update={"cells": ["model=big"]}))


# -- the loop, against a real results store ----------------------------------------------


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

    def retests(self) -> list[dict]:
        return self.store.get_confirmations(self.pm.dag_id)

    def due(self) -> list[dict]:
        return groups_to_notify(self.store, self.pm.dag_id, DEFAULT, confirming=True)


def test_nightly_regression_is_confirmed_with_its_build_as_culprit(tmp_path: Path) -> None:
    pm = PerfMatrix(causes=[Cause("build", 30, 0.08, model="m1")], nights=36, seed=2)
    loop = Loop(tmp_path, pm)
    for n in range(30):
        loop.night(n)
    # 12 series x 30 nights of noise: a 3-sigma night may be re-tested, never confirmed.
    noise = loop.retests()
    assert all(r["state"] == "not_reproduced" for r in noise) and loop.due() == [], noise
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
    assert retest["state"] in ("confirmed", "found"), retest
    assert retest["culprit"] == f"nightly-{pm.date(30):%Y-%m-%d}"
    assert retest["last_good"] == f"nightly-{pm.date(29):%Y-%m-%d}"
    assert retest["run_ids"][0] == f"accelmatrix_confirm__{retest['id']}_1"
    assert set(retest["run_ids"]) <= set(loop.triggered)
    assert {t["cell_id"] for t in retest["targets"]} <= {pm.cell("m1", k) for k in pm.machines}
    (group,) = loop.due()
    assert group["id"] == retest["group_id"]
    points = loop.store.get_change_points(pm.dag_id, group_id=group["id"])
    assert any(p["confirm_state"] == "confirmed" for p in points)
    # Later nights and a re-run gate start nothing more for it, and the change stays.
    for n in range(night, 36):
        loop.night(n)
    before = len(loop.triggered)
    start_confirmations(loop.store, loop.suite, pm.dag_id, {}, loop.trigger)
    assert len(loop.triggered) == before
    assert len([r for r in loop.retests() if r["group_id"] == group["id"]]) == 1
    assert loop.store.get_change_points(pm.dag_id, group_id=group["id"])
    # The follow-up runs are not points of the series.
    assert not any(
        p["run_id"].startswith("accelmatrix_") for p in loop.store.get_change_points(pm.dag_id)
    )
    assert "first bad build nightly-" in changes_table(loop.store, pm.dag_id)
    js = changes_json(loop.store, pm.dag_id)["groups"]
    assert any((g["confirmation"] or {}).get("culprit") == retest["culprit"] for g in js)


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
    assert retest["state"] == "found", retest
    assert retest["good_build"] == f"nightly-{pm.date(70):%Y-%m-%d}"
    assert retest["suspect_build"] == f"nightly-{pm.date(77):%Y-%m-%d}"
    assert retest["culprit"] == f"nightly-{pm.date(73):%Y-%m-%d}"
    assert retest["last_good"] == f"nightly-{pm.date(72):%Y-%m-%d}"
    assert len(retest["builds"]) == 8
    assert 1 <= len(retest["steps"]) <= math.ceil(math.log2(7)) + 2
    assert all(s["verdict"] in (CONFIRMED, NOT_REPRODUCED) for s in retest["steps"])
    assert [r for r in retest["run_ids"] if "bisect" in r]
    table = changes_table(loop.store, pm.dag_id)
    assert "bisect of 8 builds" in table and f"{pm.date(73):%Y-%m-%d}" in table
    assert len(loop.due()) == 1
    # The history page shows the verdict, the culprit and the steps, with the runs linked.
    from accelmatrix.ui.history import load_history, render_changes

    view = load_history(loop.store, pm.dag_id)
    html = render_changes(view, page_base="/accelmatrix", n_runs=30, form_base=None, can_edit=False)
    assert f"first bad build <b>nightly-{pm.date(73):%Y-%m-%d}</b>" in html
    assert html.count("<tr><td>nightly-") == len(retest["steps"])
    assert "run_id=accelmatrix_bisect__" in html and 'class="rt-found"' in html


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
        pm.dag_id, run, cid, [{"name": "step_time", "value": 1.2, "step": None}]
    )
    update_changes(loop.store, pm.dag_id, loop.suite.history, TRACKED)
    start_confirmations(loop.store, loop.suite, pm.dag_id, {}, loop.trigger)
    while loop.queue:
        run_id, conf = loop.queue.pop(0)
        fu = Followup.model_validate(conf[FOLLOWUP_KEY])
        loop._plant_followup(run_id, fu)
        advance(loop.store, loop.suite, pm.dag_id, run_id, fu, {}, loop.trigger)
    (retest,) = loop.retests()
    assert retest["state"] == "not_reproduced", retest
    assert loop.due() == []
    group = loop.store.get_change_group(retest["group_id"])
    assert group["state"] == "invalid" and group["state_by"] == "accelmatrix-confirm"
    assert "not reproduced" in group["note"]


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
    assert retest["state"] == "failed" and "not a verdict" in retest["reason"]
    assert [g["id"] for g in loop.due()] == [retest["group_id"]]  # it notifies, saying why


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
    assert retest["state"] == "refused" and loop.triggered == []
    assert re.search(
        r"estimated \d+\.\d+ USD .* over history.confirm.max_usd 0.00", retest["reason"]
    )
    (point,) = loop.store.get_change_points(pm.dag_id, group_id=retest["group_id"])
    assert point["confirm_state"] == "refused" and "max_usd" in point["confirm"]["reason"]
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
        confirmation=retest["id"],
        round=1,
        cells=["model=m0,machine=k0"],
        builds=["a", "b"],
        repeats=5,
    )
    again = advance(loop.store, loop.suite, pm.dag_id, retest["run_ids"][0], fu, {}, loop.trigger)
    assert again["state"] == retest["state"] and loop.retests() == [retest]
