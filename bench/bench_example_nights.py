#!/usr/bin/env python3
"""How many nights the op_regression example needs before and after its slow build for the
gate to start a re-test: generated series through the gate's own rules.

Why: tests/test_op_regression.py backfills the example on a real scheduler, and every
night costs ~15 s there. Its step time is real (a matmul on one thread), so its
night-to-night noise is the shared host's, not a seeded draw: the number of nights must
find the step whatever the day brings. Each series is ``--good`` nights at level 1, then
``--bad`` nights at ``--step`` (1.65: the doubled matmul's +65 %), each night times
1 + N(0, noise). The gate's pass runs night by night, as in the backfill: the reporting
detector with the suite's settings (``history.min_change`` 0.1), the permissive
candidates and the newest-point rule (``history.change_points.tracking.find_changes``'s
suspects). A trial counts as found when a pass flags the first slow night or later, and as a
false start when one flags a regression before it.

    .venv/bin/python bench/bench_example_nights.py [--trials 1000] [--seed 3]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from accelmatrix.history.change_points.tracking import candidates_detector
from accelmatrix.history.retests.confirm import newest_point_suspect
from accelmatrix.history.series.detector import DEFAULT, detect

SETTINGS = ((3, 3), (4, 2), (4, 3), (4, 4), (5, 3), (5, 4), (6, 3))
NOISE = (0.05, 0.10)


def trial(values: np.ndarray, good: int) -> int | None:
    """The night (1 = the first slow one) whose gate flags the step; 0 for a flag before
    it; None when no night does."""
    strict = replace(DEFAULT, min_change=0.1)
    weak = candidates_detector(strict)
    for n in range(3, len(values) + 1):
        x = values[:n]
        flagged = {
            c.index
            for d in (strict, weak)
            for c in detect(x, d)
            if c.after.median > c.before.median
        }
        if not any(i >= n - 3 for i in flagged) and newest_point_suspect(x):
            flagged.add(n - 1)
        if flagged:
            return 0 if n <= good else n - good
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--step", type=float, default=1.65)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    print("| noise | nights before + after | found | false start | found on night 1 / 2 / 3 |")
    print("|---|---|---|---|---|")
    for noise in NOISE:
        for good, bad in SETTINGS:
            when = []
            for _ in range(a.trials):
                level = np.r_[np.ones(good), a.step * np.ones(bad)]
                when.append(trial(level * (1 + noise * rng.standard_normal(good + bad)), good))
            found = [w for w in when if w]
            by_night = " / ".join(str(found.count(k)) for k in range(1, 4))
            print(
                f"| {noise:.0%} | {good} + {bad} | {len(found) / a.trials:.1%} | "
                f"{when.count(0) / a.trials:.1%} | {by_night} |"
            )


if __name__ == "__main__":
    main()
