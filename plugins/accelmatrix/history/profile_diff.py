"""Which ops got slower between two builds: the op-level diff of two profiler traces.

A confirmed regression says "build X is 5 % slower". On-call's next question is where,
and the answer is in the two traces the re-test kept (the last good build's and the
culprit's): self time per op per step (``history.op_trace``), compared op by op.

Ranking. Two traces of the same code on one machine never run at exactly the same speed:
a re-test on a warmer or busier host scales every op by a percent or two. Ranked by raw
Δ, that drift puts the *largest* op first whatever changed. So each op's Δ is split in
two: the common drift ``(r - 1) x base``, where ``r`` is the median of the ops' new/base
ratios (each op one vote, so one op that changed cannot move it; weighted by time, an op
that is most of the step would set it alone), and the **excess**, what the op changed
beyond that. Rows are ranked by excess, those whose excess is beyond ``RANK_Z`` standard
errors first: a large op's noise (a few tenths of a percent of the step over 60 steps)
would otherwise rank above a small op's real 5 %. The report shows the raw Δ per step, Δ %
and the op's share of the regression, which is what on-call reads; where the drift is nil
(the usual case) excess and Δ agree.

Host interruptions. A step interrupted by the OS (a busy host) carries milliseconds that
belong to no op; each op's per-step mean drops its far-out values first (``_robust``).

Naming a cause. The first row is *named* the cause only when its excess alone explains at
least half of the regression (``CAUSE_SHARE``; the regression is the ops' summed Δ) and
is at least ``CAUSE_Z`` of its own standard errors (from the per-step spread of the op's
self time, so an op that jitters step to step is not named on one trace's luck). When the
common drift explains at least half of the regression instead, the verdict is ``spread``:
everything got slower by about the same factor (a slower machine, clock or runtime), and
no op is blamed. Otherwise it is ``several``: the top rows are listed, none named.
bench/bench_profile_diff.py measures how often the slowed op is ranked first on
generated traces and that an even 2 % slowdown names none.

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

from accelmatrix.history.op_trace import OpProfile, TraceError, read_profiles

__all__ = [
    "CAUSE_SHARE",
    "CAUSE_Z",
    "DiffOutcome",
    "OpDelta",
    "ProfileDiff",
    "diff_profiles",
    "diff_traces",
]

# The first op is named the cause when its excess is at least this share of the step-time
# regression ...
CAUSE_SHARE = 0.5
# ... and this many standard errors (per-step spread of its self time in both traces).
CAUSE_Z = 3.0
# The common drift is the median of the ops' new/base ratios, each op one vote (weighted by
# time, one op that is most of the step would set it alone), over ops with at least this
# share of the base step (µs-long ops' ratios are mostly timer noise) ...
DRIFT_MIN_SHARE = 0.001
# ... and at least this many of them; with fewer, no drift is assumed (r = 1).
DRIFT_MIN_OPS = 5

# Rows whose excess is at least this many standard errors rank before the others.
RANK_Z = 4.0
# A step's value of an op is an interruption, not the op, this many robust sigmas above the
# op's median (``_robust``), judged once the op ran in at least this many steps.
FENCE_SIGMAS = 3.5
FENCE_MIN_STEPS = 5

Verdict = Literal["op", "spread", "several", "no_regression"]
Status = Literal["changed", "new", "gone"]


@dataclass(frozen=True)
class OpDelta:
    """One op (name, input shapes, where it ran) in both traces, per step."""

    op: str
    shapes: str
    where: str
    base_us: float  # mean self time per step in the base (last good) trace
    new_us: float  # ... in the new (culprit) trace
    delta_us: float  # new - base
    delta_pct: float | None  # None for an op new in the culprit
    excess_us: float  # delta beyond the common drift: the ranking key
    share: float | None  # delta / the ops' summed delta; None when they did not get slower
    z: float  # excess / its standard error
    status: Status
    calls_base: float  # calls per step
    calls_new: float

    def describe(self) -> str:
        """One line: ``aten::addmm self time +1.90 ms per step (+38 %), 71 % of the
        regression`` or ``aten::copy_ new in the culprit, 0.40 ms per step``."""
        name = self.op + (f" {self.shapes}" if self.shapes else "")
        if self.where != "cpu":
            name += f" ({self.where})"
        if self.status == "new":
            text = f"{name} new in the culprit, {_ms(self.new_us)} per step"
        elif self.status == "gone":
            text = f"{name} gone from the culprit, was {_ms(self.base_us)} per step"
        else:
            pct = f" ({self.delta_pct:+.0%})" if self.delta_pct is not None else ""
            text = f"{name} self time {_ms(self.delta_us, sign=True)} per step{pct}"
        if self.share is not None:
            text += f", {self.share:.0%} of the regression"
        return text


@dataclass(frozen=True)
class ProfileDiff:
    """The op-level diff of a base and a new trace (see the module's docstring)."""

    base_source: str
    new_source: str
    base_steps: int
    new_steps: int
    base_step_us: float  # mean step time
    new_step_us: float
    delta_step_us: float
    delta_step_pct: float
    base_ops_us: float  # the ops' self time per step, summed (host and device)
    delta_ops_us: float  # ... its change: the regression the rows' shares divide
    drift: float  # r - 1: the common scale of every op, as a fraction
    verdict: Verdict
    rows: list[OpDelta] = field(default_factory=list)  # by excess, largest first
    base_peak_memory_bytes: float | None = None
    new_peak_memory_bytes: float | None = None

    @property
    def cause(self) -> OpDelta | None:
        return self.rows[0] if self.verdict == "op" and self.rows else None

    @property
    def new_ops(self) -> list[OpDelta]:
        return [r for r in self.rows if r.status == "new"]

    @property
    def gone_ops(self) -> list[OpDelta]:
        return [r for r in self.rows if r.status == "gone"]

    def top(self, n: int = 3) -> list[OpDelta]:
        """The first ``n`` rows that got slower (excess > 0)."""
        return [r for r in self.rows if r.excess_us > 0][:n]

    def summary(self) -> str:
        """The sentence for the alert, then the top 3 ops."""
        step = f"step {_ms(self.delta_step_us, sign=True)} ({self.delta_step_pct:+.1%})"
        if self.verdict == "no_regression":
            head = f"The culprit's trace is not slower ({step})."
        elif self.verdict == "op":
            head = f"{step}: one op explains most of it."
        elif self.verdict == "spread":
            head = (
                f"{step}: spread over every op (all about {self.drift:+.1%}), no single op; "
                "a slower machine, clock or runtime looks like this."
            )
        else:
            head = f"{step}: several ops, none explains half of it."
        lines = [head] + [f"  {r.describe()}" for r in self.top(3)]
        if self.base_peak_memory_bytes is not None and self.new_peak_memory_bytes is not None:
            d = self.new_peak_memory_bytes - self.base_peak_memory_bytes
            lines.append(f"  peak memory {d / 2**20:+.1f} MiB")
        return "\n".join(lines)

    def as_json(self, top: int = 10) -> dict[str, Any]:
        """A JSON-ready dict with the first ``top`` rows and every new/gone op among the
        first 50 (what the store keeps and ``changepoints --json`` prints)."""
        out = asdict(self)
        keep = self.rows[:top] + [
            r for r in self.rows[top:50] if r.status != "changed" and r.excess_us > 0
        ]
        out["rows"] = [asdict(r) for r in keep]
        out["cause"] = asdict(self.cause) if self.cause else None
        return out


@dataclass(frozen=True)
class DiffOutcome:
    """``diff_traces``' answer: the diff, or the one message saying why there is none."""

    diff: ProfileDiff | None
    error: str | None = None


def diff_traces(
    base: Path | str | Sequence[Path | str], new: Path | str | Sequence[Path | str]
) -> DiffOutcome:
    """Read and diff the traces of two builds (a file, or a few per build: their steps are
    pooled); a trace that cannot be read gives ``error`` (one line naming the file and
    what is wrong) instead of raising, so the caller's verdict stands without the diff."""

    def read(paths: Path | str | Sequence[Path | str]) -> OpProfile:
        return read_profiles([paths] if isinstance(paths, str | Path) else paths)

    try:
        return DiffOutcome(diff_profiles(read(base), read(new)))
    except TraceError as e:
        return DiffOutcome(None, f"no op-level diff: {e}")


def diff_profiles(base: OpProfile, new: OpProfile) -> ProfileDiff:
    """Compare ``new`` (the culprit's trace) with ``base`` (the last good build's)."""
    if base.n_steps == 0 or new.n_steps == 0:
        raise TraceError("an op diff needs at least one profiled step in each trace")
    keys, a, b, ca, cb = _per_step(base, new)
    n_a, n_b = a.shape[1], b.shape[1]
    mean_a, var_a = _robust(a)
    mean_b, var_b = _robust(b)
    t_a = float(_robust(base.steps["dur_us"].to_numpy(dtype="float64")[None, :])[0][0])
    t_b = float(_robust(new.steps["dur_us"].to_numpy(dtype="float64")[None, :])[0][0])
    # The regression the rows share: the sum of their deltas. Not the step time's delta:
    # interruptions between ops (a busy host) and device time overlapping the host's make
    # the two differ, and shares of the step's delta then add up to anything.
    total_a = float(mean_a.sum())
    d_total = float((mean_b - mean_a).sum())
    d_t = t_b - t_a

    both = (mean_a > DRIFT_MIN_SHARE * total_a) & (mean_b > 0)
    r = float(np.median(mean_b[both] / mean_a[both])) if both.sum() >= DRIFT_MIN_OPS else 1.0
    delta = mean_b - mean_a
    excess = mean_b - r * mean_a
    se = np.sqrt(var_a / n_a + var_b / n_b)  # (n: before the fence; close enough for a floor)
    # A floor for ops with no spread at all (one step, or a constant): 1 % of the op.
    se = np.maximum(se, 0.01 * np.maximum(mean_a, mean_b) + 1e-9)
    z = excess / se

    # Ops whose excess is beyond their noise first, each group by excess: a big op's
    # noise (0.2 % of the step over 60 steps) must not rank above a small op's real 5 %.
    order = np.lexsort((-excess, ~(z >= RANK_Z)))
    rows = []
    for i in order:
        status: Status = "new" if mean_a[i] == 0 else "gone" if mean_b[i] == 0 else "changed"
        rows.append(
            OpDelta(
                op=keys[i][0],
                shapes=keys[i][1],
                where=keys[i][2],
                base_us=float(mean_a[i]),
                new_us=float(mean_b[i]),
                delta_us=float(delta[i]),
                delta_pct=float(delta[i] / mean_a[i]) if mean_a[i] > 0 else None,
                excess_us=float(excess[i]),
                share=float(delta[i] / d_total) if d_total > 0 else None,
                z=float(z[i]),
                status=status,
                calls_base=float(ca[i]),
                calls_new=float(cb[i]),
            )
        )
    verdict = _verdict(rows, d_total, (r - 1.0) * total_a)
    return ProfileDiff(
        base_source=base.source,
        new_source=new.source,
        base_steps=n_a,
        new_steps=n_b,
        base_step_us=t_a,
        new_step_us=t_b,
        delta_step_us=d_t,
        delta_step_pct=d_t / t_a if t_a > 0 else math.nan,
        base_ops_us=total_a,
        delta_ops_us=d_total,
        drift=r - 1.0,
        verdict=verdict,
        rows=rows,
        base_peak_memory_bytes=base.peak_memory_bytes,
        new_peak_memory_bytes=new.peak_memory_bytes,
    )


def _verdict(rows: list[OpDelta], d_total: float, common: float) -> Verdict:
    if d_total <= 0 or not rows:
        return "no_regression"
    first = rows[0]
    if first.excess_us >= CAUSE_SHARE * d_total and first.z >= CAUSE_Z:
        return "op"
    if common >= CAUSE_SHARE * d_total:
        return "spread"
    return "several"


def _per_step(
    base: OpProfile, new: OpProfile
) -> tuple[list[tuple[str, str, str]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(op keys, base self µs [key x step], new self µs, base calls/step, new calls/step),
    with 0 where an op did not run in a step, over the union of both traces' ops."""
    cols = ["op", "shapes", "where"]
    index: dict[tuple[str, str, str], int] = {}
    for frame in (base.ops, new.ops):
        for k in frame[cols].drop_duplicates().itertuples(index=False, name=None):
            index.setdefault(k, len(index))
    keys = list(index)

    def matrix(p: OpProfile) -> tuple[np.ndarray, np.ndarray]:
        steps = {s: j for j, s in enumerate(p.steps["step"].tolist())}
        m = np.zeros((len(keys), len(steps)))
        calls = np.zeros(len(keys))
        if len(p.ops):
            rows = np.fromiter(
                (index[k] for k in p.ops[cols].itertuples(index=False, name=None)),
                dtype=np.int64,
                count=len(p.ops),
            )
            cols_ = np.fromiter((steps[s] for s in p.ops["step"]), dtype=np.int64)
            np.add.at(m, (rows, cols_), p.ops["self_us"].to_numpy(dtype="float64"))
            np.add.at(calls, rows, p.ops["calls"].to_numpy(dtype="float64"))
        return m, calls / max(len(steps), 1)

    a, ca = matrix(base)
    b, cb = matrix(new)
    return keys, a, b, ca, cb


def _robust(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (op): the mean and variance over steps, without the steps where the op took
    far longer than usual.

    Why: on a busy host a step is now and then interrupted for a scheduler time slice
    (several ms; on the shared 2-core CI host, in a third of the steps of a 2 ms op), and
    the time lands in whichever op was running; a few such steps move an op's mean more
    than the regression does. A value more than ``FENCE_SIGMAS`` robust sigmas (1.4826 x
    the MAD) above the median of the steps the op ran in is dropped: a median and MAD stay
    put with up to half the steps interrupted, where a quartile fence does not. Only high
    values go (an interruption only adds time), never the steps where the op did not run
    (an op that runs every tenth step keeps its zeros). The price: an op whose slow path
    is taken in a minority of steps is read at its fast path, in both builds alike."""
    means = np.empty(m.shape[0])
    varis = np.zeros(m.shape[0])
    for i, row in enumerate(m):
        ran = row[row > 0]
        if len(ran) >= FENCE_MIN_STEPS:
            med = float(np.median(ran))
            sigma = max(1.4826 * float(np.median(np.abs(ran - med))), 0.01 * med)
            row = row[row <= med + FENCE_SIGMAS * sigma]
        means[i] = row.mean()
        if len(row) > 1:
            varis[i] = row.var(ddof=1)
    return means, varis


def _ms(us: float, *, sign: bool = False) -> str:
    ms = us / 1000
    return f"{ms:+.2f} ms" if sign else f"{ms:.2f} ms"
