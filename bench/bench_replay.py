#!/usr/bin/env python3
"""The perf-history pipeline replayed night by night, as Airflow feeds it, with known answers.

bench_confirm and bench_changepoints judge the detector and the re-test on series handed
to them whole. Users read what the pipeline makes of the nights as they arrive: each
nightly run's gate looks at the history it finds when it ends (``history.history_pass``:
the window's change points, the candidates and the newest-point rule, the re-tests), the
re-test's sessions run and are judged at their own gates (``history.followup.advance``),
and the maintenance DAG looks at the whole history now and then. This bench drives that
real code (a real SQLite results store, the planted sessions' logs read back by the
session reader) in the orders Airflow produces:

* ``in_order``: one night after the other (cron);
* ``backfill2``: a backfill with two runs at a time, each pair finishing in either order;
* ``today_first``: unpausing runs today's build first, then the backfill, in order;
* ``rerun``: a night after the step fails and is re-run three nights later;
* ``missing``: a night after the step never arrives.

Each trial is a generated suite: three models on one machine kind, one of them a step of
2-10 % (1.5-5 sigma of its night-to-night noise) from a random night, builds that differ
by themselves (each build of each model at its own fixed level, uniform within +-0-2 %),
run noise 1-4 %, 5-14 nights before the step and 3-7 after. The same trials (same seeds)
run in every order.

Printed per order and step size (in sigmas of the night-to-night noise): offline (the gate's
detectors, given the whole series at the end in one piece, place a regression within a
night of the step: what the pipeline should match), found (a change on the stepped series), confirmed (its re-test reproduced it), the first bad build the
story names (the change's build, which a re-test's culprit moves: ``history.placement``)
right / a neighbour / wrong / none, stories that name two builds, pages on the noise
series per 1,000 points, re-tests per 1,000 points, and the gate's cost per night.

    .venv/bin/python bench/bench_replay.py                 # 24 trials per order (~3 min)
    .venv/bin/python bench/bench_replay.py --trials 200    # the figures in BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "tests"))

from accelmatrix.history.changepoints import DEFAULT  # noqa: E402
from accelmatrix.history.changes import groups_to_notify  # noqa: E402
from accelmatrix.history.followup import advance  # noqa: E402
from accelmatrix.history.grouping import as_utc  # noqa: E402
from accelmatrix.history.history_pass import analyse_suite  # noqa: E402
from accelmatrix.results.store import ResultsStore  # noqa: E402
from accelmatrix.spec.followup_plan import FOLLOWUP_KEY, Followup  # noqa: E402
from accelmatrix.spec.loader import load_suite  # noqa: E402
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix  # noqa: E402

ORDERS = ("in_order", "backfill2", "today_first", "rerun", "missing")
MODELS = ["m0", "m1", "m2"]
STEPPED = "m1"
TODAY_GAP = 20  # today's night lies this many nights after the backfill's last
CONFIRMED = ("confirmed", "found")


@dataclass(frozen=True)
class Scenario:
    seed: int
    before: int
    after: int
    cv: float
    build_sd: float  # each build's own level: uniform within +-build_sd
    step: float
    sigma: float  # night-to-night noise: sqrt(cv^2 + build_sd^2 / 3)

    @property
    def sigmas(self) -> float:
        return self.step / self.sigma


def scenario(seed: int) -> Scenario:
    rng = np.random.default_rng([seed, 7])
    while True:
        cv = rng.uniform(0.01, 0.04)
        build_sd = rng.uniform(0.0, 0.02)
        sigma = float(np.sqrt(cv**2 + build_sd**2 / 3))
        step = rng.uniform(0.02, 0.10)
        if 1.5 <= step / sigma <= 5.0:
            break
    return Scenario(
        seed=seed,
        before=int(rng.integers(5, 15)),
        after=int(rng.integers(3, 8)),
        cv=cv,
        build_sd=build_sd,
        step=step,
        sigma=sigma,
    )


def arrivals(order: str, sc: Scenario, rng: np.random.Generator) -> list[int]:
    """The nights in the order their runs end."""
    n = sc.before + sc.after
    nights = list(range(n))
    if order == "in_order":
        return nights
    if order == "backfill2":
        out = []
        for i in range(0, n, 2):
            pair = nights[i : i + 2]
            out += pair[::-1] if rng.random() < 0.5 else pair
        return out
    if order == "today_first":
        return [n - 1 + TODAY_GAP, *nights]
    late = sc.before + int(rng.integers(0, sc.after))  # a night at or after the step
    if order == "rerun":
        rest = [k for k in nights if k != late]
        at = min(len(rest), rest.index(late - 1) + 4) if late - 1 in rest else len(rest)
        return [*rest[:at], late, *rest[at:]]
    if order == "missing":
        return [k for k in nights if k != late]
    raise ValueError(order)


@dataclass
class Outcome:
    offline: bool = False  # the detectors on the whole series, handed in one piece
    found: bool = False
    confirmed: bool = False
    named: str = "none"  # right | neighbour | wrong | none
    two_builds: bool = False
    noise_pages: int = 0
    noise_points: int = 0
    retests: int = 0
    points: int = 0
    gate_s: list[float] = field(default_factory=list)


class Pipeline:
    """The gates and the re-test sessions of one suite, over a real store."""

    def __init__(self, tmp: Path, sc: Scenario, total_nights: int) -> None:
        self.pm = PerfMatrix(
            dag_id="replay",
            models=MODELS,
            machines=["k0"],
            nights=total_nights,
            cv=sc.cv,
            build_sd=sc.build_sd,
            causes=[Cause("build", sc.before, sc.step, model=STEPPED)],
            seed=sc.seed,
        )
        path = tmp / "replay.yaml"
        path.write_text(self.pm.suite_yaml("history:\n  track: {step_time: median}\n"))
        self.suite = load_suite(path)
        self.store = ResultsStore(f"sqlite:///{tmp / 'results.db'}")
        self.rng = np.random.default_rng([sc.seed, 11])
        self.queue: list[tuple[str, dict]] = []
        self.seen: set[str] = set()
        self.paged: set[int] = set()

    def trigger(self, run_id: str, conf: dict) -> bool:
        if run_id in self.seen:
            return False
        self.seen.add(run_id)
        self.queue.append((run_id, conf))
        return True

    def night(self, n: int) -> float:
        """A nightly run of night ``n`` ends: its gate, then the sessions it started (and
        those they start) run and are judged at their gates. The gate's seconds."""
        self.pm.plant(self.store, range(n, n + 1))
        t0 = time.perf_counter()
        analyse_suite(self.store, self.pm.dag_id, self.suite, full=False, retest=self.trigger)
        spent = time.perf_counter() - t0
        self._sessions(n)
        self._notify()
        return spent

    def maintenance(self) -> None:
        analyse_suite(self.store, self.pm.dag_id, self.suite, full=True)
        self._notify()

    def _sessions(self, now: int) -> None:
        while self.queue:
            run_id, conf = self.queue.pop(0)
            fu = Followup.model_validate(conf[FOLLOWUP_KEY])
            self.pm.plant_followup(self.store, self.suite, run_id, fu, self.rng, now=now)
            advance(self.store, self.suite, self.pm.dag_id, run_id, fu, {}, self.trigger)
            self._notify()

    def _notify(self) -> None:
        """What a sink that always answers records (``notifications.dedup``)."""
        from datetime import UTC, datetime

        for g in groups_to_notify(self.store, self.pm.dag_id, DEFAULT, confirming=True):
            self.paged.add(g.id)
            self.store.save_change_group(self.pm.dag_id, id=g.id, notified_at=datetime.now(UTC))


