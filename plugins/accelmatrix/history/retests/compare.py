"""Two builds compared on one machine: the statistics of every re-test (confirm, bisect, and
"compare any two builds").

A re-test runs both builds on the same machine, interleaved (A B B A ...): each A sample
sits next to a B sample, so the machine's own speed (2-4 % from machine to machine on real
fleets) and its slow drift cancel in the ratio of the two. The unit of evidence is
therefore the **pair**: one sample of each build taken next to each other, and its log
ratio ``log(head / base)``. Everything here works on those ratios; the unpaired figures
are reported beside them for the reader who wants them.

What a comparison reports (``Comparison``), as PerfCompare and Pinpoint do:

* each side's median and n;
* the change, ``exp(HL) - 1`` where HL is the Hodges-Lehmann estimate of the log ratios
  (the median of their pairwise means: as robust to one wild sample as the median, and
  nearly as efficient as the mean on Gaussian noise, so a 3 % change is decided in about
  10 pairs instead of 16), with a bootstrap 95 % confidence interval over the pairs
  (``scipy.stats.bootstrap``, percentile, widened by the t quantile ratio for the few
  pairs a re-test has: a plain percentile bootstrap of 10 pairs covers less than it says,
  which would turn noise into verdicts);
* the Wilcoxon signed-rank test on the log ratios (``scipy.stats.wilcoxon``, exact for
  these sizes) and Mann-Whitney U on the raw samples (``scipy.stats.mannwhitneyu``);
* Cliff's delta (the share of head > base minus head < base over all cross pairs);
* a verdict, judged by the **size** of the change, not only its significance.

Two verdicts, for two questions:

``judge`` (compare any two builds): DIFFERENT when the change is significant (Wilcoxon
p <= ``alpha``) and its whole interval lies beyond ``min_change``; SAME when its whole
interval lies inside +-``min_change`` (an equivalence test: "no change worth a page");
UNKNOWN otherwise, which asks for more pairs.

``level`` (confirm and bisect): a change point claims "from this build on the metric sits
``claimed`` worse". A build is at the NEW level when its interval vs the last good build
lies entirely beyond half the claimed change (nearer the claimed change than no change),
and significantly so; at the OLD level when the interval lies entirely below half of it;
UNKNOWN otherwise. A bisect step that calls a build bad because it is 1 % slower by chance
is what this replaces: a 1 % build against a 5 % claim sits at the old level.

Thresholds are fixed, not fitted to any one series: bench/bench_confirm.py prints their
error rates on generated fleets (builds that differ by themselves, machines that differ
from each other), paired on one machine and spread over many.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "DIFFERENT",
    "NEW_LEVEL",
    "OLD_LEVEL",
    "SAME",
    "UNKNOWN",
    "Comparison",
    "compare",
    "judge",
    "level",
    "min_pairs",
]

DIFFERENT, SAME, UNKNOWN = "different", "same", "unknown"
NEW_LEVEL, OLD_LEVEL = "new_level", "old_level"

ALPHA = 0.01
CONFIDENCE = 0.95
# The critical z of the CONFIDENCE interval (each side 2.5 %): a caller that looks more
# than once (history.retests.sequential) widens it about the estimate to its own critical value.
Z_INTERVAL = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000


def min_pairs(alpha: float = ALPHA, *, two_sided: bool) -> int:
    """The fewest pairs whose exact Wilcoxon p-value can reach ``alpha``: n pairs give at
    least 1 / 2**n one-sided and 2 / 2**n two-sided, so below this a verdict that needs
    significance can never be reached, whatever the data."""
    floor = 2.0 if two_sided else 1.0
    n = 1
    while floor / 2**n > alpha:
        n += 1
    return n


# A build's level needs this many pairs (one-sided p: 7 for 0.01); "compare any two
# builds" (``judge``, two-sided p) needs one more: 7 pairs' smallest two-sided p is
# 0.0156, so a 7-pair compare could never say DIFFERENT.
MIN_PAIRS = min_pairs(ALPHA, two_sided=False)
MIN_PAIRS_TWO_SIDED = min_pairs(ALPHA, two_sided=True)


@dataclass(frozen=True)
class Comparison:
    """Head against base: what a person reads to judge a re-test (module docstring)."""

    n_base: int
    n_head: int
    pairs: int
    median_base: float
    median_head: float
    change: float  # head / base - 1 from the pairs' log ratios (Hodges-Lehmann, signed)
    ci_low: float  # bootstrap CONFIDENCE interval of ``change``
    ci_high: float
    p_paired: float  # Wilcoxon signed-rank on the pairs' log ratios, two-sided
    p_greater: float  # ... one-sided: head is higher than base
    p_less: float  # ... one-sided: head is lower than base
    p_mwu: float  # Mann-Whitney U on the raw samples, two-sided
    cliffs_delta: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def oriented(
        self, higher_is_better: bool, z_lo: float | None = None, z_hi: float | None = None
    ) -> tuple[float, float, float, float]:
        """(change, ci_low, ci_high, p that head is worse), with worse = positive. ``z_lo``
        / ``z_hi``: the critical value the oriented lower / upper bound is widened to
        (``widened``; None: as it is)."""
        if higher_is_better:
            lo, hi = self.widened(z_low=z_hi, z_high=z_lo)
            return -self.change, -hi, -lo, self.p_less
        lo, hi = self.widened(z_low=z_lo, z_high=z_hi)
        return self.change, lo, hi, self.p_greater

    def widened(
        self, *, z_low: float | None = None, z_high: float | None = None
    ) -> tuple[float, float]:
        """(ci_low, ci_high) with each side's distance from the estimate scaled, in log
        space, from the interval's own critical value (``Z_INTERVAL``) to ``z_low`` /
        ``z_high`` (None: as it is). A sequential decision (history.retests.sequential) judges a
        look by a critical value above 1.96; the bootstrap's shape (its skew) is kept."""
        if math.isnan(self.change):
            return self.ci_low, self.ci_high
        centre = math.log1p(self.change)
        df = max(1, self.pairs - 1)

        def side(bound: float, z: float | None) -> float:
            if z is None or bound == self.change:
                return bound
            # expm1 of an infinite log distance: -1 below the estimate, inf above it.
            return math.expm1(centre + (math.log1p(bound) - centre) * _t_ratio(z, df))

        return side(self.ci_low, z_low), side(self.ci_high, z_high)


