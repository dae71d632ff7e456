"""Planners of the training checks (``metric_between``, ``final_loss``, ``loss_decreasing``,
``step_time_within_bounds``): expectations over the cell's metrics table (a median, the
last step, every step after the warm-up), judged against a range, a target or a benchmark's
bounds. Great Expectations computes them and names the offending steps; each planner's
``render`` writes the verdict from what GE found. ``loss_decreasing`` compares two window
means, one number no GE expectation computes, so it observes that number itself.

Models: accelmatrix.spec.checks.training. A failed step-time check prints the runbook
(``RUNBOOK_BELOW``/``RUNBOOK_ABOVE``): what a person does about a value out of bounds.
"""

from __future__ import annotations

import math

from accelmatrix.evaluation.bounds import BoundsError
from accelmatrix.evaluation.check_plan import (
    MAX_SHOWN_ROWS,
    CheckPlan,
    Expect,
    ExpectOutcome,
    missing_metric,
    num,
    range_text,
    slug,
    steps_text,
)
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.metrics_table import Rows
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.training import (
    FinalLossCheck,
    LossDecreasingCheck,
    MetricBetweenCheck,
    StepTimeWithinBoundsCheck,
)

__all__ = ["RUNBOOK_ABOVE", "RUNBOOK_BELOW"]

RUNBOOK_BELOW = (
    "if this follows an optimisation or dependency update, re-center the bounds; "
    "if nothing changed, widen the confidence interval"
)
RUNBOOK_ABOVE = (
    "a code change may have introduced a regression: find the cause before landing; "
    "if nothing changed, escalate to the hardware team"
)


def _unobserved(p: CheckPlan, column: str, expect: Expect) -> None:
    """A check with nothing to judge still fails through Great Expectations, so Data Docs
    show it: a null observation under the check's own expectation."""
    p.columns = {column: None}
    p.expectations = [expect]


@planner(MetricBetweenCheck)
def _plan_metric_between(c: MetricBetweenCheck, p: CheckPlan, inp: CellInputs) -> None:
    if c.reduce == "each":
        _plan_each_step(c, p, inp)
        return
    subject = f"{c.reduce}({c.metric})"
    p.expected = range_text(c.min, subject, c.max)
    rows = inp.rows(c.metric)
    if rows is None:
        missing_metric(p, c.metric, inp)
        col = f"{p.prefix}__{c.reduce}_{slug(c.metric)}"
        _unobserved(p, col, Expect(col, p.expected, min_value=c.min, max_value=c.max))
        return
    # GE computes the reduced value over the metric's rows. A NaN anywhere fails the check
    # (a NaN loss is a failure signal), so every reduction but "last" also expects no NaN.
    judged = rows.last() if c.reduce == "last" else rows
    kind = "max" if c.reduce == "last" else c.reduce  # the max of one row is its value
    column = inp.tables.view(judged, "values")
    p.expectations = [
        Expect.over(judged, column, kind, p.expected, min_value=c.min, max_value=c.max)
    ]
    if c.reduce != "last":
        nulls = inp.tables.view(rows, "nulls")
        p.expectations.append(Expect.over(rows, nulls, "not_null", f"{c.metric} has no NaN value"))

    def render(outcomes: list[ExpectOutcome]) -> None:
        value = _number(outcomes[0].observed)
        nan_steps = [] if len(outcomes) < 2 else [s for s, _ in outcomes[1].unexpected]
        if nan_steps or value is None:
            p.observed = "nan"
            where = f": NaN at {_where(rows, nan_steps)}" if nan_steps else ""
            p.failure = f"{subject} is NaN (the series has NaN values{where})"
            return
        p.observed = num(value)
        if c.min is not None and value < c.min:
            p.failure = f"{subject} = {num(value)} is below the minimum {num(c.min)}"
        else:
            p.failure = f"{subject} = {num(value)} is above the maximum {num(c.max)}"

    p.render = render


