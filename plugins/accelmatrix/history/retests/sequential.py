"""Decisions that look more than once keep the error rate they state.

A re-test judges its pooled pairs after every session and, while undecided, adds another
session, up to ``history.confirm.max_pairs`` pairs per build: with the default 10 pairs a
session and 40 at most, the same question is asked up to four times. Judged each time at
the one-look 95 % interval, a change that sits exactly on the decision line is called on
one side or the other far more often than 2.5 % a side (5.4-6.3 % at four looks on
generated data), because each look is another chance for the interval to clear the line
by luck. A group of several re-tested series that is confirmed when any one of them
confirms is the same problem across series instead of across looks.

The method is **group-sequential alpha spending** (Lan and DeMets, 1983): the one-sided
error ``alpha`` of each verdict is spent over the information fractions ``t = pairs /
max_pairs`` of the looks actually taken, by the Pocock-type function ``alpha * ln(1 + (e -
1) t)``, and each look's critical value is the one whose crossing probability, given that
no earlier look crossed, is exactly the increment spent (the statistic's path across looks
is Brownian: look i and j correlate by sqrt(t_i / t_j)). Why these choices:

* Spending, not a fixed number of looks: a session may bring fewer pairs than asked (a
  sample that failed), and the last look may come early (the cap is counted per build);
  the boundary follows the looks that happened.
* Pocock-type rather than O'Brien-Fleming-type: a re-test exists to settle clear cases
  in one session (a 6 % step against a 2 % line confirms on its first 10 pairs 85 % of
  the time, against 98 % uncorrected: tests/test_sequential.py), and O'Brien-Fleming's
  first-look boundary (z ~ 4) would send most of them to a second session. The price is a wider interval at the last look (z 2.36 instead of
  1.96 for four equal looks), paid only by changes that sit near the line.
* Exact crossing probabilities (``scipy.stats.multivariate_normal``) rather than a union
  bound over the increments: the union bound ignores that looks share their pairs and
  would widen the last look further for nothing.
* Several targets: the verdict that fires when **any** target says so ("confirmed") is
  judged at ``alpha / m`` for m targets (Bonferroni: no assumption about how the series
  of one group correlate); the verdict that needs **every** target ("not reproduced") is
  an intersection and keeps ``alpha``.

A critical value becomes an interval through ``Comparison.widened``: the bootstrap 95 %
interval's distance from the estimate, scaled by the ratio of Student's t quantiles (a few
pairs' estimate has heavier tails than a normal one). A single look at the full size gives
the one-look critical value (1.96 for 2.5 %), so a
one-session decision at ``max_pairs`` is judged exactly as before. bench/bench_confirm.py
prints the wrong-verdict rates with the true change at 0.5x, 1x and 1.5x the line, at one
look and at every look.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["ONE_SIDED_ALPHA", "critical_z", "fractions_of", "spent"]

# Each side of the re-test's 95 % interval: a verdict on one side of the line is wrong at
# most this often when the true change sits on it.
ONE_SIDED_ALPHA = 0.025


def spent(t: float, alpha: float) -> float:
    """The error spent by information fraction ``t`` (Pocock-type, Lan-DeMets)."""
    t = min(max(t, 0.0), 1.0)
    return alpha * math.log1p((math.e - 1.0) * t)


def fractions_of(counts: Sequence[int], max_pairs: int) -> tuple[float, ...]:
    """The information fractions of looks at ``counts`` pooled pairs (a strictly rising
    sequence: a look that added no pair is no new look), capped at 1: a look past the cap
    has nothing left to spend (``critical_z`` is then ``inf``)."""
    out: list[float] = []
    last = 0
    for n in counts:
        if n <= last:
            continue
        last = n
        out.append(min(1.0, n / max(1, max_pairs)))
    return tuple(out)


def critical_z(counts: Sequence[int], max_pairs: int, alpha: float = ONE_SIDED_ALPHA) -> float:
    """The one-sided critical z of the last of the looks at ``counts`` pooled pairs, for a
    decision that may look at most up to ``max_pairs`` pairs and keeps ``alpha`` overall.
    ``inf`` when the spending leaves nothing for this look."""
    fr = fractions_of(counts, max_pairs)
    if not fr:
        return _norm_isf(alpha)
    return _boundaries(tuple(round(t, 6) for t in fr), round(alpha, 9))[-1]


@functools.lru_cache(maxsize=512)
def _boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """The critical values of every look (module docstring)."""
    from scipy.optimize import brentq

    ts = np.asarray(fractions, dtype="float64")
    # Brownian path: the statistics at looks i and j correlate by sqrt(t_i / t_j).
    corr = np.sqrt(np.minimum.outer(ts, ts) / np.maximum.outer(ts, ts))
    zs: list[float] = []
    for k, t in enumerate(fractions):
        inc = spent(t, alpha) - (spent(fractions[k - 1], alpha) if k else 0.0)
        if inc <= 1e-12:
            zs.append(math.inf)
            continue
        before = _no_crossing(zs, corr)

        # P(no earlier crossing) - P(no crossing up to this look) = the increment.
        def gap(z: float, before: float = before, inc: float = inc) -> float:
            return before - _no_crossing([*zs, z], corr) - inc

        if gap(0.0) < 0:
            zs.append(0.0)
        elif gap(8.0) > 0:
            zs.append(8.0)
        else:
            zs.append(float(brentq(gap, 0.0, 8.0, xtol=1e-4)))
    return tuple(zs)


def _no_crossing(bounds: list[float], corr: np.ndarray) -> float:
    """P(Z_i < bounds[i] for every look i) under no change; an infinite bound is no bound."""
    from scipy.stats import multivariate_normal

    idx = [i for i, z in enumerate(bounds) if math.isfinite(z)]
    if not idx:
        return 1.0
    if len(idx) == 1:
        return _norm_cdf(bounds[idx[0]])
    mvn = multivariate_normal(mean=np.zeros(len(idx)), cov=corr[np.ix_(idx, idx)])
    # A fixed generator: the quasi-Monte Carlo integral is the same on every call.
    return float(mvn.cdf(np.asarray([bounds[i] for i in idx]), rng=np.random.default_rng(0)))


def _norm_isf(p: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(p))


def _norm_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))
