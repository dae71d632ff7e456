"""Is a suspect change real? Two builds re-tested side by side, and a two-sample verdict.

A change point says "from build S on, this series sits ``claimed`` worse than it did up to
build G". The nightly points behind it came from different nights, possibly different
machines: a lone bad night, a noisy host or a two-night blip look the same as a real step
until more nights arrive. Chromeperf's answer (its "sandwich" verification) is to re-run
both builds now, on the same kind of machine, interleaved (G S G S ...) so that drift of
the machine during the re-runs hits both samples alike, and to let a statistical test
decide before anybody is paged. Pinpoint does the same for each build it bisects.

``decide`` is that test, in the orientation of the metric (worse = higher step time, or
lower throughput):

* **confirmed**: the suspect sample is worse than the good one (one-sided Mann-Whitney U,
  ``p < alpha_worse``) and not shown to be less than half the claimed change worse;
* **not reproduced**: the suspect sample is shown to be less than half the claimed change
  worse (the same test on the suspect sample moved back by that half-change,
  ``p < alpha_same``): whatever the nightly points saw, the builds do not differ by it;
* **undecided**: neither yet. The caller adds repeats (doubling, as Pinpoint does) up to
  the suite's cap; undecided at the cap is reported as such and notifies (a real change
  must never be hidden because the re-runs were too few).

Why these pieces:

* Mann-Whitney U (``scipy.stats.mannwhitneyu``, exact for small samples) rather than a
  t-test: re-run samples of step time have a floor and a long right tail (a GC pause, a
  noisy neighbour); ranks do not care. With 5 runs a side the smallest one-sided p is
  1/252 = 0.004, so a clean separation decides at once; with 3 a side it is 0.05, which
  is why the default starts at 5.
* The half-change test is what ends a false candidate early. Without it, "not different"
  could only be concluded from a large p, which small samples produce for real changes
  too (Pinpoint looks its "same" threshold up in a table by sample and effect size; this
  asks the direct question: is the shift smaller than half of what was claimed?).
* Medians and the interquartile range are stored with the verdict: they are what a person
  reads to judge it, and they do not move with one wild run.

The thresholds are fixed, not fitted to any one series: bench/bench_confirm.py prints the
false-candidate suppression, the confirmation rate of real steps and the runs they needed
on generated histories.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accelmatrix.history.changepoints import noise_sigma

__all__ = [
    "CONFIRMED",
    "NOT_REPRODUCED",
    "UNDECIDED",
    "Decision",
    "Policy",
    "decide",
    "next_repeats",
    "newest_point_suspect",
]

CONFIRMED = "confirmed"
NOT_REPRODUCED = "not_reproduced"
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Policy:
    """How a suspect change is re-tested: runs per build in the first round, the most per
    build over all rounds (each round doubles), and the test's two thresholds."""

    repeats: int = 5
    max_repeats: int = 20
    alpha_worse: float = 0.01
    alpha_same: float = 0.05
    # The shift a "not reproduced" verdict rules out, as a fraction of the claimed change.
    same_fraction: float = 0.5


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Decision:
    """One comparison of a good build's sample with a suspect build's."""

    verdict: str  # confirmed | not_reproduced | undecided
    n_good: int
    n_suspect: int
    median_good: float
    median_suspect: float
    iqr_good: float
    iqr_suspect: float
    change: float  # median_suspect / median_good - 1 (signed, in the metric's units)
    p_worse: float  # the suspect is worse (one-sided)
    p_same: float  # the suspect is less than same_fraction x claimed worse (one-sided)

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "verdict": self.verdict,
            "n_good": self.n_good,
            "n_suspect": self.n_suspect,
            "median_good": self.median_good,
            "median_suspect": self.median_suspect,
            "iqr_good": self.iqr_good,
            "iqr_suspect": self.iqr_suspect,
            "change": self.change,
            "p_worse": self.p_worse,
            "p_same": self.p_same,
        }


