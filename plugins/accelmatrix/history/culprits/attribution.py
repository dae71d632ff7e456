"""What kind of cause a confirmed change points to, read from its siblings in the matrix.

A change in one cell is one observation; the cells of the same run that share or differ
in build, machine kind and axis values say what moved it:

``code``          every machine kind (and every runtime) moved on the same build: the build
                  under test did it (for the models it touched);
``machine_kind``  one machine kind moved, the others ran flat: the machines did it;
``axis_value``    only the cells with one value of an environment axis (runtime, image,
                  config) moved: that value did it;
``noise``         nothing the siblings show, and the re-test did not reproduce it.

Why a fit and not a vote per cell: with a 3 % change and 2 % night-to-night noise one
cell's Δ is barely beyond its own noise, so "which cells moved" cell by cell is wrong
about one cell in five, and one wrong cell flips a rule like "all kinds moved". Each
hypothesis instead predicts *which* cells moved; its amplitude is fitted per workload (a
build or a slow machine costs a big model more than a small one; the amplitude is never
of the other sign than the change), and the hypothesis whose prediction leaves the
smallest weighted residual (chi-square, each cell's Δ over its standard error) wins.
Every hypothesis has the same parameters (one amplitude per workload), so their
residuals compare directly. When the best leaves the residual of "nothing moved" less
than ``noise_chi2`` lower (what noise exceeds in 1 % of matrices of that many workloads and
hypotheses), the siblings show no pattern.

The re-test (both builds on one machine, interleaved) adds what the siblings cannot: a
change it did not reproduce is not the build's (a slow machine kind or runtime is slow
for both builds), so ``code`` is ruled out; one it reproduced is the build's even when the
siblings show nothing (a change on the only cell that runs that code).

Which axes are *workloads* (what the build runs: model, benchmark) and which are
*environment* (runtime, image, config) is the caller's to say: a change confined to one
model across every machine and runtime is the code's, not "the axis value model=A".

bench/bench_profile_diff.py measures the right-class rate on generated matrices.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NIGHTS_AFTER",
    "NOISE_FALSE_RATE",
    "WORKLOAD_AXES",
    "Attribution",
    "CellDelta",
    "Evidence",
    "attribute",
    "noise_chi2",
    "siblings_from_history",
]

# Axes that name what the build runs (a change confined to one value is the code's), by
# name; every other axis is environment (runtime, image, config: "axis value" causes).
WORKLOAD_AXES = frozenset({"model", "models", "workload", "benchmark", "task", "dataset"})
# The nights read on each side of the change for a sibling's Δ.
NIGHTS_BEFORE = 14
NIGHTS_AFTER = 4

Cause = Literal["code", "machine_kind", "axis_value", "noise"]

# The best hypothesis must lower the chi-square of "nothing moved" by more than pure noise
# would in this share of matrices, whatever the matrix's size (``noise_chi2``).
NOISE_FALSE_RATE = 0.01
# A sibling is listed as "moved" when its Δ is this many of its standard errors worse.
MOVED_Z = 2.0


@dataclass(frozen=True)
class CellDelta:
    """One cell's change around the change's night: Δ % of its metric (positive = worse,
    whatever the metric's direction) and that Δ's standard error in %."""

    cell: str
    machine_kind: str
    axes: Mapping[str, str]
    delta_pct: float
    se_pct: float
    nights_after: int = 0  # nights at the new level behind delta_pct (0: not from a history)


@dataclass(frozen=True)
class Evidence:
    """A cell as the report lists it: its Δ, whether it moved, and whether the class says
    it should have."""

    cell: str
    machine_kind: str
    axes: Mapping[str, str]
    delta_pct: float
    moved: bool
    predicted: bool


@dataclass(frozen=True)
class Attribution:
    cause: Cause
    axis: str | None = None  # machine_kind: "machine_kind"; axis_value: the axis
    value: str | None = None  # the machine kind or the axis value
    reason: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    # chi-square of each hypothesis (lower fits better) and of "nothing moved"
    fits: dict[str, float] = field(default_factory=dict)

    @property
    def moved(self) -> list[Evidence]:
        return [e for e in self.evidence if e.moved]

    @property
    def flat(self) -> list[Evidence]:
        return [e for e in self.evidence if not e.moved]

    def describe(self) -> str:
        """``machine kind tpu-v5e: 8 of 8 cells on it moved (+3.1 % median), 1 of 16
        elsewhere``."""
        head = {
            "code": "the code",
            "machine_kind": f"machine kind {self.value}",
            "axis_value": f"{self.axis}={self.value}",
            "noise": "noise",
        }[self.cause]
        inside = [e for e in self.evidence if e.predicted]
        outside = [e for e in self.evidence if not e.predicted]
        parts = [f"{sum(e.moved for e in inside)} of {len(inside)} cells it predicts moved"]
        if inside:
            med = sorted(e.delta_pct for e in inside)[len(inside) // 2]
            parts[0] += f" ({med:+.1f} % median)"
        if outside:
            parts.append(f"{sum(e.moved for e in outside)} of {len(outside)} elsewhere")
        return f"{head}: " + ", ".join(parts) + (f"; {self.reason}" if self.reason else "")


def attribute(
    change: CellDelta,
    siblings: Sequence[CellDelta],
    *,
    reproduced: bool | None = None,
    workload_axes: Collection[str] = (),
) -> Attribution:
    """Classify ``change`` (a cell's confirmed change) by ``siblings`` (the other cells of
    the same runs, their Δ over the same nights); ``reproduced`` is the re-test's answer
    (None: not re-tested)."""
    cells = [change] + [s for s in siblings if s.cell != change.cell]
    env_axes = sorted({a for c in cells for a in c.axes} - set(workload_axes))

    def workload(c: CellDelta) -> tuple[str, ...]:
        return tuple(str(c.axes.get(a, "")) for a in sorted(workload_axes))

    hyps: list[tuple[str, Cause, str | None, str | None, list[bool]]] = [
        ("code", "code", None, None, [True] * len(cells))
    ]
    hyps.append(
        (
            f"machine_kind={change.machine_kind}",
            "machine_kind",
            "machine_kind",
            change.machine_kind,
            [c.machine_kind == change.machine_kind for c in cells],
        )
    )
    for a in env_axes:
        v = change.axes.get(a)
        if v is not None:
            hyps.append((f"{a}={v}", "axis_value", a, v, [c.axes.get(a) == v for c in cells]))

    sign = 1.0 if change.delta_pct >= 0 else -1.0
    d = [sign * c.delta_pct for c in cells]
    w = [1.0 / max(c.se_pct, 1e-9) ** 2 for c in cells]
    groups = [workload(c) for c in cells]
    # The fit reads the siblings only: the change's own cell is in every hypothesis, and
    # it is large because it was picked for being large (a lone noisy night would
    # otherwise look like a pattern of one).
    sib = slice(1, None)
    null = sum(x * x * wi for x, wi in zip(d[sib], w[sib], strict=True))
    fits = {"nothing moved": null}
    best: tuple[float, int] | None = None
    for i, (label, cause, *_rest, pred) in enumerate(hyps):
        if cause == "code" and reproduced is False:
            continue
        chi2 = _chi2(d[sib], w[sib], groups[sib], pred[sib])
        fits[label] = chi2
        if best is None or chi2 < best[0] - 1e-9:
            best = (chi2, i)

    def evidence(pred: list[bool]) -> list[Evidence]:
        return [
            Evidence(
                cell=c.cell,
                machine_kind=c.machine_kind,
                axes=dict(c.axes),
                delta_pct=c.delta_pct,
                moved=x * math.sqrt(wi) >= MOVED_Z,
                predicted=p,
            )
            for c, x, wi, p in zip(cells, d, w, pred, strict=True)
        ]

    assert best is not None  # the machine-kind hypothesis is always there
    chi2, i = best
    label, cause, axis, value, pred = hyps[i]
    gain = null - chi2
    threshold = noise_chi2(len(set(groups[sib])), len(fits) - 1)
    if gain < threshold:
        if reproduced:
            return Attribution(
                "code",
                reason="the re-test reproduced it on one machine; the siblings show no pattern",
                evidence=evidence([True] * len(cells)),
                fits=fits,
            )
        why = "the re-test did not reproduce it" if reproduced is False else "not re-tested"
        return Attribution(
            "noise",
            reason=f"{why}, and no sibling pattern (chi-square gain {gain:.1f} < {threshold:.1f})",
            evidence=evidence([False] * len(cells)),
            fits=fits,
        )
    reason = f"best fit {label} (chi-square {chi2:.1f}; nothing moved {null:.1f})"
    if reproduced is False and cause != "code":
        reason += "; the re-test did not reproduce it: both builds are slow there"
    return Attribution(cause, axis, value, reason, evidence(pred), fits)


@functools.lru_cache(maxsize=256)
def noise_chi2(workloads: int, hypotheses: int, false_rate: float = NOISE_FALSE_RATE) -> float:
    """The chi-square gain that pure noise exceeds in ``false_rate`` of matrices with this
    many workloads (amplitudes fitted per hypothesis) and hypotheses tested.

    Why a formula and not one constant: a hypothesis fits one amplitude >= 0 per workload,
    so under noise each amplitude lowers the chi-square by a chi-square(1) half the time
    and by 0 otherwise: the gain is chi-bar-square, sum_k C(G, k) / 2^G x chi2(k), G the
    workloads; the best of H hypotheses is bounded by Bonferroni (H x the tail). A suite
    with 16 models needs a gain of ~27 where 4 models need 13 (the constant this replaced,
    calibrated by hand on 4 workloads; this gives 12.4-13.0 there). bench/
    bench_profile_diff.py prints the false-cause rate and the right-class rate by size."""
    from scipy import optimize, stats

    g = max(workloads, 1)
    h = max(hypotheses, 1)

    def tail(c: float) -> float:
        return sum(math.comb(g, k) / 2**g * stats.chi2.sf(c, k) for k in range(1, g + 1))

    return float(optimize.brentq(lambda c: tail(c) - false_rate / h, 1e-6, 1e4))


def _chi2(d: list[float], w: list[float], groups: list[tuple[str, ...]], pred: list[bool]) -> float:
    """Weighted residual of "the predicted cells moved by one amplitude (>= 0) per
    workload, the rest stayed": each workload's amplitude is its predicted cells'
    weighted mean Δ, floored at 0."""
    num: dict[tuple[str, ...], float] = {}
    den: dict[tuple[str, ...], float] = {}
    for x, wi, g, p in zip(d, w, groups, pred, strict=True):
        if p:
            num[g] = num.get(g, 0.0) + x * wi
            den[g] = den.get(g, 0.0) + wi
    mu = {g: max(num[g] / den[g], 0.0) for g in num}
    return sum(
        (x - (mu[g] if p else 0.0)) ** 2 * wi
        for x, wi, g, p in zip(d, w, groups, pred, strict=True)
    )


def siblings_from_history(
    frame: pd.DataFrame,
    change_time: datetime,
    *,
    before: int = NIGHTS_BEFORE,
    after: int = NIGHTS_AFTER,
    higher_is_better: bool = False,
) -> list[CellDelta]:
    """Every cell's Δ around ``change_time``, from a perf-history frame of one metric
    (``history.series.frame.history``: ``cell_id``, ``machine``, ``axes``, ``time``, ``value``).

    Δ is the mean of the first ``after`` nights from ``change_time`` on against the median
    of the last ``before`` nights before it, in %, positive when worse. Its standard error
    is the nights' noise (1.4826 x MAD of the nights before, at least 0.1 % of the level)
    times sqrt(1/after + 1/before). A cell with fewer than 3 nights before or 1 after is
    left out: it says nothing about that night."""
    out: list[CellDelta] = []
    for cell_id, rows in frame.sort_values("time").groupby("cell_id", sort=True):
        v = rows["value"].to_numpy(dtype="float64")
        t = rows["time"]
        ok = ~np.isnan(v)
        pre = v[ok & (t < change_time).to_numpy()][-before:]
        post = v[ok & (t >= change_time).to_numpy()][:after]
        if len(pre) < 3 or not len(post):
            continue
        level = float(np.median(pre))
        if level == 0:
            continue
        sigma = max(1.4826 * float(np.median(abs(pre - level))), 0.001 * abs(level))
        delta = (float(post.mean()) / level - 1) * 100 * (-1 if higher_is_better else 1)
        se = sigma / abs(level) * 100 * math.sqrt(1 / len(post) + 1 / len(pre))
        last = rows.iloc[-1]
        axes: dict[str, Any] = last["axes"] if isinstance(last["axes"], dict) else {}
        out.append(
            CellDelta(
                cell=str(cell_id),
                machine_kind=str(last["machine"] or ""),
                axes={k: str(x) for k, x in axes.items()},
                delta_pct=delta,
                se_pct=se,
                nights_after=len(post),
            )
        )
    return out
