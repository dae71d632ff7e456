"""Which ops got slower between two builds: the op-level diff of their profiler traces.

A confirmed regression says "build X is 5 % slower". On-call's next question is where,
and the answer is in the traces the re-test kept: several profiled samples per build,
interleaved with the other build's (``backends/interleave.py``), each aggregated to self
time per op per step (``history.culprits.op_trace``) and compared op by op.

Why several samples, each kept whole. One trace on a busy host can be a few percent slower
than the next for reasons that belong to no build (another job, a warmer cache, a clock),
and one op of it can be slower still. With one trace per build that noise decides the
blame. So every number here is a mean over the build's *samples* (traces), and its 95 %
interval comes from the spread between them: Welch's two-sample t interval, with the
delta method (linearised per sample) for the shares, which are ratios. Why not the paired
method the timed re-test uses: every sample is first divided by its own host scale (below),
which removes what pairing removes, and the unpaired form still works when one sample of a
build failed and the counts differ. Why not a bootstrap: with 3 samples per build a
bootstrap has 10 distinct resamples and its percentile interval is too narrow by about
(n-1)/n in variance; the t quantile with Welch's degrees of freedom is honest at n = 3.
A build with one trace only (an older re-test) is split into ``FALLBACK_BLOCKS`` runs of
consecutive steps that stand in for samples; its intervals then miss a disturbance that
lasted the whole trace, and the diff says so (``samples_from == "steps"``).

Host scale. Each sample's per-op means are divided by its scale ``s_j``: the median over ops
of the op's ratio to its median over all samples (each op one vote, so one op that changed
cannot move it; ops under ``DRIFT_MIN_SHARE`` of the step are timer noise and left out).
An op's **excess** is what it changed beyond that scale; the regression the shares divide
is the ops' summed excess. The build-level **drift** (the new build's scales over the base
build's, with its interval) is what every op changed alike: a slower runtime or clock.

Host interruptions and intermittent slow paths. A busy host interrupts steps for a
scheduler slice, and the time lands in whichever op ran; so an op's value in a sample is
its median step (``_typical``), which up to half the steps interrupted do not move. Nothing
is dropped from what is reported: the step time's change and each op's
``mean_delta_us`` are plain means over every step. A slow path taken in fewer than half
the steps (a recompile, an occasional sync) does not move the median either: it gets its
own rows (``TailDelta``): per op, the share of steps slower than ``SLOW_FACTOR`` x the op's
base median and the 90th percentile, compared across the samples; a tail row is a finding
when the slow share rose by at least ``MIN_SLOW_SHARE`` with its lower bound above zero at
the Bonferroni-corrected level (40 ops tested, so one chance finding per diff is not
allowed), the new build still takes the fast path in most steps (``MAX_SLOW_SHARE``), and
the op takes at least ``TAIL_MIN_US`` in a typical base step.
Its variance is quasi-binomial (``_slow_var``).

Verdicts, by intervals:

``op``             the first op's share interval lies above every other op's, its lower
                   bound is at least ``CAUSE_SHARE``, and no other op with at least
                   ``OTHER_SHARE`` of it is beyond its noise (Bonferroni over the ops);
``spread``         the drift is above zero and explains at least ``CAUSE_SHARE`` of the
                   regression (drift x base ops + summed excess);
``several``        the summed excess is above zero, no op clears the rest;
``intermittent``   none of the above, but a slow-step row is a finding;
``no_regression``  neither the summed excess nor the drift is above zero: the traces show
                   no regression beyond their noise (not decided, not "no change").

bench/bench_profile_diff.py measures, on generated samples from a noisy host, how often
a slowed op is named with a share interval that covers the truth, how often an unchanged
op is credited, and how often an intermittent slow path is found.

Pure functions over ``OpProfile`` frames; nothing here reads a store or a file except
``diff_traces``, which catches the one error a bad trace gives and returns it as text:
the change's verdict stands without the diff.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy import stats

from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.history.culprits.op_trace import (
    NESTED_CHILD,
    NESTED_PARENT,
    OpProfile,
    TraceError,
    read_profile,
)

__all__ = [
    "CAUSE_SHARE",
    "DiffOutcome",
    "OpDelta",
    "ProfileDiff",
    "TailDelta",
    "diff_profiles",
    "diff_traces",
]

# The first op is named the cause when its share's lower bound is at least this.
CAUSE_SHARE = 0.5
# ... and no other op is beyond its noise with at least this share (a wrapper op whose own
# 2 % grew with the op it wraps is beyond its noise, and rightly not a second cause).
OTHER_SHARE = 0.1
# Two-sided level of every interval.
LEVEL = 0.95
# The host scale of a sample is the median of the ops' ratios over ops with at least this
# share of the step (µs-long ops' ratios are mostly timer noise) ...
DRIFT_MIN_SHARE = 0.001
# ... and at least this many of them; with fewer, every scale is 1.
DRIFT_MIN_OPS = 5
# A build with fewer than 2 samples has its steps split into this many blocks.
FALLBACK_BLOCKS = 3
# A sample's mean of an op is never taken as more precise than this fraction of it
# (identical samples, or a constant op, would give a zero variance).
MIN_REL_SD = 0.002
# An op's slow steps are read only when its typical base step takes at least this (µs):
# below it, "1.5x slower" is the profiler's per-call cost and the timer's resolution.
TAIL_MIN_US = 5.0
# A step of an op is "slow" above this multiple of the op's median in the base build ...
SLOW_FACTOR = 1.5
# ... and a rise in the share of slow steps is a finding from this size on, while the new
# build is slow in at most this share (beyond it the op is slower, not intermittently).
MIN_SLOW_SHARE = 0.05
MAX_SLOW_SHARE = 0.75
TAIL_QUANTILE = 0.9

Verdict = Literal["op", "spread", "several", "intermittent", "no_regression"]
Status = Literal["changed", "new", "gone"]


@dataclass(frozen=True)
class OpDelta:
    """One op (name, input shapes, where it ran) in both builds, per step (means over the
    samples; intervals are 95 % across them)."""

    op: str
    shapes: str
    where: str
    base_us: float  # self time of a typical step (``_typical``), base build, mean of samples
    new_us: float  # ... in the new (culprit) build's
    delta_us: float  # new - base
    delta_pct: float | None  # None for an op new in the culprit
    excess_us: float  # the change beyond each sample's host scale: the ranking key
    share: float | None  # excess / the ops' summed excess; None unless that is beyond 0
    z: float  # excess / its standard error
    status: Status
    calls_base: float  # calls per step
    calls_new: float
    excess_lo: float = math.nan
    excess_hi: float = math.nan
    share_lo: float | None = None
    share_hi: float | None = None
    mean_delta_us: float = math.nan  # the change of the plain mean over every step
    # For an op new in the culprit (or gone from it): the ops it calls, whose self time
    # inside it is in this row (its inclusive time), not in theirs.
    children: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: ``aten::addmm self time +1.90 ms [+1.60, +2.20] per step (+38 %),
        71 % [60, 82] of the regression`` or ``aten::bmm new in the culprit, 0.40 ms per
        step``."""
        name = self.op + (f" {self.shapes}" if self.shapes else "")
        if self.where != "cpu":
            name += f" ({self.where})"
        if self.children:
            more = f" and {len(self.children) - 3} more" if len(self.children) > 3 else ""
            name += f" (with the ops it calls: {', '.join(self.children[:3])}{more})"
        if self.status == "new":
            text = f"{name} new in the culprit, {_ms(self.new_us)} per step"
        elif self.status == "gone":
            text = f"{name} gone from the culprit, was {_ms(self.base_us)} per step"
        else:
            pct = f" ({self.delta_pct:+.0%})" if self.delta_pct is not None else ""
            text = f"{name} self time {_ms(self.excess_us, sign=True)}"
            if math.isfinite(self.excess_lo):
                text += f" [{self.excess_lo / 1000:+.2f}, {self.excess_hi / 1000:+.2f}]"
            text += f" per step{pct}"
        if self.share is not None:
            text += f", {self.share:.0%}"
            if self.share_lo is not None and self.share_hi is not None:
                text += f" [{self.share_lo:.0%}, {self.share_hi:.0%}]"
            text += " of the regression"
        return text


