#!/usr/bin/env python3
"""Confirm and bisect on generated fleets with known answers: what one machine per suspect
cell, builds interleaved, buys over samples spread across machines.

The fleet (every figure is a parameter):

* each sample has run-to-run noise ``--cv`` (1 %);
* machines differ from each other by ``--machine-sd`` (3 %, sd);
* a machine drifts during a session, linearly by up to ``--drift`` (1 %) end to end;
* builds differ by themselves, each by a uniform offset within +-``--build-noise``
  (1.5 %), on top of the change under test.

Two ways to take the same samples, judged by the same code (``history.retests.compare``,
``history.retests.bisect.Search``, the controller's rules: sessions of ``pairs`` pairs, another
session while undecided, up to ``max_pairs``):

* **one machine**: the re-test's design: one machine per session, the builds in
  palindromes (A B B A), each sample paired with the reference build's in the same half;
* **spread**: every sample on a machine of its own, as when each sample was a cell.

Printed:

1. Confirm: a suspect build against the last good one, claimed change 3 %. The share
   confirmed when the change is real (goal >= 95 %, median <= 10 pairs), and when there is
   none (goal <= 1 %); also when there is none but the two builds differ by themselves.
2. Bisect: the last good build, 7 builds after it, the change landing on one of them at
   random. The share of trials naming that build (goal >= 95 %), naming another one (a
   noisy neighbour; goal <= 5 %), or none; sessions (machines) and pairs per build.
3. Short histories: 8 nightlies before a step and 7 after, 2 % nightly noise: the share of
   3-sigma steps confirmed by the night-by-night loop (the detector's reports, the
   permissive candidates and the newest-point rule, each re-tested) (goal >= 95 %); and
   with no step, pages per 1,000 points (goal <= 1).
4. The decision line: a confirm whose true change is 0.5x, 1x and 1.5x its line, at one
   look of ``max_pairs`` and at every look of ``pairs`` up to ``max_pairs``, judged at
   1.96 each look (as before ``history.retests.sequential``) and with the error spent over the
   looks; and groups of 4 targets on the line. Goal: the wrong side no more often than
   the one-look 2.5 % + 1 point at the most looks.

Every verdict is judged as the controller judges it (``Policy.critical`` over the looks
so far, ``history.retests.sequential``).

Seeds are fixed so two runs print the same figures; ``--seed`` changes them.

    .venv/bin/python bench/bench_confirm.py [--trials 400] [--seed 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from accelmatrix.history.change_points.tracking import candidates_detector  # noqa: E402
from accelmatrix.history.retests.bisect import AMBIGUOUS, FOUND, Search, split_line, spread  # noqa: E402
from accelmatrix.history.retests.compare import NEW_LEVEL, OLD_LEVEL, compare, level  # noqa: E402
from accelmatrix.history.retests.confirm import Policy, newest_point_suspect  # noqa: E402
from accelmatrix.history.retests.followup import SANDWICH_AFTER, SANDWICH_BEFORE  # noqa: E402
from accelmatrix.history.series.detector import DEFAULT, detect_many  # noqa: E402
from accelmatrix.spec.followup_plan import MAX_SESSION_BUILDS, session_order  # noqa: E402


@dataclass(frozen=True)
class Fleet:
    cv: float
    machine_sd: float
    drift: float
    build_noise: float


@dataclass
class Pool:
    """Samples of builds pooled over sessions: (session, half) -> build -> value."""

    halves: dict[tuple[int, int], dict[str, float]]
    values: dict[str, list[float]]
    sessions: int = 0

    def pairs(self, ref: str, build: str) -> list[tuple[float, float]]:
        return [(h[ref], h[build]) for h in self.halves.values() if ref in h and build in h]

    def comparison(self, ref: str, build: str):
        p = self.pairs(ref, build)
        return compare(self.values.get(ref, []), self.values.get(build, []), p, seed=len(p))

    def looks(self, ref: str, build: str) -> list[int]:
        """The pooled pairs of ``build`` after each session that ran it (the controller's
        ``followup._looks``)."""
        out = []
        for s in range(self.sessions):
            n = sum(1 for (k, _h), h in self.halves.items() if k <= s and ref in h and build in h)
            if n and (not out or n > out[-1]):
                out.append(n)
        return out

    def level(self, ref, build, *, claimed, line, policy, targets=1, sequential=True):
        """``build``'s level as the controller judges it at this look (``Policy.critical``
        over the looks so far; ``sequential`` False: every look at the one-look 1.96, as
        before the correction)."""
        c = self.comparison(ref, build)
        z_new = z_old = None
        if sequential:
            z_new, z_old = policy.critical(self.looks(ref, build), targets=targets)
        return level(c, claimed=claimed, line=line, z_new=z_new, z_old=z_old), c


def session(
    rng: np.random.Generator,
    pool: Pool,
    builds: list[str],
    levels: dict[str, float],
    pairs: int,
    fleet: Fleet,
    paired: bool,
) -> None:
    """Run one session of ``builds`` (true ``levels``) into ``pool``."""
    order = session_order(len(builds), pairs)
    speed = 1 + fleet.machine_sd * rng.standard_normal()
    slope = fleet.drift * rng.uniform(-1, 1)
    s = pool.sessions
    pool.sessions += 1
    for i, k in enumerate(order):
        b = builds[k]
        m = speed if paired else 1 + fleet.machine_sd * rng.standard_normal()
        drift = 1 + slope * (i / max(1, len(order) - 1) - 0.5) if paired else 1.0
        v = levels[b] * m * drift * (1 + fleet.cv * rng.standard_normal())
        pool.halves.setdefault((s, i // len(builds)), {})[b] = v
        pool.values.setdefault(b, []).append(v)


def confirm_trial(rng, change, claimed, fleet, policy, paired, build_noise=False):
    """(verdict, pairs per build) of one confirm: "confirmed", "not", "undecided"."""
    off = fleet.build_noise if build_noise else 0.0
    levels = {"g": 1 + rng.uniform(-off, off), "s": (1 + change) * (1 + rng.uniform(-off, off))}
    pool = Pool({}, {})
    n = 0
    while n + policy.pairs <= policy.max_pairs:
        session(rng, pool, ["g", "s"], levels, policy.pairs, fleet, paired)
        lv, c = pool.level("g", "s", claimed=claimed, line=policy.confirm_line(claimed),
                           policy=policy)  # fmt: skip
        n = c.pairs
        if lv == NEW_LEVEL:
            return "confirmed", n
        if lv == OLD_LEVEL:
            return "not", n
    return "undecided", n


def bisect_trial(rng, change, fleet, policy, paired, n_builds=8):
    """(named build or None, the culprit, sessions, most pairs of a build) of one
    re-test over ``n_builds`` builds (the last good first), as history.retests.followup runs it."""
    builds = [f"b{i}" for i in range(n_builds)]
    culprit = int(rng.integers(1, n_builds))
    off = fleet.build_noise
    levels = {
        b: (1 + change * (i >= culprit)) * (1 + rng.uniform(-off, off))
        for i, b in enumerate(builds)
    }
    pool = Pool({}, {})
    ref, sus = builds[0], builds[-1]
    session_builds = [ref, *spread(builds[1:-1], MAX_SESSION_BUILDS - 2), sus]
    found: dict[str, str] = {}
    while True:
        session(rng, pool, session_builds, levels, policy.pairs, fleet, paired)
        lv, c = pool.level(ref, sus, claimed=change, line=policy.confirm_line(change),
                           policy=policy)  # fmt: skip
        if lv != NEW_LEVEL:
            if lv == OLD_LEVEL or len(pool.pairs(ref, sus)) + policy.pairs > policy.max_pairs:
                return None, culprit, pool.sessions, len(pool.pairs(ref, sus))
            session_builds = [ref, *[b for b in session_builds[1:-1]], sus]
            continue
        tested = [(b, pool.comparison(ref, b)) for b in builds[1:] if pool.pairs(ref, b)]
        line = split_line([0.0, *(c.change for _b, c in tested)])
        for b, _c in tested:
            found[b] = pool.level(ref, b, claimed=change, line=line, policy=policy)[0]
        found[sus] = NEW_LEVEL
        s = Search(builds, found)
        most = max(len(pool.pairs(ref, b)) for b in builds[1:])
        if s.state == FOUND:
            return builds.index(s.culprit), culprit, pool.sessions, most
        if s.state == AMBIGUOUS:
            return None, culprit, pool.sessions, most
        room = [
            b for b in s.untested() if len(pool.pairs(ref, b)) + policy.pairs <= policy.max_pairs
        ]
        if not room:
            return None, culprit, pool.sessions, most
        session_builds = [ref, *spread(room, MAX_SESSION_BUILDS - 2), sus]


def candidates(x: np.ndarray) -> list[tuple[int, float]]:
    """(index, claimed change) of the regressions the gate would re-test on series ``x``:
    the detector's reports, the permissive detector's, and the newest-point suspect."""
    strict, weak = (detect_many([x], d)[0] for d in (DEFAULT, candidates_detector(DEFAULT)))
    out = [(cp.index, abs(cp.change)) for cp in strict if cp.change > 0]
    for cp in weak:
        if cp.change > 0 and not any(abs(cp.index - s.index) <= 1 for s in strict):
            out.append((cp.index, abs(cp.change)))
    if not any(i >= len(x) - 3 for i, _ in out):
        # Against the level since the last change the detector reports
        # (history.change_points.tracking).
        since = max((cp.index for cp in strict), default=0)
        hit = newest_point_suspect(x[since:])
        if hit is not None:
            out.append((len(x) - 1, hit[0]))
    return out


def history_trial(rng, step_sigmas, fleet, policy, before=8, after=7, sigma=0.02, extra=0):
    """(confirmed?, re-tests, pages) of the night-by-night loop over one series of nightly
    builds: ``before`` at level 1, ``after`` at 1 + step_sigmas x sigma (none: 0)."""
    n = extra + before + after
    step_at = extra + before
    level_of = [1 + (step_sigmas * sigma if i >= step_at else 0.0) for i in range(n)]
    x = np.asarray(level_of) * (1 + sigma * rng.standard_normal(n))
    tested: list[int] = []
    pages = 0
    confirmed = False
    for night in range(9, n + 1):
        for idx, claimed in candidates(x[:night]):
            if any(abs(idx - t) <= 1 for t in tested):
                continue
            tested.append(idx)
            # The sandwich: the builds around the change, SANDWICH_BEFORE / _AFTER nights
            # more where there are nights (history.retests.followup._sandwich); the confirm judges
            # its two ends (every build between is tested in the same session).
            lo = max(0, idx - 1 - SANDWICH_BEFORE)
            hi = min(night - 1, idx + SANDWICH_AFTER)
            builds = [f"n{i}" for i in range(lo, hi + 1)]
            levels = {f"n{i}": level_of[i] for i in range(lo, hi + 1)}
            pool = Pool({}, {})
            while True:
                session(rng, pool, builds, levels, policy.pairs, fleet, True)
                lv, c = pool.level(builds[0], builds[-1], claimed=claimed,
                                   line=policy.confirm_line(claimed), policy=policy)  # fmt: skip
                k = c.pairs
                if lv != "unknown" or k + policy.pairs > policy.max_pairs:
                    break
            if lv == NEW_LEVEL:
                pages += 1
                confirmed = confirmed or lo < step_at <= hi
    return confirmed, len(tested), pages


def line_trial(rng, ratio, fleet, policy, *, looks_max, targets, sequential):
    """The verdict of one confirm whose true change is ``ratio`` x its decision line:
    sessions of ``policy.pairs`` on one machine per target, up to ``looks_max`` looks;
    the group confirmed when any target is at the new level, not reproduced when every
    one is at the old."""
    claimed = 0.04
    line = policy.confirm_line(claimed)
    pools = [Pool({}, {}) for _ in range(targets)]
    levels = {"g": 1.0, "s": 1 + ratio * line}
    for _look in range(looks_max):
        verdicts = []
        for pool in pools:
            session(rng, pool, ["g", "s"], levels, policy.pairs, fleet, True)
            verdicts.append(pool.level("g", "s", claimed=claimed, line=line, policy=policy,
                                       targets=targets, sequential=sequential)[0])  # fmt: skip
        if NEW_LEVEL in verdicts:
            return "new"
        if all(v == OLD_LEVEL for v in verdicts):
            return "old"
    return "undecided"


def line_part(a, fleet, policy) -> None:
    looks = policy.max_pairs // policy.pairs
    print(
        f"\n4. on the decision line (claimed 4 %, line {policy.confirm_line(0.04):.0%}): the "
        "verdict's wrong side (new level below the line, old level above it, either on it)"
    )
    print(
        "   true change / line  looks  targets  judged at          new level  old level  undecided"
    )
    one = Policy(pairs=policy.max_pairs, max_pairs=policy.max_pairs)
    rows = [
        (ratio, 1, 1, one, True) for ratio in (0.5, 1.0, 1.5)
    ] + [
        (ratio, looks, 1, policy, seq) for ratio in (0.5, 1.0, 1.5) for seq in (False, True)
    ] + [(1.0, looks, 4, policy, seq) for seq in (False, True)]  # fmt: skip
    for ratio, n_looks, targets, pol, seq in rows:
        rng = np.random.default_rng(a.seed + 4)
        res = [
            line_trial(rng, ratio, fleet, pol, looks_max=n_looks, targets=targets,
                       sequential=seq)
            for _ in range(a.line_trials)
        ]  # fmt: skip
        how = "alpha spent" if seq else "1.96 each look"
        size = f"{n_looks} x {pol.pairs}"
        print(
            f"   {ratio:4.1f}x               {size:7s} {targets:4d}     {how:17s} "
            f"{pct(res.count('new'), len(res))}  {pct(res.count('old'), len(res))}  "
            f"{pct(res.count('undecided'), len(res))}"
        )


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:5.1f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cv", type=float, default=0.01)
    ap.add_argument("--machine-sd", type=float, default=0.03)
    ap.add_argument("--drift", type=float, default=0.01)
    ap.add_argument("--build-noise", type=float, default=0.015)
    ap.add_argument("--line-trials", type=int, default=400, help="trials per row of part 4")
    ap.add_argument("--only", type=int, choices=(1, 2, 3, 4), help="print one part only")
    a = ap.parse_args()
    fleet = Fleet(a.cv, a.machine_sd, a.drift, a.build_noise)
    policy = Policy()
    t0 = time.perf_counter()
    print(
        f"fleet: sample noise {a.cv:.1%}, machines {a.machine_sd:.1%} sd apart, drift up to "
        f"{a.drift:.1%} per session, builds +-{a.build_noise:.1%} by themselves; sessions of "
        f"{policy.pairs} pairs, up to {policy.max_pairs}; {a.trials} trials per row\n"
    )

    if a.only in (None, 1):
        confirm_part(a, fleet, policy)
    if a.only in (None, 2):
        bisect_part(a, fleet, policy)
    if a.only in (None, 3):
        history_part(a, fleet, policy)
    if a.only in (None, 4):
        line_part(a, fleet, policy)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


def confirm_part(a, fleet, policy) -> None:
    print(
        "1. confirm, claimed change 3 %                  confirmed  not repro  undecided  median pairs"
    )
    for name, change, noisy in (
        ("a real 3 % change", 0.03, False),
        ("no change", 0.0, False),
        ("no change, builds differ by themselves", 0.0, True),
    ):
        for paired in (True, False):
            rng = np.random.default_rng(a.seed)
            res = [
                confirm_trial(rng, change, 0.03, fleet, policy, paired, noisy)
                for _ in range(a.trials)
            ]
            v = [r[0] for r in res]
            med = statistics.median(r[1] for r in res)
            how = "one machine" if paired else "spread     "
            print(
                f"   {name:40s} {how}  {pct(v.count('confirmed'), a.trials)}  "
                f"{pct(v.count('not'), a.trials)}  {pct(v.count('undecided'), a.trials)}  "
                f"{med:6.0f}"
            )


def bisect_part(a, fleet, policy) -> None:
    print(
        "\n2. bisect of 7 builds after the last good     right build  a neighbour  none   sessions  pairs/build (median)"
    )
    for change in (0.05, 0.03):
        for paired in (True, False):
            rng = np.random.default_rng(a.seed + 1)
            res = [bisect_trial(rng, change, fleet, policy, paired) for _ in range(a.trials)]
            right = sum(r[0] == r[1] for r in res)
            wrong = sum(r[0] is not None and r[0] != r[1] for r in res)
            none = sum(r[0] is None for r in res)
            sess = statistics.mean(r[2] for r in res)
            pairs = statistics.median(r[3] for r in res)
            how = "one machine" if paired else "spread     "
            print(
                f"   change {change:.0%}                   {how}  {pct(right, a.trials)}   "
                f"{pct(wrong, a.trials)}   {pct(none, a.trials)}  {sess:5.2f}     {pairs:4.0f}"
            )


def history_part(a, fleet, policy) -> None:
    print("\n3. short histories (8 before, 7 after, 2 % nightly noise)")
    for sig in (2.5, 3.0, 4.0):
        rng = np.random.default_rng(a.seed + 2)
        res = [history_trial(rng, sig, fleet, policy) for _ in range(a.trials)]
        hit = sum(r[0] for r in res)
        tests = statistics.mean(r[1] for r in res)
        print(
            f"   {sig} sigma step: confirmed {pct(hit, a.trials)}; re-tests per series {tests:.2f}"
        )
    rng = np.random.default_rng(a.seed + 3)
    res = [history_trial(rng, 0.0, fleet, policy, extra=45) for _ in range(a.trials)]
    points = a.trials * (60 - 9 + 1)
    pages = sum(r[2] for r in res)
    tests = sum(r[1] for r in res)
    print(
        f"   no step, 60 nightlies each: {pages} page(s) in {points} points = "
        f"{1000 * pages / points:.2f} per 1,000 points; {1000 * tests / points:.1f} re-tests "
        "per 1,000 points (each a session, no page)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