def decide(
    good: Sequence[float],
    suspect: Sequence[float],
    *,
    claimed: float,
    higher_is_better: bool = False,
    policy: Policy = DEFAULT_POLICY,
) -> Decision:
    """The verdict on ``suspect`` against ``good``, for a change claimed to make the metric
    ``claimed`` (relative, e.g. 0.05 = 5 %) worse. Non-finite values are dropped (a run
    that produced no number is not evidence either way). ``claimed`` is taken by size: the
    direction is the metric's (``higher_is_better``)."""
    from scipy.stats import mannwhitneyu

    g = _finite(good)
    s = _finite(suspect)
    if len(g) < 2 or len(s) < 2:
        med_g = float(np.median(g)) if len(g) else math.nan
        med_s = float(np.median(s)) if len(s) else math.nan
        return Decision(
            UNDECIDED, len(g), len(s), med_g, med_s, math.nan, math.nan, math.nan, 1.0, 1.0
        )
    sign = -1.0 if higher_is_better else 1.0  # oriented: larger = worse
    og, os_ = sign * g, sign * s
    med_g, med_s = float(np.median(g)), float(np.median(s))
    half = policy.same_fraction * abs(claimed) * abs(med_g)
    p_worse = float(mannwhitneyu(os_, og, alternative="greater").pvalue)
    p_same = float(mannwhitneyu(os_ - half, og, alternative="less").pvalue)
    if p_same < policy.alpha_same:
        verdict = NOT_REPRODUCED
    elif p_worse < policy.alpha_worse:
        verdict = CONFIRMED
    else:
        verdict = UNDECIDED
    change = med_s / med_g - 1 if med_g else math.nan
    return Decision(
        verdict,
        len(g),
        len(s),
        med_g,
        med_s,
        _iqr(g),
        _iqr(s),
        change,
        p_worse,
        p_same,
    )


# The newest point is a suspect when it lies this many noise sigmas worse than the level of
# the nights before it: about 1 night in 740 per series on Gaussian noise, each costing one
# confirm run (not a page), so a step is re-tested the night it lands instead of after the
# detector has seen enough nights at the new level to report it.
SUSPECT_SIGMAS = 3.0
# ... judged against the median of this many nights before it, with this many at least.
SUSPECT_BASELINE = 14
SUSPECT_MIN_HISTORY = 8


def newest_point_suspect(
    values: Sequence[float],
    *,
    higher_is_better: bool = False,
    min_change: float = 0.0,
    sigmas: float = SUSPECT_SIGMAS,
) -> tuple[float, float] | None:
    """(claimed relative change, effect in sigmas) when the newest of ``values`` (finite,
    oldest first) lies ``sigmas`` noise sigmas worse than the median of the nights before
    it; None otherwise. The noise scale is the change-point detector's, from the nights
    before (``changepoints.noise_sigma``), so the newest point cannot hide in its own
    noise estimate."""
    x = _finite(values)
    if len(x) < SUSPECT_MIN_HISTORY + 1:
        return None
    before = x[:-1]
    level = float(np.median(before[-SUSPECT_BASELINE:]))
    sigma = noise_sigma(before)
    shift = (x[-1] - level) * (-1.0 if higher_is_better else 1.0)
    effect = shift / sigma
    change = abs(x[-1] / level - 1) if level else math.inf
    if effect >= sigmas and change >= min_change:
        return change, effect
    return None


def next_repeats(done: int, policy: Policy = DEFAULT_POLICY) -> int:
    """How many more runs per build the next round adds after ``done`` runs per build
    (doubling the sample, as Pinpoint does); 0 when the cap is reached."""
    if done <= 0:
        return min(policy.repeats, policy.max_repeats)
    return max(0, min(done, policy.max_repeats - done))


def _finite(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([v for v in values if v is not None], dtype="float64")
    return a[np.isfinite(a)]


def _iqr(a: np.ndarray) -> float:
    q1, q3 = np.percentile(a, [25, 75])
    return float(q3 - q1)