@dataclass(frozen=True)
class TailDelta:
    """An op's slow steps in both builds: the share of steps above ``SLOW_FACTOR`` x its
    base median (``threshold_us``) and its 90th percentile per step."""

    op: str
    shapes: str
    where: str
    threshold_us: float
    base_slow: float  # share of steps over the threshold, mean over the samples
    new_slow: float
    slow_lo: float  # 95 % interval of new_slow - base_slow
    slow_hi: float
    base_p90_us: float
    new_p90_us: float
    finding: bool  # the rise is beyond the noise of every op tested (Bonferroni)

    def describe(self) -> str:
        name = self.op + (f" {self.shapes}" if self.shapes else "")
        return (
            f"{name} slow (> {_ms(self.threshold_us)}) in {self.new_slow:.0%} of steps, was "
            f"{self.base_slow:.0%} (+{self.slow_lo:.0%} to +{self.slow_hi:.0%}); "
            f"p90 {_ms(self.base_p90_us)} -> {_ms(self.new_p90_us)}"
        )


@dataclass(frozen=True)
class ProfileDiff:
    """The op-level diff of a base and a new build's samples (see the module's docstring)."""

    base_source: str
    new_source: str
    base_steps: int
    new_steps: int
    base_step_us: float  # mean step time, every step
    new_step_us: float
    delta_step_us: float
    delta_step_pct: float
    base_ops_us: float  # the ops' self time per step, summed (host and device)
    delta_ops_us: float  # the ops' summed excess: the regression the rows' shares divide
    drift: float  # the new build's host scale over the base's, - 1
    verdict: Verdict
    rows: list[OpDelta] = field(default_factory=list)  # see diff_profiles' ranking
    base_peak_memory_bytes: float | None = None
    new_peak_memory_bytes: float | None = None
    base_samples: int = 1
    new_samples: int = 1
    samples_from: Literal["traces", "steps"] = "traces"
    delta_step_lo: float = math.nan
    delta_step_hi: float = math.nan
    delta_ops_lo: float = math.nan
    delta_ops_hi: float = math.nan
    drift_lo: float = math.nan
    drift_hi: float = math.nan
    tails: list[TailDelta] = field(default_factory=list)  # findings first

    @property
    def cause(self) -> OpDelta | None:
        return self.rows[0] if self.verdict == "op" and self.rows else None

    @property
    def new_ops(self) -> list[OpDelta]:
        return [r for r in self.rows if r.status == "new"]

    @property
    def gone_ops(self) -> list[OpDelta]:
        return [r for r in self.rows if r.status == "gone"]

    @property
    def findings(self) -> list[TailDelta]:
        """The intermittent slow paths beyond their noise."""
        return [t for t in self.tails if t.finding]

    def top(self, n: int = 3) -> list[OpDelta]:
        """The first ``n`` rows that got slower (excess > 0)."""
        return [r for r in self.rows if r.excess_us > 0][:n]

    def summary(self) -> str:
        """The sentence for the alert, then the top 3 ops and the slow-path findings."""
        step = f"step {_ms(self.delta_step_us, sign=True)} ({self.delta_step_pct:+.1%}"
        if math.isfinite(self.delta_step_lo) and self.base_step_us > 0:
            lo, hi = self.delta_step_lo / self.base_step_us, self.delta_step_hi / self.base_step_us
            step += f" [{lo:+.1%}, {hi:+.1%}]"
        step += ")"
        n = f"{self.base_samples}+{self.new_samples} " + (
            "profiled samples" if self.samples_from == "traces" else "blocks of one trace each"
        )
        if self.verdict == "no_regression":
            head = f"{step}: the traces show no regression beyond their noise ({n})."
        elif self.verdict == "op":
            head = f"{step}: one op explains most of it ({n})."
        elif self.verdict == "intermittent":
            head = f"{step}: an op is slow in some steps only ({n})."
        elif self.verdict == "spread":
            head = (
                f"{step}: spread over every op (all about {self.drift:+.1%} "
                f"[{self.drift_lo:+.1%}, {self.drift_hi:+.1%}]), no single op; "
                f"a slower machine, clock or runtime looks like this ({n})."
            )
        else:
            head = f"{step}: several ops, none clears the others ({n})."
        lines = [head] + [f"  {r.describe()}" for r in self.top(3)]
        lines += [f"  intermittent: {t.describe()}" for t in self.findings[:3]]
        if self.base_peak_memory_bytes is not None and self.new_peak_memory_bytes is not None:
            d = self.new_peak_memory_bytes - self.base_peak_memory_bytes
            lines.append(f"  peak memory {d / 2**20:+.1f} MiB")
        return "\n".join(lines)

    def as_json(self, top: int = 10) -> JsonObject:
        """A JSON-ready dict with the first ``top`` rows, every new/gone op among the first
        50, and the tail rows that are findings (what the store keeps and
        ``changepoints --json`` prints); NaN bounds become None."""
        out = asdict(self)
        keep = self.rows[:top] + [
            r for r in self.rows[top:50] if r.status != "changed" and r.excess_us > 0
        ]
        out["rows"] = [asdict(r) for r in keep]
        out["tails"] = [asdict(t) for t in self.findings]
        out["cause"] = asdict(self.cause) if self.cause else None
        return _no_nan(out)


