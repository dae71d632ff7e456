"""Change points of one perf series: where its level moved, by how much, how surely.

A series is one metric of one cell over runs, oldest first. The detector answers, for
every change: the index of the first point at the new level, the points before and after
(n, mean, median, std), the relative change of the medians, the shift in units of the
series' own noise (``effect``) and a p-value. Like Apache Otava it is a small, pure
function of an array; the store and Airflow are elsewhere (``history.change_points.tracking``).

How it decides, and why each step is there:

1. **Noise scale from the series itself.** ``sigma`` is the median absolute deviation of
   differences between points (/ sqrt 2, x 1.4826: the Gaussian-consistent scale), the
   larger of neighbours and points ``noise_lag`` apart (at most an eighth of the series).
   Differences cancel the level, so a step barely moves it, and a median ignores
   outliers. The longer lag makes a series that wanders (drift, weekly cycles, noise that
   is correlated night to night) count its wandering as noise, instead of being cut into
   a staircase of "significant" steps; on white noise both lags agree. The root-mean-
   square of the (cleaned, clipped) neighbour differences is a floor: from 20 points, or
   with heavy tails, the median alone runs low. Every threshold below is in these sigmas,
   so a 5 % step is large in a 1 %-noise series and small in a 10 %-noise one.
2. **A lone point is never a change.** A point far (> ``outlier`` sigmas) from both its
   neighbours (the last point: from its one neighbour) is replaced by them before
   segmentation. A real step keeps a neighbour on its own level, so its points survive;
   a 6-sigma outlier does not. Reported statistics still use the raw values.
3. **Exact segmentation.** Optimal partitioning of the cleaned, standardised series under
   a squared-error cost plus a penalty of ``penalty * log(n)`` per change (a BIC-type
   penalty: published comparisons find binary segmentation and PELT with such a penalty
   the strongest default-parameter methods on annotated series, and E-divisive at its
   defaults weaker than reporting nothing). ``ruptures.Pelt(model="l2")`` solves the same
   problem and the tests check that both agree; it is not called here because it is a
   Python loop per candidate (about 1 s per 365-point series here, hours for the
   maintenance job's 10,000 series), while this is one NumPy pass over all series of a
   length at once (bench/bench_history.py).
4. **Otava-style merge.** Changes are then dropped weakest first, re-measuring the
   neighbours after each drop, while one fails: an interior segment shorter than
   ``min_size`` (a 2-night blip is not a level), a shift under ``min_effect`` sigmas or
   ``min_change`` relative, or a p-value over ``max_p``. A segment at the end of the series
   may be shorter, down to 2 points, only if it lies ``tail_guard`` sigmas away: two nights
   that far out are a breakage worth reporting at once, and the report moves or vanishes
   as later nights arrive (the detector is re-run on the whole window every time).

The p-value is the two-sided normal tail of the mean shift against the series' noise
(``math.erfc``; the same formula as ``scipy.stats.norm.sf``, without a call per change).
It does not correct for having searched every position: the penalty does that job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ChangePoint", "Detector", "Segment", "detect", "detect_many", "noise_sigma"]

# 1 / Phi^-1(3/4): turns a median absolute deviation into a Gaussian-consistent sigma.
_MAD_TO_SIGMA = 1.482602218505602
# A segment at the end with fewer points than this must look like a level, every point of
# it past the midpoint; with fewer than twice this, its newest point (see _beyond_midpoint).
_SHORT_TAIL = 4
# A series shorter than this is penalised as if it had this many points: its noise
# estimate, from a handful of differences, is too uncertain for the smaller penalty.
_MIN_PENALTY_N = 30


@dataclass(frozen=True)
class Detector:
    """The detector's settings; the defaults are what every suite gets (see BENCHMARKS.md
    for their false-positive rate and delay on generated perf series)."""

    penalty: float = 6.0  # per change, x log(n), in squared noise sigmas
    min_size: int = 3  # shortest segment inside the series
    tail_guard: float = 8.0  # sigmas a 2-point segment at the end must lie away
    min_effect: float = 1.0  # smallest shift reported, in noise sigmas
    min_change: float = 0.0  # smallest relative change reported (0.02 = 2 %)
    max_p: float = 1e-3
    outlier: float = 4.0  # a point this many sigmas from both neighbours is an outlier
    noise_lag: int = 14  # sigma also from points this far apart: two weeks of nights
    # A floor under sigma, relative to the series' median level: a series of identical
    # values has no noise to scale by, and any difference would be infinitely significant.
    min_relative_sigma: float = 1e-4

    def __post_init__(self) -> None:
        if self.min_size < 2:
            raise ValueError(f"min_size must be >= 2, got {self.min_size}")
        for name in ("penalty", "tail_guard", "outlier"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.max_p <= 1:
            raise ValueError(f"max_p must be in (0, 1], got {self.max_p}")


DEFAULT = Detector()


@dataclass(frozen=True)
class Segment:
    """The raw points on one side of a change (up to the neighbouring change)."""

    n: int
    mean: float
    median: float
    std: float

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "mean": self.mean, "median": self.median, "std": self.std}


@dataclass(frozen=True)
class ChangePoint:
    index: int  # 0-based position of the first point of the new segment
    before: Segment
    after: Segment
    change: float  # after.median / before.median - 1
    effect: float  # shift of the (cleaned) means in noise sigmas, signed
    p_value: float
    sigma: float  # the series' noise scale, in the series' unit

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "before": self.before.as_dict(),
            "after": self.after.as_dict(),
            "change": self.change,
            "effect": self.effect,
            "p_value": self.p_value,
        }


def detect(values: Sequence[float] | np.ndarray, detector: Detector = DEFAULT) -> list[ChangePoint]:
    """The change points of one series (finite values, oldest first), earliest first."""
    return detect_many([values], detector)[0]


def detect_many(
    series: Sequence[Sequence[float] | np.ndarray], detector: Detector = DEFAULT
) -> list[list[ChangePoint]]:
    """``detect`` for many series at once: series of one length are segmented together
    in one vectorised pass. Series shorter than 3 points have no change points."""
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    for i, a in enumerate(arrays):
        if a.ndim != 1 or not np.isfinite(a).all():
            raise ValueError(f"series {i}: values must be a 1-d array of finite numbers")
    out: list[list[ChangePoint]] = [[] for _ in arrays]
    by_len: dict[int, list[int]] = {}
    for i, a in enumerate(arrays):
        if a.size >= 3:
            by_len.setdefault(a.size, []).append(i)
    for n, idx in by_len.items():
        raw = np.stack([arrays[i] for i in idx])
        sigma = _noise_sigma(raw, detector.min_relative_sigma, detector.noise_lag)
        clean = _replace_outliers(raw, sigma, detector.outlier)
        sigma = np.maximum(sigma, _spread_sigma(clean, sigma))
        z = clean / sigma[:, None]
        beta = detector.penalty * math.log(max(n, _MIN_PENALTY_N))
        last = _optimal_partition(z, beta, min_size=2)
        for row, i in enumerate(idx):
            cps = _backtrack(last[row], n)
            out[i] = _merge(raw[row], z[row], cps, float(sigma[row]), detector)
    return out


def noise_sigma(values: Sequence[float] | np.ndarray, detector: Detector = DEFAULT) -> float:
    """The noise scale ``detect`` measures a series' shifts in (step 1 of the module doc),
    for callers that judge one new point against the series (``history.retests.confirm``)."""
    raw = np.asarray(values, dtype=np.float64)[None, :]
    sigma = _noise_sigma(raw, detector.min_relative_sigma, detector.noise_lag)
    clean = _replace_outliers(raw, sigma, detector.outlier)
    return float(np.maximum(sigma, _spread_sigma(clean, sigma))[0])


# -- the steps ------------------------------------------------------------------------------


def _noise_sigma(x: np.ndarray, min_relative: float, lag: int = 1) -> np.ndarray:
    """Per row: 1.4826 * MAD(x[t+k] - x[t]) / sqrt(2), the larger of k = 1 and k = lag
    (at most an eighth of the series), floored (see Detector.min_relative_sigma)."""
    sigma = np.zeros(x.shape[0])
    for k in {1, max(1, min(lag, x.shape[1] // 16))}:
        d = x[:, k:] - x[:, :-k]
        mad = np.median(np.abs(d - np.median(d, axis=1, keepdims=True)), axis=1)
        sigma = np.maximum(sigma, _MAD_TO_SIGMA * mad / math.sqrt(2))
    floor = np.maximum(min_relative * np.abs(np.median(x, axis=1)), 1e-12)
    return np.maximum(sigma, floor)


def _spread_sigma(clean: np.ndarray, robust: np.ndarray) -> np.ndarray:
    """The root-mean-square of the first differences of the cleaned series, each clipped
    at 3 robust sigmas (so a step counts as one ordinary difference, not as noise), / sqrt 2.

    The median-based sigma is robust but, from 20 or 60 points, easily 30 % low; and with
    heavy-tailed noise it measures the bulk, not the spread that drives a segment mean.
    Taking the larger of the two keeps short series and heavy tails from turning noise
    into "significant" shifts; on clean Gaussian noise both agree.
    """
    d = np.diff(clean, axis=1)
    cap = (3 * math.sqrt(2) * robust)[:, None]
    d = np.clip(d, -cap, cap)
    return np.sqrt(np.mean(d * d, axis=1) / 2)


def _replace_outliers(x: np.ndarray, sigma: np.ndarray, k: float) -> np.ndarray:
    """Runs of one or two points that lie more than k sigmas, on the same side, from the
    level on both sides of them (the median of up to 3 points each side), where those two
    levels agree within k sigmas, take that level. A real step has a different level on
    each side, so it is never touched. A run at the end has no later side and is kept."""
    b, n = x.shape
    lim = (k * sigma)[:, None]
    pad = np.full((b, 3), np.nan)
    padded = np.concatenate([pad, x, pad], axis=1)  # x[j] is padded[j + 3]
    windows = np.lib.stride_tricks.sliding_window_view(padded, 3, axis=1)
    with np.errstate(all="ignore"), _quiet_nan_warnings():
        med3 = np.nanmedian(windows, axis=2)  # med3[j] = median of padded[j:j+3]
    out = x.copy()
    idx = np.arange(n)
    for r in (1, 2):
        if n < r + 1:
            continue
        start = idx[: n - r + 1]
        left = med3[:, start]  # the 3 points before the run: padded[i:i+3] = x[i-3:i]
        right = med3[:, start + r + 3]  # the 3 points after it: x[i+r:i+r+3]
        run = np.stack([x[:, start + j] for j in range(r)])  # (r, b, starts)
        at_end = start + r == n
        level = np.where(np.isnan(left), right, np.where(np.isnan(right), left, (left + right) / 2))
        dl = run - left
        dr = run - right
        far_left = np.isnan(left) | (np.abs(dl) > lim).all(axis=0)
        far_right = np.isnan(right) | (np.abs(dr) > lim).all(axis=0)
        sign = np.sign(run - level)
        same_side = (sign == sign[0]).all(axis=0)
        agree = np.isnan(left) | np.isnan(right) | (np.abs(left - right) <= lim)
        hit = far_left & far_right & same_side & agree & ~(np.isnan(left) & np.isnan(right))
        if r == 1:
            # A lone point must also stand apart from its immediate neighbours: the first
            # point of a new level at the end has the level's median against it, not its
            # neighbour.
            near = np.zeros_like(hit)
            near[:, 1:] |= np.abs(x[:, 1:] - x[:, :-1]) <= lim
            near[:, :-1] |= np.abs(x[:, :-1] - x[:, 1:]) <= lim
            hit &= ~near
        # A run at the end is left to the merge, which never takes one point for a level
        # and judges a 2-point tail: its only context is the points before it, which may
        # hold a blip the run returned from.
        hit &= ~at_end
        rows, cols = np.nonzero(hit)
        for j in range(r):
            out[rows, start[cols] + j] = level[rows, cols]
    return out


class _quiet_nan_warnings:
    """nanmedian of an all-NaN window (the edges) warns; the NaN it returns is handled."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def _optimal_partition(z: np.ndarray, beta: float, *, min_size: int) -> np.ndarray:
    """Optimal partitioning (Jackson et al.) of every row of ``z`` under squared error plus
    ``beta`` per segment; returns, per row and end t, the start of the last segment."""
    b, n = z.shape
    s1 = np.zeros((b, n + 1))
    s2 = np.zeros((b, n + 1))
    np.cumsum(z, axis=1, out=s1[:, 1:])
    np.cumsum(z * z, axis=1, out=s2[:, 1:])
    f = np.full((b, n + 1), np.inf)
    f[:, 0] = -beta
    last = np.zeros((b, n + 1), dtype=np.int32)
    rows = np.arange(b)
    for t in range(min_size, n + 1):
        best = s2[:, t] - s1[:, t] ** 2 / t  # one segment from 0: F(0) + beta cancel out
        arg = np.zeros(b, dtype=np.int32)
        hi = t - min_size
        if hi >= min_size:
            cand = slice(min_size, hi + 1)
            d1 = s1[:, t, None] - s1[:, cand]
            length = np.arange(t - min_size, t - hi - 1, -1, dtype=np.float64)
            total = f[:, cand] + (s2[:, t, None] - s2[:, cand]) - d1 * d1 / length + beta
            j = np.argmin(total, axis=1)
            v = total[rows, j]
            better = v < best
            best = np.where(better, v, best)
            arg = np.where(better, j + min_size, arg).astype(np.int32)
        f[:, t] = best
        last[:, t] = arg
    return last


