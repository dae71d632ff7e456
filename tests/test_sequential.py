"""Repeated looks and several targets keep the re-test's error rates (history.retests.sequential).

The re-test judges its pooled pairs after every session of 10 pairs, up to 40: the same
question asked up to four times. These tests put the true change exactly on the decision
line (where any verdict is wrong) and at half and one and a half times it, and count the
wrong verdicts over every look the controller takes (``Policy.critical`` as
``history.retests.followup`` calls it), and over groups of four targets of which any one confirms.
Generated pairs: per-sample noise 2 % (the log ratio of a pair ~2.8 %), fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from accelmatrix.history.retests.compare import (
    DIFFERENT,
    MIN_PAIRS_TWO_SIDED,
    NEW_LEVEL,
    OLD_LEVEL,
    compare,
    judge,
    level,
    min_pairs,
)
from accelmatrix.history.retests.confirm import Policy
from accelmatrix.history.retests.sequential import ONE_SIDED_ALPHA, critical_z, fractions_of

CLAIMED = 0.04
POLICY = Policy()  # 10 pairs a session, 40 at most, line min(claimed / 2, 2 %)
LINE = POLICY.confirm_line(CLAIMED)
NOISE = 0.02


def test_one_look_at_the_full_size_is_the_plain_interval() -> None:
    assert critical_z([40], 40) == pytest.approx(1.95996, abs=1e-3)


def test_four_equal_looks_widen_every_look_and_spend_nothing_past_the_cap() -> None:
    zs = [critical_z([10, 20, 30, 40][: k + 1], 40) for k in range(4)]
    assert all(2.2 < z < 2.5 for z in zs), zs  # Pocock-type: about 2.35 each
    assert critical_z([10, 20, 30, 40, 50], 40) == math.inf
    # A look that added no pair is no new look.
    assert fractions_of([10, 10, 20], 40) == (0.25, 0.5)
    # Several targets: the confirming side is shared among them.
    assert critical_z([10], 40, ONE_SIDED_ALPHA / 4) > critical_z([10], 40) + 0.4


def _retest(rng: np.random.Generator, change: float, targets: int) -> tuple[str, int]:
    """One re-test as the controller runs it: sessions of POLICY.pairs pairs per target
    until a verdict or the cap. The group is confirmed when any target reaches the new
    level, not reproduced when every target sits at the old one."""
    ratios: list[list[float]] = [[] for _ in range(targets)]
    looks: list[int] = []
    while True:
        for r in ratios:
            base = 1 + NOISE * rng.standard_normal(POLICY.pairs)
            head = (1 + change) * (1 + NOISE * rng.standard_normal(POLICY.pairs))
            r.extend(zip(base.tolist(), head.tolist(), strict=True))
        looks.append(len(ratios[0]))
        z_new, z_old = POLICY.critical(looks, targets=targets)
        verdicts = []
        for r in ratios:
            c = compare([b for b, _ in r], [h for _, h in r], r, seed=len(r))
            verdicts.append(level(c, claimed=CLAIMED, line=LINE, z_new=z_new, z_old=z_old))
        if NEW_LEVEL in verdicts:
            return "new", len(looks)
        if all(v == OLD_LEVEL for v in verdicts):
            return "old", len(looks)
        if looks[-1] + POLICY.pairs > POLICY.max_pairs:
            return "undecided", len(looks)


def _rates(change: float, trials: int, targets: int = 1, seed: int = 7) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    out = [_retest(rng, change, targets) for _ in range(trials)]
    return {v: sum(o[0] == v for o in out) / trials for v in ("new", "old", "undecided")} | {
        "looks": max(o[1] for o in out)
    }


# The nominal one-sided rate (2.5 %) plus the one point, plus what 300 trials of a
# binomial leave on top (the bench runs 1,200 and more: BENCHMARKS.md).
BOUND = ONE_SIDED_ALPHA + 0.01 + 0.01


def test_a_change_on_the_line_is_rarely_called_either_way_after_every_look() -> None:
    r = _rates(LINE, trials=300)
    assert r["looks"] == POLICY.max_pairs // POLICY.pairs  # some trials took every look
    assert r["new"] <= BOUND and r["old"] <= BOUND, r


def test_half_and_one_and_a_half_times_the_line_keep_the_wrong_side_rare() -> None:
    low = _rates(0.5 * LINE, trials=150, seed=8)
    high = _rates(1.5 * LINE, trials=150, seed=9)
    assert low["new"] <= BOUND, low
    assert high["old"] <= BOUND, high
    # ... and the right side is still reached within the cap (half a point of distance
    # at 2.8 % per pair and 40 pairs is about 2.2 standard errors: the price of the wider
    # interval is paid here, near the line; bench_confirm prints the rates).
    assert low["old"] >= 0.3 and high["new"] >= 0.3, (low, high)


def test_a_group_of_four_targets_on_the_line_is_confirmed_rarely() -> None:
    r = _rates(LINE, trials=150, targets=4, seed=10)
    assert r["new"] <= BOUND, r


def test_a_clear_change_still_confirms_on_its_first_session() -> None:
    rng = np.random.default_rng(11)
    out = [_retest(rng, 3 * LINE, 1) for _ in range(100)]
    first = sum(v == "new" and n == 1 for v, n in out) / len(out)
    assert first >= 0.8, first
    assert all(v == "new" for v, _n in out)


def test_every_accepted_compare_size_can_reach_every_verdict() -> None:
    from accelmatrix.spec.followup_plan import CompareRequest

    assert MIN_PAIRS_TWO_SIDED == min_pairs(0.01, two_sided=True) == 8
    fewest = CompareRequest.model_fields["pairs"].metadata
    ge = next(m.ge for m in fewest if hasattr(m, "ge"))
    assert ge == MIN_PAIRS_TWO_SIDED
    with pytest.raises(ValueError):
        CompareRequest(base="a", head="b", pairs=7)
    base = [1.0 + 0.001 * i for i in range(ge)]
    slower = [b * 1.2 for b in base]
    c = compare(base, slower, list(zip(base, slower, strict=True)))
    assert judge(c, min_change=0.02) == DIFFERENT
