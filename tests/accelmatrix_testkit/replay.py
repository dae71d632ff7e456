"""The perf-history pipeline replayed night by night, as Airflow feeds it, with known answers.

Each nightly run's gate looks at the history it finds when it ends
(``history.change_points.history_pass``), the re-tests it starts run and are judged at their
own gates (``history.retests.followup.advance``), and the maintenance DAG looks at the whole
history now and then. ``trial`` drives that real code over a real SQLite results store, the
sessions' logs planted from the known truth (``perf_matrix``), in one of Airflow's arrival
orders (``ORDERS``), for a generated suite (``scenario``). Used by tests/test_replay.py and
bench/bench_replay.py, so both measure the same thing.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from accelmatrix.history.change_points.history_pass import analyse_suite
from accelmatrix.history.change_points.tracking import find_changes, groups_to_notify
from accelmatrix.history.retests.followup import advance
from accelmatrix.history.series.detector import DEFAULT
from accelmatrix.history.series.frame import history
from accelmatrix.history.series.grouping import as_utc
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import FOLLOWUP_KEY, Followup
from accelmatrix.spec.loader import load_suite
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix

ORDERS = ("in_order", "backfill2", "today_first", "today_backfill2", "rerun", "missing")
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


def issue_scenario(seed: int) -> Scenario:
    """The case measured on a real Airflow: 14 nightly builds, a 6 % step from the 9th,
    run noise 2 %, each build at its own level within +-1.5 % (fixed per build); only the
    run noise is drawn anew per seed."""
    cv, build_sd, step = 0.02, 0.015, 0.06
    sigma = float(np.sqrt(cv**2 + build_sd**2 / 3))
    return Scenario(seed=seed, before=8, after=6, cv=cv, build_sd=build_sd, step=step, sigma=sigma)


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
    if order == "today_backfill2":
        return [n - 1 + TODAY_GAP, *arrivals("backfill2", sc, rng)]
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
    errors: int = 0


class Pipeline:
    """The gates and the re-test sessions of one suite, over a real store."""

    def __init__(self, tmp: Path, sc: Scenario, total_nights: int, lag: int = 0) -> None:
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
        # A session ends ``lag`` nightly runs after it was triggered (0: before the next
        # night's run ends): on a real Airflow it runs beside the nights still arriving.
        self.lag = lag
        self.clock = 0
        self.errors = 0  # history passes and re-test steps that raised (the gate logs them)
        self.queue: list[tuple[str, dict, int]] = []
        self.seen: set[str] = set()
        self.paged: set[int] = set()

    def trigger(self, run_id: str, conf: dict) -> bool:
        if run_id in self.seen:
            return False
        self.seen.add(run_id)
        self.queue.append((run_id, conf, self.clock + self.lag))
        return True

    def night(self, n: int) -> float:
        """A nightly run of night ``n`` ends: its gate, then the sessions it started (and
        those they start) run and are judged at their gates. The gate's seconds."""
        self.pm.plant(self.store, range(n, n + 1))
        self.clock += 1
        t0 = time.perf_counter()
        try:
            analyse_suite(self.store, self.pm.dag_id, self.suite, full=False, retest=self.trigger)
        except Exception:  # noqa: BLE001 - the gate logs it and the run stays green
            self.errors += 1
        spent = time.perf_counter() - t0
        self._sessions(n)
        self._notify()
        return spent

    def maintenance(self) -> None:
        analyse_suite(self.store, self.pm.dag_id, self.suite, full=True)
        self._notify()

    def flush(self, now: int) -> None:
        """Every session still running ends (the last nights are in)."""
        self.clock += 10**6
        self._sessions(now)

    def _sessions(self, now: int) -> None:
        while due := [q for q in self.queue if q[2] <= self.clock]:
            self.queue.remove(due[0])
            run_id, conf, _due = due[0]
            fu = Followup.model_validate(conf[FOLLOWUP_KEY])
            self.pm.plant_followup(self.store, self.suite, run_id, fu, self.rng, now=now)
            try:
                advance(self.store, self.suite, self.pm.dag_id, run_id, fu, {}, self.trigger)
            except Exception:  # noqa: BLE001 - the session's gate logs it, as the gate does
                self.errors += 1
            self._notify()

    def _notify(self) -> None:
        """What a sink that always answers records (``notifications.dedup``)."""
        for g in groups_to_notify(self.store, self.pm.dag_id, DEFAULT, confirming=True):
            self.paged.add(g.id)
            self.store.save_change_group(self.pm.dag_id, id=g.id, notified_at=datetime.now(UTC))


def trial(sc: Scenario, order: str, lag: int = 0) -> Outcome:
    """One generated suite's nights in ``order``, each re-test session ending ``lag``
    nightly runs after it started."""
    rng = np.random.default_rng([sc.seed, ORDERS.index(order)])
    nights = arrivals(order, sc, rng)
    total = max(nights) + 1
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ACCELMATRIX_ARTIFACTS_DIR"] = str(Path(tmp) / "artifacts")
        p = Pipeline(Path(tmp), sc, total, lag=lag)
        for i, n in enumerate(nights):
            out.gate_s.append(p.night(n))
            if i == len(nights) // 2:
                p.maintenance()  # the maintenance DAG's daily pass, midway
        p.flush(nights[-1])
        p.maintenance()
        out.errors = p.errors
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
    pipeline should match (``history.change_points.tracking.find_changes`` with the candidates)."""
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


def _day(build: str) -> datetime:
    return datetime.strptime(build[-10:], "%Y-%m-%d").replace(tzinfo=UTC)