def trial(sc: Scenario, order: str) -> Outcome:
    rng = np.random.default_rng([sc.seed, ORDERS.index(order)])
    nights = arrivals(order, sc, rng)
    total = max(nights) + 1
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ACCELMATRIX_ARTIFACTS_DIR"] = str(Path(tmp) / "artifacts")
        p = Pipeline(Path(tmp), sc, total)
        for i, n in enumerate(nights):
            out.gate_s.append(p.night(n))
            if i == len(nights) // 2:
                p.maintenance()  # the maintenance DAG's daily pass, midway
        p.maintenance()
        out.points = len(nights) * len(MODELS)
        out.noise_points = len(nights) * (len(MODELS) - 1)
        stepped = p.pm.cell(STEPPED, "k0")
        step_build = f"nightly-{p.pm.date(sc.before):%Y-%m-%d}"
        retests = {c.group_id: c for c in p.store.get_confirmations(p.pm.dag_id)}
        out.retests = len(retests)
        points = [x for x in p.store.get_change_points(p.pm.dag_id) if x.direction == "regression"]
        mine = [x for x in points if x.cell_id == stepped]
        groups = {g.id: g for g in p.store.get_change_groups(p.pm.dag_id)}
        noise_groups = {x.group_id for x in points if x.cell_id != stepped}
        noise_groups -= {x.group_id for x in mine}
        out.noise_pages = len(noise_groups & p.paged)
        out.offline = offline_found(p, stepped, sc.before)
        # The step's story: the change on the stepped series nearest the step, its re-test.
        if mine:
            out.found = True
            day = p.pm.date(sc.before)
            best = min(mine, key=lambda x: abs((as_utc(x.logical_date) - day).days))
            rt = retests.get(best.group_id)
            out.confirmed = rt is not None and rt.state in CONFIRMED
            named = rt.culprit if rt is not None and rt.culprit else best.runtime_version
            g = groups.get(best.group_id)
            out.two_builds = bool(
                named and (best.runtime_version != named or (g and g.runtime_version != named))
            )
            if named == step_build:
                out.named = "right"
            elif named and abs((_day(named) - _day(step_build)).days) <= 1:
                out.named = "neighbour"
            elif named:
                out.named = "wrong"
        p.store.close()
    return out


