"""Observations: what a cell's outputs say, computed in plain Python/pandas.

Each check becomes a ``CheckPlan``: the observed values (columns of a one-row DataFrame),
the expectations to run on them (described without importing Great Expectations, so this
module stays testable and cheap), and the human text for the verdict. Great Expectations
then only decides pass/fail on numbers we computed ourselves, which keeps the checks easy
to reason about and the GE suite small.

Every expectation is "the value lies in [min, max]", compiled to GE's
``ExpectColumnMaxToBeBetween`` (the max of a one-row column is the value). A value we could
not observe (missing metric, missing log, NaN loss) is a null cell, and that aggregate FAILS
on null, whereas the column-map ``ExpectColumnValuesToBeBetween`` skips nulls and would let
a missing metric pass. The aggregate is also ~5x cheaper per expectation, shows the observed
value in Data Docs, and avoids GE 1.24 Data Docs rendering bugs with failed set and pair
expectations. Equality is ``min == max``; booleans are stored as 0/1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix.evaluation.bounds import BoundsError
from accelmatrix.evaluation.observe_inference import plan_golden_cases
from accelmatrix.evaluation.observe_inputs import _Inputs
from accelmatrix.evaluation.report import CellOutputs
from accelmatrix.spec.checks import (
    ArtifactCountCheck,
    Check,
    ExitStatusCheck,
    FinalLossCheck,
    LogContainsCheck,
    LogNotContainsCheck,
    LossDecreasingCheck,
    MetricBetweenCheck,
    StepTimeWithinBoundsCheck,
)
from accelmatrix.spec.checks_inference import GoldenCasesCheck

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CheckPlan", "Expect", "observation_frame", "plan_checks"]

RUNBOOK_BELOW = (
    "if this follows an optimisation or dependency update, re-center the bounds; "
    "if nothing changed, widen the confidence interval"
)
RUNBOOK_ABOVE = (
    "a code change may have introduced a regression: find the cause before landing; "
    "if nothing changed, escalate to the hardware team"
)


@dataclass(frozen=True)
class Expect:
    """The value in ``column`` lies in [min_value, max_value]; a None bound is open.

    GE-free on purpose; ``label`` is the text shown for it in Data Docs.
    """

    column: str
    label: str
    min_value: float | None = None
    max_value: float | None = None
    strict_min: bool = False

    @classmethod
    def equals(cls, column: str, label: str, value: int) -> Expect:
        return cls(column, label, min_value=value, max_value=value)


@dataclass
class CheckPlan:
    """One check: observed values, expectations over them, and verdict text."""

    index: int
    name: str  # the check's display name
    prefix: str  # unique column prefix for this check's observations
    type: str
    expected: str
    observed: str
    columns: dict[str, Any] = field(default_factory=dict)
    expectations: list[Expect] = field(default_factory=list)
    failure: str = "check failed"  # the verdict message if any expectation fails
    success: str = "ok"
    severity: str = "error"  # "warning": a failure is reported but does not fail the cell
    # Perf checks: what perf history needs to group and judge the value (see PerfFields).
    perf: dict[str, Any] | None = None


def num(x: Any) -> str:
    """Short, exact-looking number text: 0.0 stays ``0.0``, long floats get 6 digits."""
    if x is None:
        return "missing"
    if isinstance(x, bool) or isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    text = repr(x)
    return text if len(text) <= 10 else f"{x:.6g}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "x"


def _finite_or_none(x: float | None) -> float | None:
    """NaN becomes null: "no observed value" in Data Docs, and a failure. inf stays a number."""
    return None if x is None or math.isnan(x) else x


def _reduce(series: pd.Series, how: str) -> float:
    """Reduce a series; NaN anywhere propagates, because a NaN loss is a failure signal."""
    if how == "last":
        return float(series.iloc[-1])
    return float(getattr(series, how)(skipna=False))


def _range_text(lo: float | None, subject: str, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{subject} == {num(lo)}" if lo == hi else f"{num(lo)} <= {subject} <= {num(hi)}"
    if lo is not None:
        return f"{subject} >= {num(lo)}"
    return f"{subject} <= {num(hi)}"


# -- one planner per check type -----------------------------------------------------------
def _plan_exit_status(c: ExitStatusCheck, p: CheckPlan, inp: _Inputs) -> None:
    code_col, timeout_col = f"{p.prefix}__exit_code", f"{p.prefix}__timed_out"
    p.expected = f"exit_code == {c.expected}, not timed out"
    status = inp.outputs.status
    if status is None:
        code, timed_out = None, None
        p.observed = "never ran (no status)"
        p.failure = "the workload never ran: no exit status was recorded"
    else:
        code = _exit_code(status.get("exit_code"))
        timed_out = int(bool(status.get("timed_out")))
        signal = f", signal {status['signal']}" if status.get("signal") else ""
        p.observed = f"{'timed out, ' if timed_out else ''}exit_code={code}{signal}"
        if timed_out:
            p.failure = f"the workload timed out (exit_code={code}{signal})"
        elif code is None:
            p.failure = "the workload has no exit code: it was killed or its status was lost"
        else:
            p.failure = f"the workload exited with {code}{signal}, expected {c.expected}"
    p.columns = {code_col: code, timeout_col: timed_out}
    p.expectations = [
        Expect.equals(code_col, f"exit code == {c.expected}", c.expected),
        Expect.equals(timeout_col, "did not time out (0 = no)", 0),
    ]


def _exit_code(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) else None


def _pattern_text(pattern: str, regex: bool) -> str:
    return f"matching /{pattern}/" if regex else f"containing {pattern!r}"


def _plan_log_contains(c: LogContainsCheck, p: CheckPlan, inp: _Inputs) -> None:
    col = f"{p.prefix}__matching_lines"
    hits = inp.log_hits[p.index]
    p.expected = f">= {c.min_count} log line(s) {_pattern_text(c.pattern, c.regex)}"
    if hits.count is None:
        p.observed = "log missing" if "does not exist" in (hits.error or "") else "error"
        p.failure = f"{hits.error} (did the workload run?)"
    else:
        p.observed = f"{hits.count} line(s)"
        p.failure = (
            f"found {hits.count} line(s) {_pattern_text(c.pattern, c.regex)} in "
            f"{inp.outputs.log_path.name}, need at least {c.min_count}"
        )
    p.columns = {col: hits.count}
    p.expectations = [Expect(col, p.expected, min_value=c.min_count)]


def _plan_log_not_contains(c: LogNotContainsCheck, p: CheckPlan, inp: _Inputs) -> None:
    col = f"{p.prefix}__matching_lines"
    hits = inp.log_hits[p.index]
    p.expected = f"no log line {_pattern_text(c.pattern, c.regex)}"
    if hits.count is None:
        # Absence cannot be proven without a log, so this fails rather than passes.
        p.observed = "log missing" if "does not exist" in (hits.error or "") else "error"
        p.failure = f"{hits.error}; cannot prove the pattern is absent"
    elif hits.count == 0:
        p.observed = "0 lines"
    else:
        shown = " | ".join(text.strip() for _, text in hits.lines)
        p.observed = f"{hits.count} line(s): {shown}"
        first_no, first = hits.lines[0]
        what = _pattern_text(c.pattern, c.regex)
        p.failure = (
            f"{hits.count} line(s) of {inp.outputs.log_path.name} {what}, "
            f"first at line {first_no}: {first.strip()}"
        )
    p.columns = {col: hits.count}
    p.expectations = [Expect(col, p.expected, max_value=0)]


def _plan_artifact_count(c: ArtifactCountCheck, p: CheckPlan, inp: _Inputs) -> None:
    col = f"{p.prefix}__files"
    files_dir = inp.outputs.files_dir
    matched = sorted(x for x in files_dir.glob(c.glob) if x.is_file()) if files_dir.is_dir() else []
    n = len(matched)
    p.expected = _range_text(c.min, f"files matching {c.glob!r}", c.max)
    p.observed = f"{n} file(s)" + ("" if files_dir.is_dir() else " (no files dir)")
    shown = ", ".join(str(x.relative_to(files_dir)) for x in matched[:5])
    p.failure = f"{n} file(s) under {files_dir} match {c.glob!r}" + (
        f" ({shown}{', ...' if n > 5 else ''})" if n else ""
    )
    p.columns = {col: n}
    p.expectations = [Expect(col, p.expected, min_value=c.min, max_value=c.max)]


def _missing_metric(p: CheckPlan, metric: str, inp: _Inputs) -> None:
    p.observed = "missing"
    p.failure = f"metric {metric!r} not found; metrics collected: {inp.metric_names}"


def _plan_metric_between(c: MetricBetweenCheck, p: CheckPlan, inp: _Inputs) -> None:
    subject = f"{c.reduce}({c.metric})"
    col = f"{p.prefix}__{c.reduce}_{_slug(c.metric)}"
    p.expected = _range_text(c.min, subject, c.max)
    series = inp.series(c.metric)
    value = None
    if series is None:
        _missing_metric(p, c.metric, inp)
    else:
        value = _reduce(series, c.reduce)
        p.observed = num(value)
        if math.isnan(value):
            p.failure = f"{subject} is NaN (the series has NaN values)"
        elif c.min is not None and value < c.min:
            p.failure = f"{subject} = {num(value)} is below the minimum {num(c.min)}"
        else:
            p.failure = f"{subject} = {num(value)} is above the maximum {num(c.max)}"
    p.columns = {col: _finite_or_none(value)}
    p.expectations = [Expect(col, p.expected, min_value=c.min, max_value=c.max)]


def _loss_target(c: FinalLossCheck, inp: _Inputs) -> tuple[float, float] | str:
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


def _plan_final_loss(c: FinalLossCheck, p: CheckPlan, inp: _Inputs) -> None:
    col = f"{p.prefix}__last_{_slug(c.metric)}"
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
        _missing_metric(p, c.metric, inp)
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
    p.columns = {col: _finite_or_none(value)}
    lo, hi = c.target - c.tolerance, c.target + c.tolerance
    p.expectations = [Expect(col, p.expected, min_value=lo, max_value=hi)]


def _plan_loss_decreasing(c: LossDecreasingCheck, p: CheckPlan, inp: _Inputs) -> None:
    n_col, drop_col = f"{p.prefix}__points", f"{p.prefix}__decrease_{_slug(c.metric)}"
    series = inp.series(c.metric)
    n = 0 if series is None else len(series)
    # Windows must not overlap, or a short series compares a mean with itself.
    w = max(1, min(c.window, n // 2))
    p.expected = f"mean(last {w}) < mean(first {w}) of {c.metric}, >= 2 points"
    first = last = None
    if series is None:
        _missing_metric(p, c.metric, inp)
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


def _plan_step_time(c: StepTimeWithinBoundsCheck, p: CheckPlan, inp: _Inputs) -> None:
    found_col = f"{p.prefix}__bounds_found"
    value_col = f"{p.prefix}__median_{_slug(c.metric)}"
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
    p.columns = {found_col: int(problem is None), value_col: _finite_or_none(value)}
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
        _missing_metric(p, c.metric, inp)
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


_PLANNERS: dict[type, Callable[[Any, CheckPlan, _Inputs], None]] = {
    ExitStatusCheck: _plan_exit_status,
    LogContainsCheck: _plan_log_contains,
    LogNotContainsCheck: _plan_log_not_contains,
    ArtifactCountCheck: _plan_artifact_count,
    MetricBetweenCheck: _plan_metric_between,
    FinalLossCheck: _plan_final_loss,
    LossDecreasingCheck: _plan_loss_decreasing,
    StepTimeWithinBoundsCheck: _plan_step_time,
    GoldenCasesCheck: plan_golden_cases,
}
from accelmatrix.evaluation import observe_runtime  # noqa: E402 (needs CheckPlan, Expect)
from accelmatrix.spec.checks_runtime import NotebooksCheck, ReportItemsCheck  # noqa: E402

_PLANNERS[NotebooksCheck] = observe_runtime.plan_notebooks
_PLANNERS[ReportItemsCheck] = observe_runtime.plan_report_items
from accelmatrix.evaluation import observe_cluster  # noqa: E402
from accelmatrix.spec.checks_cluster import WorkersStartedCheck  # noqa: E402

_PLANNERS[WorkersStartedCheck] = observe_cluster.plan_workers_started

from accelmatrix.evaluation.observe_ci import PLANNERS as _CI_PLANNERS  # noqa: E402

_PLANNERS.update(_CI_PLANNERS)


def plan_checks(checks: list[Check], outputs: CellOutputs, *, include_dir: Path) -> list[CheckPlan]:
    """Observe the cell's outputs once and turn every check into a ``CheckPlan``."""
    inp = _Inputs(checks, outputs, include_dir)
    plans = []
    for i, check in enumerate(checks):
        # Column prefix: index keeps it unique, type keeps it readable in Data Docs.
        plan = CheckPlan(
            index=i,
            name=check.display_name,
            prefix=f"c{i:02d}_{check.type}",
            type=check.type,
            expected="",
            observed="",
            severity=check.severity,
        )
        _PLANNERS[type(check)](check, plan, inp)
        plans.append(plan)
    return plans


def observation_frame(plans: list[CheckPlan]) -> pd.DataFrame:
    """The one-row DataFrame Great Expectations validates: one column per observation."""
    import pandas as pd

    return pd.DataFrame({col: [val] for plan in plans for col, val in plan.columns.items()})