def compare(
    base: Sequence[float],
    head: Sequence[float],
    pairs: Sequence[tuple[float, float]],
    *,
    seed: int = 0,
) -> Comparison:
    """Compare ``head`` with ``base``: all their samples, and ``pairs`` of (base, head)
    values taken next to each other on one machine. Non-finite and non-positive values are
    dropped (a sample that produced no number is no evidence; a log ratio needs > 0)."""
    b, h = _positive(base), _positive(head)
    ratios = np.asarray([math.log(y / x) for x, y in pairs if _ok(x) and _ok(y)], dtype="float64")
    med_b = float(np.median(b)) if len(b) else math.nan
    med_h = float(np.median(h)) if len(h) else math.nan
    n = len(ratios)
    if n < 2:
        return Comparison(
            len(b), len(h), n, med_b, med_h, math.nan, math.nan, math.nan, 1.0, 1.0, 1.0,
            _mwu(b, h), _cliffs(b, h),
        )  # fmt: skip
    centre = float(_hodges_lehmann(ratios))
    lo, hi = _interval(ratios, seed)
    p2, pg, pl = _wilcoxon(ratios)
    return Comparison(
        n_base=len(b),
        n_head=len(h),
        pairs=n,
        median_base=med_b,
        median_head=med_h,
        change=math.expm1(centre),
        ci_low=math.expm1(lo),
        ci_high=math.expm1(hi),
        p_paired=p2,
        p_greater=pg,
        p_less=pl,
        p_mwu=_mwu(b, h),
        cliffs_delta=_cliffs(b, h),
    )


def judge(c: Comparison, *, min_change: float, alpha: float = ALPHA, z: float | None = None) -> str:
    """DIFFERENT, SAME or UNKNOWN for "is head different from base by at least
    ``min_change`` (relative)?" (module docstring). ``z``: the interval's critical value
    when the caller looks more than once or at several comparisons (None: 1.96)."""
    if c.pairs < min_pairs(alpha, two_sided=True) or math.isnan(c.change):
        return UNKNOWN
    lo, hi = c.widened(z_low=z, z_high=z)
    if c.p_paired <= alpha and (lo > min_change or hi < -min_change):
        return DIFFERENT
    if -min_change < lo and hi < min_change:
        return SAME
    return UNKNOWN


