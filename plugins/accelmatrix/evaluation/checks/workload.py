"""Planners of the workload checks (``exit_status``, ``log_*``, ``artifact_count``).

Models: accelmatrix.spec.checks.workload. The log checks read ``CellInputs.log_hits``: the
log is scanned once for all of them.
"""

from __future__ import annotations

import math
from typing import Any

from accelmatrix.evaluation.check_plan import CheckPlan, Expect, range_text
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.workload import (
    ArtifactCountCheck,
    ExitStatusCheck,
    LogContainsCheck,
    LogNotContainsCheck,
)


@planner(ExitStatusCheck)
def _plan_exit_status(c: ExitStatusCheck, p: CheckPlan, inp: CellInputs) -> None:
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


@planner(LogContainsCheck)
def _plan_log_contains(c: LogContainsCheck, p: CheckPlan, inp: CellInputs) -> None:
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


@planner(LogNotContainsCheck)
def _plan_log_not_contains(c: LogNotContainsCheck, p: CheckPlan, inp: CellInputs) -> None:
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


@planner(ArtifactCountCheck)
def _plan_artifact_count(c: ArtifactCountCheck, p: CheckPlan, inp: CellInputs) -> None:
    col = f"{p.prefix}__files"
    files_dir = inp.outputs.files_dir
    matched = sorted(x for x in files_dir.glob(c.glob) if x.is_file()) if files_dir.is_dir() else []
    n = len(matched)
    p.expected = range_text(c.min, f"files matching {c.glob!r}", c.max)
    p.observed = f"{n} file(s)" + ("" if files_dir.is_dir() else " (no files dir)")
    shown = ", ".join(str(x.relative_to(files_dir)) for x in matched[:5])
    p.failure = f"{n} file(s) under {files_dir} match {c.glob!r}" + (
        f" ({shown}{', ...' if n > 5 else ''})" if n else ""
    )
    p.columns = {col: n}
    p.expectations = [Expect(col, p.expected, min_value=c.min, max_value=c.max)]