def offline_found(p: Pipeline, cell: str, step_at: int) -> bool:
    """Whether the gate's detectors, given the stepped series whole (every night that
    arrived, oldest first), report a regression within a night of the step: what the
    pipeline should match (``history.changes.find_changes`` with the candidates)."""
    from accelmatrix.history.changes import find_changes
    from accelmatrix.history.frame import history

    hist = history(p.store, metric=None, dag_id=p.pm.dag_id, stats={"step_time": "median"})
    hist = hist[hist["cell_id"] == cell]
    found, _series = find_changes(
        hist, higher_is_better=lambda _m: False, window=None, suspects=True
    )
    if not len(found):
        return False
    day = p.pm.date(step_at)
    return any(
        r.direction == "regression" and abs((as_utc(r.logical_date) - day).days) <= 1
        for r in found.itertuples()
    )


def _day(build: str):
    from datetime import UTC, datetime

    return datetime.strptime(build[-10:], "%Y-%m-%d").replace(tzinfo=UTC)


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:5.1f} %" if n else "    - "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--orders", default=",".join(ORDERS))
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    scenarios = [scenario(a.seed * 100_003 + k) for k in range(a.trials)]
    t0 = time.perf_counter()
    print(
        f"{a.trials} generated suites per order (3 models, one stepped 2-10 % = 1.5-5 sigma, "
        "builds +-0-2 % by themselves, run noise 1-4 %, 5-14 nights before, 3-7 after)\n"
    )
    head = (
        f"{'order':12s} {'step':9s} {'n':>4s} {'offline':>7s} {'found':>7s} {'confirmed':>9s} "
        f"{'right':>7s} {'neighbour':>9s} {'wrong':>7s} {'none':>7s} {'2 builds':>8s}"
    )
    print(head)
    summary = []
    for order in a.orders.split(","):
        res = [(sc, trial(sc, order)) for sc in scenarios]
        for name, lo, hi in (("<3 sigma", 0, 3.0), (">=3 sigma", 3.0, 99.0)):
            rs = [o for sc, o in res if lo <= sc.sigmas < hi]
            n = len(rs)
            print(
                f"{order:12s} {name:9s} {n:4d} {pct(sum(o.offline for o in rs), n)} "
                f"{pct(sum(o.found for o in rs), n)} "
                f"{pct(sum(o.confirmed for o in rs), n):>9s} "
                f"{pct(sum(o.named == 'right' for o in rs), n)} "
                f"{pct(sum(o.named == 'neighbour' for o in rs), n):>9s} "
                f"{pct(sum(o.named == 'wrong' for o in rs), n)} "
                f"{pct(sum(o.named == 'none' for o in rs), n)} "
                f"{pct(sum(o.two_builds for o in rs), n):>8s}"
            )
        outs = [o for _sc, o in res]
        pages = sum(o.noise_pages for o in outs)
        noise = sum(o.noise_points for o in outs)
        tests = sum(o.retests for o in outs)
        pts = sum(o.points for o in outs)
        gate = [s for o in outs for s in o.gate_s]
        summary.append(
            f"{order:12s} pages on noise {1000 * pages / noise:5.2f} per 1,000 points; "
            f"re-tests {1000 * tests / pts:5.1f} per 1,000 points; gate pass median "
            f"{1000 * statistics.median(gate):.0f} ms, p95 {1000 * np.percentile(gate, 95):.0f} ms"
        )
    print()
    print("\n".join(summary))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