def level(
    c: Comparison,
    *,
    claimed: float,
    higher_is_better: bool = False,
    alpha: float = ALPHA,
    line: float | None = None,
    z_new: float | None = None,
    z_old: float | None = None,
) -> str:
    """NEW_LEVEL, OLD_LEVEL or UNKNOWN: does head (against the last good build as base) sit
    at the level a change of ``claimed`` (relative, taken by size, worse in the metric's
    direction) moved to, or at the old one? The line between them is half the claim, or
    ``line`` (oriented, relative to base) when the caller knows both levels better than
    the base alone does (``history.retests.bisect.split_line``). ``z_new`` / ``z_old``: the
    critical value each verdict's side of the interval is judged at (a re-test's look,
    ``history.retests.sequential``; None: the one-look 1.96)."""
    if c.pairs < min_pairs(alpha, two_sided=False) or math.isnan(c.change):
        return UNKNOWN
    _change, lo, hi, p_worse = c.oriented(higher_is_better, z_lo=z_new, z_hi=z_old)
    half = abs(claimed) / 2 if line is None else line
    if lo > half and p_worse <= alpha:
        return NEW_LEVEL
    if hi < half:
        return OLD_LEVEL
    return UNKNOWN


# -- pieces ------------------------------------------------------------------------------


def _t_ratio(z: float, df: int) -> float:
    """How much wider than the CONFIDENCE interval the interval at critical value ``z`` is,
    for a log-ratio estimate from ``df + 1`` pairs: the ratio of Student's t quantiles at
    the same tail areas (``z``'s normal tail, against the interval's). A few pairs' estimate
    has heavier tails than a normal one, so scaling by ``z / 1.96`` alone would make the
    stricter looks of a sequential or multi-target decision cover less than they claim
    (a group of four targets on the line confirmed 5 % of the time, against 2.5 %)."""
    from scipy.stats import norm, t

    if math.isinf(z):
        return math.inf
    return float(t.isf(norm.sf(z), df) / t.isf(norm.sf(Z_INTERVAL), df))


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def _positive(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if _ok(v)], dtype="float64")


def _hodges_lehmann(ratios: np.ndarray, axis: int = -1) -> np.ndarray:
    """The median of all pairwise means (Walsh averages, i <= j) along ``axis``."""
    x = np.moveaxis(np.asarray(ratios), axis, -1)
    i, j = np.triu_indices(x.shape[-1])
    return np.median((x[..., i] + x[..., j]) / 2, axis=-1)


def _interval(ratios: np.ndarray, seed: int) -> tuple[float, float]:
    """The CONFIDENCE interval of the log ratios' Hodges-Lehmann estimate: a percentile
    bootstrap over the
    pairs, widened about the median by t(n-1) / z. With 8 to 30 pairs a bootstrap
    percentile interval is too narrow (it is the sample's own spread, which understates
    the population's); the t/z factor is the standard small-sample correction and brings
    the coverage back to what it says on generated data (bench/bench_confirm.py)."""
    from scipy.stats import bootstrap, norm, t

    if np.ptp(ratios) == 0:
        v = float(ratios[0])
        return v, v
    res = bootstrap(
        (ratios,),
        _hodges_lehmann,
        confidence_level=CONFIDENCE,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed),
        vectorized=True,
        axis=-1,
    )
    centre = float(_hodges_lehmann(ratios))
    q = (1 + CONFIDENCE) / 2
    widen = float(t.ppf(q, len(ratios) - 1) / norm.ppf(q))
    lo = centre - widen * (centre - float(res.confidence_interval.low))
    hi = centre + widen * (float(res.confidence_interval.high) - centre)
    return lo, hi


def _wilcoxon(ratios: np.ndarray) -> tuple[float, float, float]:
    """(two-sided, greater, less) Wilcoxon signed-rank p-values of the log ratios."""
    from scipy.stats import wilcoxon

    if not np.any(ratios):
        return 1.0, 1.0, 1.0
    out = []
    for alt in ("two-sided", "greater", "less"):
        out.append(float(wilcoxon(ratios, alternative=alt, zero_method="zsplit").pvalue))
    return out[0], out[1], out[2]


def _mwu(b: np.ndarray, h: np.ndarray) -> float:
    from scipy.stats import mannwhitneyu

    if len(b) < 1 or len(h) < 1:
        return 1.0
    return float(mannwhitneyu(h, b, alternative="two-sided").pvalue)


def _cliffs(b: np.ndarray, h: np.ndarray) -> float:
    """Cliff's delta of head over base: P(head > base) - P(head < base) over all pairs."""
    if not len(b) or not len(h):
        return math.nan
    diff = np.sign(h[:, None] - b[None, :])
    return float(diff.mean())
