"""Planner of the `golden_cases` check: read the case runner's results JSONL.

Model: accelmatrix.spec.checks.inference.
"""

from __future__ import annotations

import json
from typing import Any

from accelmatrix.evaluation.check_plan import CheckPlan, Expect
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.inference import GoldenCasesCheck

MAX_NAMED = 5  # failing cases quoted in the verdict


def read_results(path: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of a results JSONL and a problem text (missing file, bad line), if any."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], f"results file {path} does not exist (did the case runner run?)"
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return rows, f"{path.name} line {n} is not JSON"
        if isinstance(row, dict):
            rows.append(row)
    return rows, None


@planner(GoldenCasesCheck)
def plan_golden_cases(c: GoldenCasesCheck, p: CheckPlan, inp: CellInputs) -> None:
    failed_col, ran_col = f"{p.prefix}__failed_cases", f"{p.prefix}__ran_cases"
    rows, problem = read_results(inp.outputs.files_dir / c.results)
    by_status: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_status.setdefault(str(r.get("status")), []).append(r)
    failed = by_status.get("failed", [])
    ran = len(rows) - len(by_status.get("skipped", []))
    p.expected = f"<= {c.max_failed} failed golden case(s), >= {c.min_cases} run"
    if problem and not rows:
        p.observed = "no results"
        p.failure = problem
        p.columns = {failed_col: None, ran_col: None}
    else:
        p.observed = ", ".join(
            f"{len(by_status.get(s, []))} {s}" for s in ("passed", "failed", "unchecked", "skipped")
        )
        if len(failed) > c.max_failed:
            named = "; ".join(
                f"{r.get('id') or r.get('name')}: {r.get('reason')}" for r in failed[:MAX_NAMED]
            )
            more = f" (and {len(failed) - MAX_NAMED} more)" if len(failed) > MAX_NAMED else ""
            p.failure = f"{len(failed)} of {ran} golden case(s) failed: {named}{more}"
        else:
            p.failure = f"only {ran} case(s) ran, need at least {c.min_cases}"
        if problem:
            p.failure += f" ({problem})"
        p.success = f"{ran} case(s) ran, {len(failed)} failed"
        p.columns = {failed_col: len(failed), ran_col: ran}
    p.expectations = [
        Expect(failed_col, f"failed golden cases <= {c.max_failed}", max_value=c.max_failed),
        Expect(ran_col, f"golden cases run >= {c.min_cases}", min_value=c.min_cases),
    ]