def _plan_each_step(c: MetricBetweenCheck, p: CheckPlan, inp: CellInputs) -> None:
    """``reduce: each``: every step of the metric (after ``skip_first``, ``mostly`` of them)
    lies in [min, max], judged row by row by ``ExpectColumnValuesToBeBetween``.

    GE's ``mostly`` leaves null rows out of its count, and a NaN step must be a failing
    step, never a skipped one. So GE judges a view of the metric in which NaN is the
    infinity beyond the check's bound (``+inf`` above a max, else ``-inf`` below the min):
    it fails the range like any other value out of it, and counts in ``mostly``.
    """
    p.expected = _each_text(c.min, c.metric, c.max, c.mostly, c.skip_first)
    rows = inp.rows(c.metric, skip_first=c.skip_first)
    if rows is None or rows.n == 0:
        col = f"{p.prefix}__{slug(c.metric)}"
        if rows is None:
            missing_metric(p, c.metric, inp)
        else:
            p.observed = "no steps"
            p.failure = f"{c.metric} has no steps left to judge after skip_first: {c.skip_first}"
        _unobserved(p, col, Expect(col, p.expected, min_value=1))
        return
    col = inp.tables.view(rows, "nan_high" if c.max is not None else "nan_low")
    p.expectations = [
        Expect.over(
            rows, col, "each", p.expected, min_value=c.min, max_value=c.max, mostly=c.mostly
        )
    ]

    def render(outcomes: list[ExpectOutcome]) -> None:
        bad = outcomes[0].unexpected
        p.observed = f"{len(bad)} of {rows.n} step(s) outside"
        text = _offending(rows, bad)
        allowed = math.floor((1 - c.mostly) * rows.n + 1e-9)
        if outcomes[0].success:
            p.success = f"{rows.n - len(bad)} of {rows.n} step(s) within range" + (
                f"; {text} outside, within mostly {num(c.mostly)}" if bad else ""
            )
        else:
            p.failure = (
                f"{len(bad)} of {rows.n} step(s) of {c.metric} outside the range"
                + (f" (mostly {num(c.mostly)} allows {allowed})" if c.mostly < 1 else "")
                + f": {text}"
            )

    p.render = render


def _each_text(lo: float | None, metric: str, hi: float | None, mostly: float, skip: int) -> str:
    text = range_text(lo, f"each step of {metric}", hi)
    if mostly < 1:
        text += f", mostly {num(mostly)}"
    if skip:
        text += f", after {skip} warm-up step(s)"
    return text


def _offending(rows: Rows, bad: list[tuple[int, float]]) -> str:
    """``steps 5, 10, ... (19 of 98): 8.0, 8.0, ...; NaN at 37``: the rows GE named, with
    the metric's own values (the judged column writes NaN as an infinity)."""
    value_at = dict(zip(rows.index.tolist(), rows.values.tolist(), strict=True))
    nan = [s for s, _ in bad if math.isnan(value_at.get(s, math.nan))]
    out = [s for s, _ in bad if s not in set(nan)]
    parts = []
    if out:
        shown = ", ".join(num(value_at[s]) for s in out[:MAX_SHOWN_ROWS])
        more = ", ..." if len(out) > MAX_SHOWN_ROWS else ""
        parts.append(f"{rows.index_name}s {steps_text(out, of=rows.n)}: {shown}{more}")
    if nan:
        parts.append(f"NaN at {_where(rows, nan)}")
    return "; ".join(parts)


def _where(rows: Rows, steps: list[int]) -> str:
    """Steps of a stepped metric; a scalar metric's rows are named as values (1-based)."""
    if rows.index_name == "step":
        return f"step {steps_text(steps)}" if len(steps) == 1 else f"steps {steps_text(steps)}"
    return f"value {steps_text([s + 1 for s in steps])}"


def _number(value: object) -> float | None:
    """GE's observed value as a finite float or None (a null or NaN result)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


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
    goal, tolerance = target
    p.expected = f"|last({c.metric}) - {num(goal)}| <= {num(tolerance)}"
    lo, hi = goal - tolerance, goal + tolerance
    rows = inp.rows(c.metric)
    if rows is None:
        missing_metric(p, c.metric, inp)
        _unobserved(p, col, Expect(col, p.expected, min_value=lo, max_value=hi))
        return
    # The max of the last row is its value; a NaN there leaves GE no value: a failure.
    last = rows.last()
    p.expectations = [
        Expect.over(
            last, inp.tables.view(last, "values"), "max", p.expected, min_value=lo, max_value=hi
        )
    ]

    def render(outcomes: list[ExpectOutcome]) -> None:
        value = _number(outcomes[0].observed)
        if value is None:
            p.observed = "nan (|diff| = nan)"
            p.failure = f"last({c.metric}) is NaN: training diverged?"
            return
        diff = abs(value - goal)
        p.observed = f"{num(value)} (|diff| = {num(diff)})"
        p.failure = (
            f"last({c.metric}) = {num(value)} is {num(diff)} away from the target "
            f"{num(goal)}; tolerance {num(tolerance)}"
        )

    p.render = render


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


def _bounds_of(c: StepTimeWithinBoundsCheck, inp: CellInputs) -> tuple[float, float] | str:
    """(lower, upper) step-time bounds of the check's benchmark; a problem as text."""
    bounds_path = inp.include_dir / c.bounds_file
    loaded = inp.bounds(c.bounds_file)
    if isinstance(loaded, BoundsError):
        return str(loaded)
    try:
        bench = loaded.get(c.benchmark, source=bounds_path)
    except BoundsError as exc:
        return str(exc)
    lo, hi = bench.step_time_lower_bound, bench.step_time_upper_bound
    if lo is None or hi is None:
        return (
            f"benchmark {c.benchmark!r} in {bounds_path} has no "
            "step_time_lower_bound/step_time_upper_bound"
        )
    return lo, hi


