"""Planners of the CI checks (``junit``, ``elapsed_regression``).

Models: accelmatrix.spec.checks.ci. Like every planner, these compute the numbers in
Python and leave Great Expectations only the "value in [min, max]" decisions; the failure
text is what a developer reads first, so it names the failed tests.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from accelmatrix.evaluation.check_plan import CheckPlan, Expect, missing_metric, num
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.metrics.junit import matching_files, parse_junit_glob
from accelmatrix.spec.checks.ci import ElapsedRegressionCheck, JunitCheck

__all__ = ["BaselineError", "load_baseline"]

MAX_NAMED_FAILURES = 10


@planner(JunitCheck)
def _plan_junit(c: JunitCheck, p: CheckPlan, inp: CellInputs) -> None:
    cols = {k: f"{p.prefix}__{k}" for k in ("files", "passed", "failed", "errored", "skipped")}
    files_dir = inp.outputs.files_dir
    files = matching_files(files_dir, c.glob)
    result, problems = parse_junit_glob(files_dir, c.glob)
    readable = bool(result.files)
    limits = [f"failed <= {c.max_failed}", f"errored <= {c.max_errored}"]
    limits.append(f"passed >= {c.min_passed}")
    if c.max_skipped is not None:
        limits.append(f"skipped <= {c.max_skipped}")
    p.expected = f"JUnit {c.glob}: " + ", ".join(limits)
    counts = {k: getattr(result, k) if readable else None for k in cols if k != "files"}
    p.columns = {cols["files"]: len(result.files), **{cols[k]: v for k, v in counts.items()}}
    p.expectations = [
        Expect(cols["files"], f"readable JUnit files matching {c.glob!r}", min_value=1),
        Expect(cols["failed"], f"failed tests <= {c.max_failed}", max_value=c.max_failed),
        Expect(cols["errored"], f"errored tests <= {c.max_errored}", max_value=c.max_errored),
        Expect(cols["passed"], f"passed tests >= {c.min_passed}", min_value=c.min_passed),
    ]
    if c.max_skipped is not None:
        p.expectations.append(
            Expect(cols["skipped"], f"skipped tests <= {c.max_skipped}", max_value=c.max_skipped)
        )
    if not readable:
        p.observed = "no report"
        why = "; ".join(problems) if problems else f"no file matches {c.glob!r} in {files_dir}"
        p.failure = f"no readable JUnit report: {why} (did the tests run?)"
        return
    p.observed = (
        f"{result.passed} passed, {result.failed} failed, {result.errored} errored, "
        f"{result.skipped} skipped ({len(files)} file(s))"
    )
    p.success = p.observed
    reasons = []
    if result.failed > c.max_failed or result.errored > c.max_errored:
        named = [str(f) for f in result.failures[:MAX_NAMED_FAILURES]]
        more = len(result.failures) - len(named)
        reasons.append(
            f"{result.failed} failed and {result.errored} errored "
            f"(allowed {c.max_failed}/{c.max_errored}): "
            + "; ".join(named)
            + (f"; and {more} more" if more > 0 else "")
        )
    if result.passed < c.min_passed:
        reasons.append(f"only {result.passed} passed, need at least {c.min_passed}")
    if c.max_skipped is not None and result.skipped > c.max_skipped:
        reasons.append(f"{result.skipped} skipped, at most {c.max_skipped} allowed")
    if problems:
        reasons.append("unreadable: " + "; ".join(problems))
    p.failure = "; ".join(reasons) or "JUnit limits not met"


class BaselineError(ValueError):
    """A baseline file is missing, malformed, or lacks the requested key."""


def load_baseline(path: Path, key: str, metric: str) -> float:
    """``baselines.<key>.<metric>`` of a baseline YAML file, as a positive number."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise BaselineError(f"baseline file {path} not found") from None
    except (OSError, yaml.YAMLError) as e:
        raise BaselineError(f"cannot read baseline file {path}: {e}") from None
    table = raw.get("baselines") if isinstance(raw, dict) else None
    if not isinstance(table, dict):
        raise BaselineError(f"baseline file {path} needs a mapping 'baselines: {{key: {{...}}}}'")
    if key not in table:
        known = ", ".join(sorted(map(str, table))) or "(none)"
        raise BaselineError(f"baseline {key!r} not found in {path}; available: {known}")
    entry = table[key]
    value = entry.get(metric) if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BaselineError(f"{path}: baselines.{key}.{metric} must be a number > 0, got {value!r}")
    return float(value)


@planner(ElapsedRegressionCheck)
def _plan_elapsed(c: ElapsedRegressionCheck, p: CheckPlan, inp: CellInputs) -> None:
    found_col, ratio_col = f"{p.prefix}__baseline_found", f"{p.prefix}__ratio"
    path = inp.include_dir / c.baseline_file
    p.expected = f"{c.metric} <= {num(c.max_ratio)} x baseline {c.baseline_key!r}"
    try:
        baseline: float | None = load_baseline(path, c.baseline_key, c.metric)
        problem = None
    except BaselineError as e:
        baseline, problem = None, str(e)
    series = inp.series(c.metric)
    value = None if series is None else float(series.iloc[-1])
    ratio = None
    if baseline is not None and value is not None and not math.isnan(value):
        ratio = value / baseline
    p.columns = {found_col: int(problem is None), ratio_col: ratio}
    p.expectations = [
        Expect.equals(found_col, f"baseline {c.baseline_key!r} in {c.baseline_file} (1 = yes)", 1),
        Expect(ratio_col, f"{c.metric} / baseline <= {num(c.max_ratio)}", max_value=c.max_ratio),
    ]
    if problem is not None:
        p.observed = "baseline unavailable"
        p.failure = problem
        return
    if series is None:
        missing_metric(p, c.metric, inp)
        return
    p.expected += f" ({num(baseline)} s)"
    p.observed = f"{num(value)} s = {num(ratio)} x baseline"
    p.success = f"{num(value)} s, {num(ratio)} x the baseline {num(baseline)} s"
    p.failure = (
        f"elapsed-time regression: {c.metric} {num(value)} s is {num(ratio)} x the baseline "
        f"{num(baseline)} s of {c.baseline_key!r} ({c.baseline_file}), above {num(c.max_ratio)}x"
    )