def _backtrack(last: np.ndarray, n: int) -> list[int]:
    cps = []
    t = n
    while t > 0:
        s = int(last[t])
        if s > 0:
            cps.append(s)
        t = s
    return sorted(cps)


def _merge(
    raw: np.ndarray, z: np.ndarray, cps: list[int], sigma: float, det: Detector
) -> list[ChangePoint]:
    """Drop the weakest failing change until every one stands (module docstring, 4)."""
    n = z.size
    cps = list(cps)
    while cps:
        bounds = [0, *cps, n]
        worst, worst_stat = None, math.inf
        for k, cp in enumerate(cps):
            a, b = bounds[k], bounds[k + 2]
            n1, n2 = cp - a, b - cp
            shift = float(z[cp:b].mean() - z[a:cp].mean())
            stat = abs(shift) / math.sqrt(1 / n1 + 1 / n2)
            tail = b == n
            short = n1 < det.min_size or (n2 < det.min_size and not tail)
            fails = (
                short
                or n2 < 2
                or (tail and n2 < det.min_size and abs(shift) < det.tail_guard)
                or (tail and n2 < _SHORT_TAIL and not _beyond_midpoint(z, a, cp, b, cp))
                or (tail and n2 < 2 * _SHORT_TAIL and not _beyond_midpoint(z, a, cp, b, b - 1))
                or abs(shift) < det.min_effect
                or _p_value(stat) > det.max_p
                or abs(_relative(raw[a:cp], raw[cp:b])) < det.min_change
            )
            if fails and stat < worst_stat:
                worst, worst_stat = k, stat
        if worst is None:
            break
        del cps[worst]
    bounds = [0, *cps, n]
    out = []
    for k, cp in enumerate(cps):
        a, b = bounds[k], bounds[k + 2]
        n1, n2 = cp - a, b - cp
        shift = float(z[cp:b].mean() - z[a:cp].mean())
        out.append(
            ChangePoint(
                index=cp,
                before=_segment(raw[a:cp]),
                after=_segment(raw[cp:b]),
                change=_relative(raw[a:cp], raw[cp:b]),
                effect=shift,
                p_value=_p_value(abs(shift) / math.sqrt(1 / n1 + 1 / n2)),
                sigma=sigma,
            )
        )
    return out


def _beyond_midpoint(z: np.ndarray, a: int, cp: int, b: int, first: int) -> bool:
    """Every point of ``z[first:b]`` is nearer the new level (after ``cp``) than the old
    one (``a``..``cp``). For a short segment at the end: all its points (a 2-point blip
    and one ordinary point have the blip's strength but not this shape), and for a longer
    one the newest point (a level the series has already left is not reported)."""
    m0, m1 = float(z[a:cp].mean()), float(z[cp:b].mean())
    mid = (m0 + m1) / 2
    pts = z[first:b]
    return bool((pts > mid).all() if m1 > m0 else (pts < mid).all())


def _p_value(z: float) -> float:
    return math.erfc(z / math.sqrt(2))


def _relative(before: np.ndarray, after: np.ndarray) -> float:
    m0 = float(np.median(before))
    m1 = float(np.median(after))
    if m0 == 0:
        return math.inf if m1 != 0 else 0.0
    return m1 / m0 - 1


def _segment(x: np.ndarray) -> Segment:
    return Segment(
        n=int(x.size),
        mean=float(x.mean()),
        median=float(np.median(x)),
        std=float(x.std(ddof=1)) if x.size > 1 else 0.0,
    )