@planner(StepTimeWithinBoundsCheck)
def _plan_step_time(c: StepTimeWithinBoundsCheck, p: CheckPlan, inp: CellInputs) -> None:
    import numpy as np

    found_col = f"{p.prefix}__bounds_found"
    bounds = _bounds_of(c, inp)
    problem = bounds if isinstance(bounds, str) else None
    lo, hi = (None, None) if isinstance(bounds, str) else bounds
    rows = inp.rows(c.metric)
    # The resolved benchmark key (``${axis.model}`` rendered by the plan) travels with the
    # verdict into the results store, so the history can be grouped by benchmark. Its value
    # is the median GE computes (render); without bounds GE judges no median, so it is read
    # here, for the history only.
    p.perf = {
        "benchmark": c.benchmark,
        "metric": c.metric,
        "value": None,
        "lower_bound": lo,
        "upper_bound": hi,
    }
    p.columns = {found_col: int(problem is None)}
    found = f"benchmark {c.benchmark!r} has bounds in {c.bounds_file} (1 = yes)"
    p.expectations = [Expect.equals(found_col, found, 1)]
    if problem is not None:
        # Still part of the suite (as a failing expectation) so Data Docs show the failure.
        value = None if rows is None or not rows.n else float(np.median(rows.values))
        p.perf["value"] = _number(value)
        p.expected = f"{c.metric} within bounds of {c.benchmark!r} in {c.bounds_file}"
        p.observed = "bounds unavailable" if value is None else f"{num(value)} (bounds unavailable)"
        p.failure = problem
        return
    p.expected = f"{num(lo)} <= {c.metric} <= {num(hi)} (bounds {c.benchmark})"
    where = f"bounds {num(lo)}..{num(hi)} of {c.benchmark!r} in {c.bounds_file}"
    p.success = f"within {where}"
    if rows is None:
        missing_metric(p, c.metric, inp)
        value_col = f"{p.prefix}__median_{slug(c.metric)}"
        p.columns[value_col] = None
        p.expectations.append(Expect(value_col, p.expected, min_value=lo, max_value=hi))
        return
    # The median ignores warm-up/compile steps and GC hiccups that would skew a mean; a NaN
    # step fails the check (not_null), as a NaN loss does.
    p.expectations += [
        Expect.over(
            rows, inp.tables.view(rows, "values"), "median", p.expected, min_value=lo, max_value=hi
        ),
        Expect.over(rows, inp.tables.view(rows, "nulls"), "not_null", f"{c.metric} has no NaN"),
    ]
    each: Rows | None = None
    if c.per_step:
        each = inp.rows(c.metric, skip_first=c.skip_first)
        p.expected += "; " + _each_text(lo, c.metric, hi, c.mostly, c.skip_first).split("; ")[0]
        if each is None or each.n == 0:
            none_col = f"{p.prefix}__steps_after_warmup"
            p.columns[none_col] = 0
            p.expectations.append(Expect(none_col, "steps left after skip_first >= 1", min_value=1))
        else:
            label = _each_text(lo, c.metric, hi, c.mostly, c.skip_first)
            col = inp.tables.view(each, "nan_high")
            p.expectations.append(
                Expect.over(each, col, "each", label, min_value=lo, max_value=hi, mostly=c.mostly)
            )

    def render(outcomes: list[ExpectOutcome]) -> None:
        _, median, not_null, *per_step = outcomes
        value = _number(median.observed)
        p.perf["value"] = value if not_null.success else None  # type: ignore[index]
        p.observed = f"{num(value)} (median of {rows.n})"
        failures = []
        if not not_null.success:
            p.observed = f"nan (median of {rows.n})"
            failures.append(
                f"{c.metric} has NaN values: NaN at {_where(rows, [s for s, _ in not_null.unexpected])}"
            )
        elif value is not None and value < lo:  # type: ignore[operator]
            failures.append(
                f"{c.metric} {num(value)} s is below the lower bound ({where}): {RUNBOOK_BELOW}"
            )
        elif value is not None and value > hi:  # type: ignore[operator]
            failures.append(
                f"{c.metric} {num(value)} s is above the upper bound ({where}): {RUNBOOK_ABOVE}"
            )
        if per_step and each is not None and each.n:
            bad = per_step[0].unexpected
            p.observed += f"; {len(bad)} of {each.n} step(s) outside"
            if not per_step[0].success:
                failures.append(
                    f"{len(bad)} of {each.n} step(s) outside the bounds"
                    + (f" (mostly {num(c.mostly)})" if c.mostly < 1 else "")
                    + f": {_offending(each, bad)}"
                )
        elif per_step:
            failures.append(f"{c.metric} has no steps left after skip_first: {c.skip_first}")
        p.failure = "; ".join(failures) or p.failure

    p.render = render
