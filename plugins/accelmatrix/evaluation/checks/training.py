"""Planners of the training checks (``metric_between``, ``final_loss``, ``loss_decreasing``,
``step_time_within_bounds``): numbers from the metric series, judged against a range, a
target, a trend or a benchmark's bounds.

Models: accelmatrix.spec.checks.training. A failed step-time check prints the runbook
(``RUNBOOK_BELOW``/``RUNBOOK_ABOVE``): what a person does about a value out of bounds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from accelmatrix.evaluation.bounds import BoundsError
from accelmatrix.evaluation.check_plan import (
    CheckPlan,
    Expect,
    finite_or_none,
    missing_metric,
    num,
    range_text,
    slug,
)
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.training import (
    FinalLossCheck,
    LossDecreasingCheck,
    MetricBetweenCheck,
    StepTimeWithinBoundsCheck,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RUNBOOK_ABOVE", "RUNBOOK_BELOW"]

RUNBOOK_BELOW = (
    "if this follows an optimisation or dependency update, re-center the bounds; "
    "if nothing changed, widen the confidence interval"
)
RUNBOOK_ABOVE = (
    "a code change may have introduced a regression: find the cause before landing; "
    "if nothing changed, escalate to the hardware team"
)


def _reduce(series: pd.Series, how: str) -> float:
    """Reduce a series; NaN anywhere propagates, because a NaN loss is a failure signal."""
    if how == "last":
        return float(series.iloc[-1])
    return float(getattr(series, how)(skipna=False))


@planner(MetricBetweenCheck)
def _plan_metric_between(c: MetricBetweenCheck, p: CheckPlan, inp: CellInputs) -> None:
    subject = f"{c.reduce}({c.metric})"
    col = f"{p.prefix}__{c.reduce}_{slug(c.metric)}"
    p.expected = range_text(c.min, subject, c.max)
    series = inp.series(c.metric)
    value = None
    if series is None:
        missing_metric(p, c.metric, inp)
    else:
        value = _reduce(series, c.reduce)
        p.observed = num(value)
        if math.isnan(value):
            p.failure = f"{subject} is NaN (the series has NaN values)"
        elif c.min is not None and value < c.min:
            p.failure = f"{subject} = {num(value)} is below the minimum {num(c.min)}"
        else:
            p.failure = f"{subject} = {num(value)} is above the maximum {num(c.max)}"
    p.columns = {col: finite_or_none(value)}
    p.expectations = [Expect(col, p.expected, min_value=c.min, max_value=c.max)]


def _loss_target(c: FinalLossCheck, inp: CellInputs) -> tuple[float, float] | str:
    """(target, tolerance) inline or from the bounds file; a problem as text."""
    if c.bounds_file is None:
        return float(c.target), float(c.tolerance)  # type: ignore[arg-type]
    loaded = inp.bounds(c.bounds_file)
    if isinstance(loaded, BoundsError):
        return str(loaded)
    try:
        bench = loaded.get(c.benchmark, source=inp.include_dir / c.bounds_file)  # type: ignore[arg-type]
    except BoundsError as exc:
        return str(exc)
    extra = bench.model_extra or {}
    target, tolerance = extra.get("target_loss"), extra.get("loss_tolerance")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (target, tolerance)):
        return (
            f"benchmark {c.benchmark!r} in {c.bounds_file} needs numeric target_loss and "
            f"loss_tolerance (got {target!r}, {tolerance!r})"
        )
    return float(target), float(tolerance)  # type: ignore[arg-type]


@planner(FinalLossCheck)
def _plan_final_loss(c: FinalLossCheck, p: CheckPlan, inp: CellInputs) -> None:
    col = f"{p.prefix}__last_{slug(c.metric)}"
    target = _loss_target(c, inp)
    if isinstance(target, str):
        found_col = f"{p.prefix}__target_found"
        p.expected = f"last({c.metric}) near the target of {c.benchmark!r} in {c.bounds_file}"
        p.observed = "target unavailable"
        p.failure = target
        p.columns = {found_col: 0}
        p.expectations = [Expect.equals(found_col, "loss target found (1 = yes)", 1)]
        return
    c = c.model_copy(update={"target": target[0], "tolerance": target[1]})
    p.expected = f"|last({c.metric}) - {num(c.target)}| <= {num(c.tolerance)}"
    series = inp.series(c.metric)
    value = None
    if series is None:
        missing_metric(p, c.metric, inp)
    else:
        value = _reduce(series, "last")
        diff = abs(value - c.target)
        p.observed = f"{num(value)} (|diff| = {num(diff)})"
        p.failure = (
            f"last({c.metric}) is NaN: training diverged?"
            if math.isnan(value)
            else f"last({c.metric}) = {num(value)} is {num(diff)} away from the target "
            f"{num(c.target)}; tolerance {num(c.tolerance)}"
        )
    p.columns = {col: finite_or_none(value)}
    lo, hi = c.target - c.tolerance, c.target + c.tolerance
    p.expectations = [Expect(col, p.expected, min_value=lo, max_value=hi)]


@planner(LossDecreasingCheck)
def _plan_loss_decreasing(c: LossDecreasingCheck, p: CheckPlan, inp: CellInputs) -> None:
    n_col, drop_col = f"{p.prefix}__points", f"{p.prefix}__decrease_{slug(c.metric)}"
    series = inp.series(c.metric)
    n = 0 if series is None else len(series)
    # Windows must not overlap, or a short series compares a mean with itself.
    w = max(1, min(c.window, n // 2))
    p.expected = f"mean(last {w}) < mean(first {w}) of {c.metric}, >= 2 points"
    first = last = None
    if series is None:
        missing_metric(p, c.metric, inp)
    elif n < 2:
        p.observed = f"{n} point(s)"
        p.failure = f"{c.metric} has {n} point(s); a trend needs at least 2"
    else:
        first = float(series.iloc[:w].mean(skipna=False))
        last = float(series.iloc[-w:].mean(skipna=False))
        p.observed = f"first {num(first)}, last {num(last)} ({n} points)"
        if math.isnan(first) or math.isnan(last):
            p.failure = f"{c.metric} has NaN values: training diverged?"
        else:
            p.failure = (
                f"{c.metric} did not decrease: mean of the last {w} point(s) {num(last)} >= "
                f"mean of the first {w} {num(first)}"
            )
    # One number to validate: first-window mean minus last-window mean, which must be > 0.
    drop = None if first is None or last is None else first - last
    p.columns = {n_col: n, drop_col: None if drop is None or math.isnan(drop) else drop}
    p.expectations = [
        Expect(n_col, f"{c.metric} has >= 2 points", min_value=2),
        Expect(drop_col, f"{p.expected}: first mean - last mean > 0", min_value=0, strict_min=True),
    ]


@planner(StepTimeWithinBoundsCheck)
def _plan_step_time(c: StepTimeWithinBoundsCheck, p: CheckPlan, inp: CellInputs) -> None:
    found_col = f"{p.prefix}__bounds_found"
    value_col = f"{p.prefix}__median_{slug(c.metric)}"
    bounds_path = inp.include_dir / c.bounds_file
    loaded = inp.bounds(c.bounds_file)
    lo = hi = None
    problem: str | None = None
    if isinstance(loaded, BoundsError):
        problem = str(loaded)
    else:
        try:
            bench = loaded.get(c.benchmark, source=bounds_path)
        except BoundsError as exc:
            problem = str(exc)
        else:
            lo, hi = bench.step_time_lower_bound, bench.step_time_upper_bound
            if lo is None or hi is None:
                problem = (
                    f"benchmark {c.benchmark!r} in {bounds_path} has no "
                    "step_time_lower_bound/step_time_upper_bound"
                )
    series = inp.series(c.metric)
    # The median ignores warm-up/compile steps and GC hiccups that would skew a mean.
    value = None if series is None else float(series.median(skipna=False))
    # The resolved benchmark key (``${axis.model}`` rendered by the plan) travels with the
    # verdict into the results store, so the history can be grouped by benchmark.
    p.perf = {
        "benchmark": c.benchmark,
        "metric": c.metric,
        "value": value if value is not None and math.isfinite(value) else None,
        "lower_bound": lo,
        "upper_bound": hi,
    }
    p.columns = {found_col: int(problem is None), value_col: finite_or_none(value)}
    found = f"benchmark {c.benchmark!r} has bounds in {c.bounds_file} (1 = yes)"
    p.expectations = [Expect.equals(found_col, found, 1)]
    if problem is not None:
        # Still part of the suite (as a failing expectation) so Data Docs show the failure.
        p.expected = f"{c.metric} within bounds of {c.benchmark!r} in {c.bounds_file}"
        p.observed = "bounds unavailable" if value is None else f"{num(value)} (bounds unavailable)"
        p.failure = problem
        return
    p.expected = f"{num(lo)} <= {c.metric} <= {num(hi)} (bounds {c.benchmark})"
    p.expectations.append(Expect(value_col, p.expected, min_value=lo, max_value=hi))
    if series is None:
        missing_metric(p, c.metric, inp)
        return
    p.observed = f"{num(value)} (median of {len(series)})"
    where = f"bounds {num(lo)}..{num(hi)} of {c.benchmark!r} in {c.bounds_file}"
    if value is None or math.isnan(value):
        p.failure = f"{c.metric} has NaN values"
    elif value < lo:  # type: ignore[operator]
        p.failure = f"{c.metric} {num(value)} s is below the lower bound ({where}): {RUNBOOK_BELOW}"
    else:
        p.failure = f"{c.metric} {num(value)} s is above the upper bound ({where}): {RUNBOOK_ABOVE}"
    p.success = f"within {where}"