@dataclass(frozen=True)
class DiffOutcome:
    """``diff_traces``' answer: the diff, or the one message saying why there is none."""

    diff: ProfileDiff | None
    error: str | None = None


def diff_traces(
    base: Path | str | Sequence[Path | str], new: Path | str | Sequence[Path | str]
) -> DiffOutcome:
    """Read and diff the traces of two builds (a file, or one per profiled sample); a trace
    that cannot be read gives ``error`` (one line naming the file and what is wrong)
    instead of raising, so the caller's verdict stands without the diff. Each trace is
    read and aggregated before the next (peak memory: one trace's events)."""

    def read(paths: Path | str | Sequence[Path | str]) -> list[OpProfile]:
        return [read_profile(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]

    try:
        return DiffOutcome(diff_profiles(read(base), read(new)))
    except TraceError as e:
        return DiffOutcome(None, f"no op-level diff: {e}")


def diff_profiles(
    base: OpProfile | Sequence[OpProfile], new: OpProfile | Sequence[OpProfile]
) -> ProfileDiff:
    """Compare ``new`` (the culprit's samples) with ``base`` (the last good build's)."""
    a_list = [base] if isinstance(base, OpProfile) else list(base)
    b_list = [new] if isinstance(new, OpProfile) else list(new)
    if not a_list or not b_list:
        raise TraceError("an op diff needs at least one trace of each build")
    if any(p.n_steps == 0 for p in a_list + b_list):
        raise TraceError("an op diff needs at least one profiled step in each trace")
    a_list, b_list, rolled = _roll_in_children(a_list, b_list)
    keys = _keys(a_list + b_list)
    from_steps = len(a_list) < 2 or len(b_list) < 2
    a_mats = _samples(a_list, keys)
    b_mats = _samples(b_list, keys)
    k_a, k_b = len(a_mats), len(b_mats)
    mats = a_mats + b_mats
    m = np.stack([_typical(x) for x, _, _ in mats], axis=1)  # op x sample, µs/step
    plain = np.stack([x.mean(axis=1) for x, _, _ in mats], axis=1)
    calls = np.stack([c for _, c, _ in mats], axis=1)
    step_t = np.array([t.mean() for _, _, t in mats])
    ia, ib = slice(0, k_a), slice(k_a, k_a + k_b)

    scale = _scales(m)
    n = m / scale[None, :]
    tot = n.sum(axis=0)
    mean_a, mean_b = m[:, ia].mean(axis=1), m[:, ib].mean(axis=1)
    excess = n[:, ib].mean(axis=1) - n[:, ia].mean(axis=1)
    floor = (MIN_REL_SD * n) ** 2
    se_e, df_e = _welch(n[:, ia], n[:, ib], floor[:, ia], floor[:, ib])
    d_total = float(excess.sum())
    se_t, df_t = _welch(tot[None, ia], tot[None, ib])
    t_tot = _tq(df_t[0])
    lo_total, hi_total = d_total - t_tot * se_t[0], d_total + t_tot * se_t[0]
    # Shares, linearised per sample (delta method): share = e / R, so a sample's influence
    # is (n_op - share x total) / R. Only when R's interval is above zero: otherwise the
    # ratio's confidence set is unbounded (Fieller) and any share, 43 % or 300 %, is noise.
    if lo_total > 0:
        share = excess / d_total
        infl = (n - share[:, None] * tot[None, :]) / d_total
        se_s, df_s = _welch(infl[:, ia], infl[:, ib])
        t_s = _tq(df_s)
        share_lo, share_hi = share - t_s * se_s, share + t_s * se_s
    else:
        share = share_lo = share_hi = None
    t_e = _tq(df_e)
    z = excess / np.maximum(se_e, 1e-12)
    lo_e, hi_e = excess - t_e * se_e, excess + t_e * se_e

    log_s = np.log(scale)
    se_d, df_d = _welch(log_s[None, ia], log_s[None, ib])
    dlog = float(log_s[ib].mean() - log_s[ia].mean())
    t_d = _tq(df_d[0])
    drift, drift_lo, drift_hi = (
        math.expm1(x) for x in (dlog, dlog - t_d * se_d[0], dlog + t_d * se_d[0])
    )
    base_total = float(n[:, ia].mean(axis=1).sum())

    se_step, df_step = _welch(step_t[None, ia], step_t[None, ib])
    t_a, t_b = float(step_t[ia].mean()), float(step_t[ib].mean())
    d_t = t_b - t_a
    t_st = _tq(df_step[0])

    # Ranked: when the traces decide the regression (its interval above zero), the ops
    # whose change is beyond their noise first, then the rest, each by excess. When they
    # do not, nothing is "beyond noise" in a sense worth ranking by: of 40 ops two pass a
    # 95 % interval by chance, and a µs-long op a fifth slower, held by a tight interval,
    # would head the list above a matmul whose +0.5 ms spans zero; the rows are then by
    # excess alone, and the verdict says the traces decided nothing.
    plain_delta = plain[:, ib].mean(axis=1) - plain[:, ia].mean(axis=1)
    order = (
        np.lexsort((-excess, ~(lo_e > 0))) if lo_total > 0 else np.argsort(-excess, kind="stable")
    )
    names = list(keys)
    rows = []
    for i in order:
        status: Status = "new" if mean_a[i] == 0 else "gone" if mean_b[i] == 0 else "changed"
        rows.append(
            OpDelta(
                op=names[i][0],
                shapes=names[i][1],
                where=names[i][2],
                base_us=float(mean_a[i]),
                new_us=float(mean_b[i]),
                delta_us=float(mean_b[i] - mean_a[i]),
                delta_pct=float(mean_b[i] / mean_a[i] - 1) if mean_a[i] > 0 else None,
                mean_delta_us=float(plain_delta[i]),
                excess_us=float(excess[i]),
                share=None if share is None else float(share[i]),
                z=float(z[i]),
                status=status,
                calls_base=float(calls[i, ia].mean()),
                calls_new=float(calls[i, ib].mean()),
                excess_lo=float(lo_e[i]),
                excess_hi=float(hi_e[i]),
                share_lo=None if share_lo is None else float(share_lo[i]),
                share_hi=None if share_hi is None else float(share_hi[i]),
                children=tuple(rolled.get(names[i], ())),
            )
        )
    # Bonferroni over the ops: is any op beside the first beyond its noise?
    t_bonf = _tq(df_e, level=1 - (1 - LEVEL) / max(len(keys), 1))
    beyond = excess - t_bonf * se_e > 0
    verdict = _verdict(rows, order, beyond, (lo_total, d_total), (drift_lo, drift), base_total)
    tails = _tails(keys, mats, k_a, scale)
    if verdict == "no_regression" and any(t.finding for t in tails):
        verdict = "intermittent"
    return ProfileDiff(
        base_source=", ".join(p.source for p in a_list),
        new_source=", ".join(p.source for p in b_list),
        base_steps=sum(p.n_steps for p in a_list),
        new_steps=sum(p.n_steps for p in b_list),
        base_step_us=t_a,
        new_step_us=t_b,
        delta_step_us=d_t,
        delta_step_pct=d_t / t_a if t_a > 0 else math.nan,
        base_ops_us=base_total,
        delta_ops_us=d_total,
        drift=drift,
        verdict=verdict,
        rows=rows,
        base_peak_memory_bytes=_peak(a_list),
        new_peak_memory_bytes=_peak(b_list),
        base_samples=k_a,
        new_samples=k_b,
        samples_from="steps" if from_steps else "traces",
        delta_step_lo=d_t - t_st * float(se_step[0]),
        delta_step_hi=d_t + t_st * float(se_step[0]),
        delta_ops_lo=lo_total,
        delta_ops_hi=hi_total,
        drift_lo=drift_lo,
        drift_hi=drift_hi,
        tails=tails,
    )


def _verdict(
    rows: list[OpDelta],
    order: np.ndarray,
    beyond: np.ndarray,
    total: tuple[float, float],
    drift: tuple[float, float],
    base_total: float,
) -> Verdict:
    lo_total, d_total = total
    drift_lo, d = drift
    common = d * base_total
    if drift_lo > 0 and common >= CAUSE_SHARE * (common + max(d_total, 0.0)):
        return "spread"
    if lo_total <= 0 or not rows or d_total <= 0:
        return "no_regression"
    first = rows[0]
    others = rows[1:]
    if (
        first.share_lo is not None
        and first.share_lo >= CAUSE_SHARE
        and all(r.share_hi is None or r.share_hi < first.share_lo for r in others)
        and not any(
            b and r.share is not None and r.share >= OTHER_SHARE
            for b, r in zip(beyond[order[1:]], others, strict=True)
        )
    ):
        return "op"
    return "several"


def _roll_in_children(
    base: list[OpProfile], new: list[OpProfile]
) -> tuple[list[OpProfile], list[OpProfile], dict[tuple[str, str, str], list[str]]]:
    """An op new in the culprit (in no base sample), and one gone from it, takes in the
    self time of the ops it calls: one row, "aten::bmm (with the ops it calls) new",
    holds what the new code costs, and an op that did not change is not credited with
    the time it spends inside the new one (aten::mm called by a new aten::bmm would
    otherwise read as aten::mm slower). Only the outermost such op takes its children in
    (a new op inside a new op is one of its children). Returns the profiles with their
    ``ops`` so adjusted and, per op that took children in, their names."""
    keys_of = [set(_keys([p])) for p in (*base, *new)]
    in_base = set().union(*keys_of[: len(base)])
    in_new = set().union(*keys_of[len(base) :])
    rolled: dict[tuple[str, str, str], list[str]] = {}
    out = []
    for group, only in ((base, in_base - in_new), (new, in_new - in_base)):
        done = []
        for p in group:
            done.append(_roll(p, only, rolled) if only and p.nested is not None else p)
        out.append(done)
    return out[0], out[1], {k: sorted(set(v)) for k, v in rolled.items()}


def _roll(
    p: OpProfile,
    only: set[tuple[str, str, str]],
    rolled: dict[tuple[str, str, str], list[str]],
) -> OpProfile:
    """``p`` with the children's self time inside each outermost op of ``only`` moved into
    that op's row (see ``_roll_in_children``)."""
    import pandas as pd

    nested = p.nested
    assert nested is not None
    parent = list(nested[list(NESTED_PARENT)].itertuples(index=False, name=None))
    child = list(nested[list(NESTED_CHILD)].itertuples(index=False, name=None))
    inner = {c for a, c in zip(parent, child, strict=True) if a in only and c in only}
    outer = only - inner
    take = np.fromiter((a in outer for a in parent), dtype=bool, count=len(parent))
    if not take.any():
        return p
    moved = nested[take]
    for a, c in zip(
        (x for x, t in zip(parent, take, strict=True) if t),
        (x for x, t in zip(child, take, strict=True) if t),
        strict=True,
    ):
        rolled.setdefault(a, []).append(c[0])
    cols = ["step", "op", "shapes", "where"]
    # The time moves into the op; the calls leave the child (the op's calls are its own).
    into = moved.groupby(["step", *NESTED_PARENT], as_index=False)["self_us"].sum()
    into["gone_calls"] = 0
    out_of = (
        moved.groupby(["step", *NESTED_CHILD], as_index=False)[["self_us", "calls"]]
        .sum()
        .rename(
            columns={**dict(zip(NESTED_CHILD, NESTED_PARENT, strict=True)), "calls": "gone_calls"}
        )
    )
    out_of["self_us"] = -out_of["self_us"]
    delta = pd.concat([into, out_of], ignore_index=True).groupby(cols, as_index=False).sum()
    ops = p.ops.merge(delta.rename(columns={"self_us": "moved"}), on=cols, how="left")
    ops["self_us"] = (ops["self_us"] + ops["moved"].fillna(0.0)).clip(lower=0.0)
    ops["calls"] = (ops["calls"] - ops["gone_calls"].fillna(0).astype("int64")).clip(lower=0)
    # A child called only inside the new op leaves no row of its own (it is in that row).
    ops = ops[(ops["calls"] > 0) | ops["moved"].isna()].drop(columns=["moved", "gone_calls"])
    return OpProfile(
        source=p.source,
        steps=p.steps,
        ops=ops.reset_index(drop=True),
        peak_memory_bytes=p.peak_memory_bytes,
        nested=p.nested,
    )


def _keys(profiles: list[OpProfile]) -> dict[tuple[str, str, str], int]:
    """Every (op, shapes, where) in any sample, numbered."""
    cols = ["op", "shapes", "where"]
    index: dict[tuple[str, str, str], int] = {}
    for p in profiles:
        for k in p.ops[cols].drop_duplicates().itertuples(index=False, name=None):
            index.setdefault(k, len(index))
    return index


def _samples(
    profiles: list[OpProfile], keys: dict[tuple[str, str, str], int]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per sample: (self µs [op x step], calls per step [op], step durations [step]); a
    build with one trace gives ``FALLBACK_BLOCKS`` blocks of its steps (when it has at
    least 2 steps per block)."""
    out = [_matrix(p, keys) for p in profiles]
    if len(out) >= 2:
        return out
    m, c, t = out[0]
    blocks = min(FALLBACK_BLOCKS, m.shape[1] // 2)
    if blocks < 2:
        return out
    cuts = np.array_split(np.arange(m.shape[1]), blocks)
    return [(m[:, j], c, t[j]) for j in cuts]


def _matrix(
    p: OpProfile, keys: dict[tuple[str, str, str], int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cols = ["op", "shapes", "where"]
    steps = {s: j for j, s in enumerate(p.steps["step"].tolist())}
    m = np.zeros((len(keys), len(steps)))
    calls = np.zeros(len(keys))
    if len(p.ops):
        rows = np.fromiter(
            (keys[k] for k in p.ops[cols].itertuples(index=False, name=None)),
            dtype=np.int64,
            count=len(p.ops),
        )
        cols_ = np.fromiter((steps[s] for s in p.ops["step"]), dtype=np.int64)
        np.add.at(m, (rows, cols_), p.ops["self_us"].to_numpy(dtype="float64"))
        np.add.at(calls, rows, p.ops["calls"].to_numpy(dtype="float64"))
    return m, calls / max(len(steps), 1), p.steps["dur_us"].to_numpy(dtype="float64")


def _typical(x: np.ndarray) -> np.ndarray:
    """Per op (row): its self time in a typical step of one sample: the median over the
    steps for an op that ran in at least half of them, the mean for one that ran in fewer
    (its median would be 0).

    Why not the mean: on a busy host a step is now and then interrupted for a scheduler
    time slice (several ms; on the shared 2-core CI host, in a third to half of the steps
    of a 0.5 ms matmul, 3x its mean in one trace of the example), and the time lands in
    whichever op was running; the mean of one sample then moves more than the regression
    does, and no number of samples makes the interval useful. The median stays put with up
    to half the steps interrupted, and for symmetric jitter it is the mean. A lower
    quantile would hold with more steps interrupted (at load 10-12 on the 2 cores the
    median missed the example's doubled matmul in 2 of 3 trials, bench part 6), but it
    reads a change that scales the op (x 1.5) short by the op's spread below its mean,
    and the intervals then miss the planted change (tests/test_profile_samples.py). Nothing is dropped from what the diff reports: the step
    time and each op's ``mean_delta_us`` are plain means, and a slow path taken in fewer
    than half the steps, which the median does not see, is what the slow-step rows
    (``TailDelta``) are for."""
    ran = (x > 0).mean(axis=1)
    return np.where(ran >= 0.5, np.median(x, axis=1), x.mean(axis=1))


def _scales(m: np.ndarray) -> np.ndarray:
    """Each sample's host scale: the median over ops of its mean over the op's median
    across all samples, over ops above ``DRIFT_MIN_SHARE`` of the step that ran in every
    sample; 1 for every sample when fewer than ``DRIFT_MIN_OPS`` such ops."""
    ref = np.median(m, axis=1)
    ok = (ref > DRIFT_MIN_SHARE * ref.sum()) & (m > 0).all(axis=1)
    if ok.sum() < DRIFT_MIN_OPS:
        return np.ones(m.shape[1])
    return np.median(m[ok] / ref[ok, None], axis=0)


def _welch(
    a: np.ndarray,
    b: np.ndarray,
    floor_a: np.ndarray | None = None,
    floor_b: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the standard error of mean(b) - mean(a) and Welch's degrees of freedom.
    A row's per-sample variance is at least the mean of its ``floor``."""
    ka, kb = a.shape[1], b.shape[1]
    va = a.var(axis=1, ddof=1) if ka > 1 else np.zeros(a.shape[0])
    vb = b.var(axis=1, ddof=1) if kb > 1 else np.zeros(b.shape[0])
    if floor_a is not None and floor_b is not None:
        va = np.maximum(va, floor_a.mean(axis=1))
        vb = np.maximum(vb, floor_b.mean(axis=1))
    qa, qb = va / ka, vb / kb
    se = np.sqrt(qa + qb)
    den = qa**2 / max(ka - 1, 1) + qb**2 / max(kb - 1, 1)
    df = np.where(den > 0, (qa + qb) ** 2 / np.where(den > 0, den, 1.0), max(ka + kb - 2, 1))
    return se, np.maximum(df, 1.0)


def _tq(df: Any, level: float = LEVEL) -> Any:
    """The two-sided t quantile for ``level`` at ``df`` degrees of freedom."""
    return stats.t.ppf(0.5 + level / 2, df)


def _tails(
    keys: dict[tuple[str, str, str], int],
    mats: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    k_a: int,
    scale: np.ndarray,
) -> list[TailDelta]:
    """Per op that ran in the base build: the share of steps slower than ``SLOW_FACTOR`` x
    its base median (each sample's values divided by its host scale) and the p90, compared
    across samples; findings first, then by the rise. Only an op of at least
    ``TAIL_MIN_US`` in a typical base step can be a finding: a µs-long op's slow steps are
    the profiler's own per-call cost and the timer's resolution (a 1 µs view op is "1.5x
    slow" at 1.5 µs, and on a loaded host in half its steps)."""
    base = np.concatenate([x for x, _, _ in mats[:k_a]], axis=1)
    ran = base > 0
    med = np.array([np.median(r[g]) if g.any() else 0.0 for r, g in zip(base, ran, strict=True)])
    has = med >= TAIL_MIN_US
    if not has.any():
        return []
    thr = SLOW_FACTOR * med
    frac = np.stack(
        [((x / s) > thr[:, None]).mean(axis=1) for (x, _, _), s in zip(mats, scale, strict=True)],
        axis=1,
    )
    p90 = np.stack(
        [
            np.quantile(x / s, TAIL_QUANTILE, axis=1)
            for (x, _, _), s in zip(mats, scale, strict=True)
        ],
        axis=1,
    )
    steps = np.array([x.shape[1] for x, _, _ in mats], dtype=float)
    fa, fb = frac[:, :k_a], frac[:, k_a:]
    rise = fb.mean(axis=1) - fa.mean(axis=1)
    se = np.sqrt(_slow_var(fa, steps[:k_a]) + _slow_var(fb, steps[k_a:]))
    z95 = stats.norm.ppf(0.5 + LEVEL / 2)
    zb = stats.norm.ppf(1 - (1 - LEVEL) / 2 / int(has.sum()))
    # Intermittent: the new build still takes the fast path in most steps (an op slower in
    # every step is its mean's row, not a slow path).
    found = (
        has & (rise >= MIN_SLOW_SHARE) & (rise - zb * se > 0) & (fb.mean(axis=1) <= MAX_SLOW_SHARE)
    )
    lo, hi = rise - z95 * se, rise + z95 * se
    names = list(keys)
    out = [
        TailDelta(
            op=names[i][0],
            shapes=names[i][1],
            where=names[i][2],
            threshold_us=float(thr[i]),
            base_slow=float(fa[i].mean()),
            new_slow=float(fb[i].mean()),
            slow_lo=float(lo[i]),
            slow_hi=float(hi[i]),
            base_p90_us=float(p90[i, :k_a].mean()),
            new_p90_us=float(p90[i, k_a:].mean()),
            finding=bool(found[i]),
        )
        for i in np.lexsort((-rise, ~found))
        if has[i]
    ]
    return out


def _slow_var(frac: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per op: the variance of a build's mean share of slow steps (its samples' mean),
    quasi-binomial: the binomial variance of the pooled steps times the samples'
    over-dispersion (their chi-square over its degrees of freedom, at least 1).

    Why not Welch's t as for the means: with 3 samples per build and no slow step in the
    base (the usual case) the t quantile at 2-4 degrees of freedom, Bonferroni-corrected,
    is 10-30 and no intermittent path is ever found; the count of slow steps is binomial,
    whose variance is known from the steps, and the dispersion keeps a host that makes
    whole samples differ from passing for a finding."""
    n = steps.sum()
    p = ((frac * steps).sum(axis=1) + 0.5) / (n + 1)
    k = frac.shape[1]
    phi = np.ones(frac.shape[0])
    if k > 1:
        chi = ((frac - p[:, None]) ** 2 * steps[None, :]).sum(axis=1) / (p * (1 - p))
        phi = np.maximum(chi / (k - 1), 1.0)
    return phi * p * (1 - p) / n


def _peak(profiles: list[OpProfile]) -> float | None:
    peaks = [p.peak_memory_bytes for p in profiles if p.peak_memory_bytes is not None]
    return max(peaks) if peaks else None


def _no_nan(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def _ms(us: float, *, sign: bool = False) -> str:
    ms = us / 1000
    return f"{ms:+.2f} ms" if sign else f"{ms:.2f} ms"
