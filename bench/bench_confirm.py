#!/usr/bin/env python3
"""Confirmation and bisection on generated perf histories with known answers.

Confirmation (accelmatrix.history.confirm, the default Policy: 5 runs per build, doubling
to at most 20, Mann-Whitney U). Nightly histories of 60 nights, level 100, machine noise
CV 2 % (sigma 2). Each night the gate's two candidate rules look at the newest point: the
newest-point suspect rule (3 sigmas worse than the nights before) and the change-point
detector's report of a regression among the newest 3 points. The first candidate of a
series is re-tested: the good build and the suspect build run ``repeats`` times each,
with the same machine noise, and ``decide`` gives the verdict; undecided adds a round.

* false candidates: series with no change but a lone outlier (4-8 sigma), a 2-night blip
  (3-6 sigma), a stretch of 3 noisy nights (noise x 3) or nothing at all at the end: the
  share of their candidates that confirmation keeps from notifying (goal >= 90 %; only a
  confirmed verdict notifies: undecided at the cap does not);
* real steps of 3-6 sigma: the share confirmed (goal >= 95 %);
* the runs per build a decision needed (median; goal <= 10).

Both with Gaussian noise and with heavy tails (Student t, 3 degrees of freedom, scaled to
the same sigma) in the re-runs and the nights.

Bisection (accelmatrix.history.bisect): ranges of 2-32 builds after the last good one, a
culprit drawn uniformly among them, a step of 3-6 sigma from the culprit on; each step
re-tests the middle build against the last good build with the same policy. Prints the
share of confirmed ranges whose culprit it names (goal >= 90 %) and the most steps any
bisect took against ceil(log2 N) + 2.

Seeds are fixed so two runs print the same figures; ``--seed`` changes them.

    .venv/bin/python bench/bench_confirm.py [--trials 400] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from accelmatrix.history.bisect import FOUND, Bisect, Step, max_steps  # noqa: E402
from accelmatrix.history.changepoints import DEFAULT, detect  # noqa: E402
from accelmatrix.history.confirm import (  # noqa: E402
    CONFIRMED,
    DEFAULT_POLICY,
    UNDECIDED,
    decide,
    newest_point_suspect,
    next_repeats,
)

LEVEL, SIGMA, HISTORY, WATCH = 100.0, 2.0, 60, 10


def noise(rng: np.random.Generator, n: int, heavy: bool) -> np.ndarray:
    if heavy:  # Student t(3) has variance 3: scale to unit variance
        return rng.standard_t(3, n) / math.sqrt(3)
    return rng.standard_normal(n)


def confirm(rng, good_level, bad_level, claimed, heavy) -> tuple[str, int]:
    """Re-test two builds in rounds until decided or capped: (verdict, runs per build)."""
    g: list[float] = []
    s: list[float] = []
    while (k := next_repeats(len(g))) > 0:
        g += list(good_level + SIGMA * noise(rng, k, heavy))
        s += list(bad_level + SIGMA * noise(rng, k, heavy))
        d = decide(g, s, claimed=claimed)
        if d.verdict != UNDECIDED:
            return d.verdict, len(g)
    return UNDECIDED, len(g)


def first_candidate(x: np.ndarray, start: int) -> tuple[int, float] | None:
    """The first night from ``start`` on whose newest point a candidate rule flags:
    (night, claimed relative change)."""
    for t in range(start, len(x)):
        prefix = x[: t + 1]
        sus = newest_point_suspect(prefix)
        if sus is not None:
            return t, sus[0]
        for cp in detect(prefix[-HISTORY:], DEFAULT):
            tail = len(prefix[-HISTORY:]) - cp.index
            if tail <= 3 and cp.change > 0:
                return t, abs(cp.change)
    return None


def false_history(rng, kind: str, heavy: bool) -> np.ndarray:
    x = LEVEL + SIGMA * noise(rng, HISTORY + WATCH, heavy)
    at = HISTORY + int(rng.integers(0, WATCH - 3))
    if kind == "outlier":
        x[at] += SIGMA * rng.uniform(4, 8)
    elif kind == "blip":
        x[at : at + 2] += SIGMA * rng.uniform(3, 6)
    elif kind == "noisy nights":
        x[at : at + 3] = LEVEL + 3 * SIGMA * noise(rng, 3, heavy)
    return x


def run_confirmation(trials: int, seed: int, heavy: bool) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    runs: list[int] = []
    suppressed = candidates = 0
    by_kind: dict[str, list[int]] = {}
    for kind in ("outlier", "blip", "noisy nights", "none"):
        hit = kept = 0
        for _ in range(trials):
            x = false_history(rng, kind, heavy)
            cand = first_candidate(x, HISTORY)
            if cand is None:
                continue
            hit += 1
            verdict, n = confirm(rng, LEVEL, LEVEL, cand[1], heavy)
            runs.append(n)
            kept += verdict != CONFIRMED  # undecided at the cap does not notify either
        by_kind[kind] = [kept, hit]
        suppressed += kept
        candidates += hit
    found = confirmed = 0
    for _ in range(trials):
        size = rng.uniform(3, 6)
        x = LEVEL + SIGMA * noise(rng, HISTORY + WATCH, heavy)
        x[HISTORY:] += size * SIGMA
        cand = first_candidate(x, HISTORY)
        if cand is None:
            continue
        found += 1
        verdict, n = confirm(rng, LEVEL, LEVEL + size * SIGMA, cand[1], heavy)
        runs.append(n)
        confirmed += verdict == CONFIRMED
    return {
        "by_kind": by_kind,
        "suppressed": suppressed / max(candidates, 1),
        "candidates": candidates,
        "confirmed": confirmed / max(found, 1),
        "steps": found,
        "median_runs": float(np.median(runs)) if runs else math.nan,
    }


def run_bisect(trials: int, seed: int, heavy: bool) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    right = total = worst_excess = 0
    ambiguous = 0
    for _ in range(trials):
        n = int(rng.integers(2, 33))  # candidate builds after the last good one
        culprit = int(rng.integers(1, n + 1))
        size = rng.uniform(3, 6) * SIGMA
        levels = [LEVEL + (size if i >= culprit else 0.0) for i in range(n + 1)]
        # The confirmation measured the change between the two ends: that is the claim.
        claimed = size / LEVEL
        b = Bisect([f"b{i}" for i in range(n + 1)])
        while (nxt := b.next_build()) is not None:
            i, name = nxt
            g: list[float] = []
            m: list[float] = []
            verdict = UNDECIDED
            while (k := next_repeats(len(g), DEFAULT_POLICY)) > 0:
                g += list(LEVEL + SIGMA * noise(rng, k, heavy))
                m += list(levels[i] + SIGMA * noise(rng, k, heavy))
                verdict = decide(g, m, claimed=claimed).verdict
                if verdict != UNDECIDED:
                    break
            b.record(Step(index=i, build=name, verdict=verdict, n=len(g)))
        total += 1
        right += b.state == FOUND and b.culprit == f"b{culprit}"
        ambiguous += b.state != FOUND
        worst_excess = max(worst_excess, len(b.steps) - max_steps(n))
    return {
        "right": right / total,
        "ambiguous": ambiguous / total,
        "trials": total,
        "steps_within_limit": worst_excess <= 0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    t0 = time.perf_counter()
    print(
        f"confirmation: {a.trials} histories per kind, noise CV 2 %, policy "
        f"{DEFAULT_POLICY.repeats} runs per build doubling to {DEFAULT_POLICY.max_repeats}"
    )
    for heavy in (False, True):
        r = run_confirmation(a.trials, a.seed, heavy)
        name = "Student t(3)" if heavy else "Gaussian"
        kinds = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in r["by_kind"].items())
        print(
            f"  {name:12s} false candidates kept from notifying: {r['suppressed']:.1%} "
            f"of {r['candidates']} (goal >= 90 %) [{kinds}]"
        )
        print(
            f"  {name:12s} real 3-6 sigma steps confirmed: {r['confirmed']:.1%} of "
            f"{r['steps']} (goal >= 95 %); median runs per build {r['median_runs']:.0f} "
            "(goal <= 10)"
        )
    print(f"bisection: {a.trials} ranges of 2-32 builds, steps of 3-6 sigma")
    for heavy in (False, True):
        r = run_bisect(a.trials, a.seed, heavy)
        name = "Student t(3)" if heavy else "Gaussian"
        print(
            f"  {name:12s} culprit named: {r['right']:.1%} (goal >= 90 %), ambiguous "
            f"{r['ambiguous']:.1%}, steps within ceil(log2 N) + 2: {r['steps_within_limit']}"
        )
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
