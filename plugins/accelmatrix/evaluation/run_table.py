"""The run's table of cells, validated by Great Expectations at the gate.

Each cell is judged on its own outputs (``evaluate``); what only the whole run can show is
judged here, over one row per planned cell: its state, exit code, machine time, how many of
its checks failed, and each perf metric's observed value. Every run is held to:

* every planned cell (excluded ones aside) reported exactly once, and nothing else did;
* every planned cell has a verdict (a passed or failed state, not ``running``);
* no cell in the passed state has a failed check.

A suite adds ``run_checks`` (``accelmatrix.spec.run_checks``), such as ``cells_agree``: the
cells of one model agree on step time within a ratio on machines of one kind. A failed run
expectation fails the run, with its message, as a failed cell does. The run's Data Docs
list the offending cells.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix.cell_state import EARLIER_FAILURES, CellState
from accelmatrix.contracts.run_records import CellRecord, CheckRecord
from accelmatrix.evaluation.check_plan import CheckPlan, Expect, ExpectOutcome, listed, num
from accelmatrix.evaluation.gx_suite import run_suite
from accelmatrix.spec.run_checks import CellsAgreeCheck

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CELLS", "RunValidation", "run_frame", "validate_run"]

CELLS = "cells"  # the table's name; its rows are named by the ``cell`` column
VERDICTS = (CellState.PASSED.value, CellState.FAILED.value, *(str(s) for s in EARLIER_FAILURES))
MAX_NAMED = 5  # cells named in a message before "... (k cells)"


@dataclass
class RunValidation:
    """The run's expectations: ``failures`` say which failed and name the cells."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    data_docs_index: Path | None = None
    seconds: float = 0.0


def run_frame(
    planned: list[dict[str, Any]],
    rows: list[CellRecord],
    checks: list[CheckRecord],
) -> pd.DataFrame:
    """One row per planned cell, plus one per reported cell that was not planned.

    ``planned`` are the plan's cells, ``rows`` the store's cell rows of the run (an excluded
    cell's row is left out), ``checks`` its check rows.
    """
    import pandas as pd

    reported: dict[str, int] = {}
    by_id: dict[str, CellRecord] = {}
    for r in rows:
        if r.state == CellState.EXCLUDED:
            continue
        reported[r.cell_id] = reported.get(r.cell_id, 0) + 1
        by_id[r.cell_id] = r
    failed: dict[str, int] = {}
    perf: dict[str, dict[str, float]] = {}
    for c in checks:
        if not c.passed:
            failed[c.cell_id] = failed.get(c.cell_id, 0) + 1
        if c.metric and c.value is not None:
            perf.setdefault(c.metric, {})[c.cell_id] = float(c.value)
    ids = [c["id"] for c in planned] + [i for i in by_id if i not in {c["id"] for c in planned}]
    planned_ids = {c["id"] for c in planned}
    frame: dict[str, list[Any]] = {
        "cell": ids,
        "planned": [int(i in planned_ids) for i in ids],
        "reported": [reported.get(i, 0) for i in ids],
        "state": [by_id[i].state if i in by_id else "missing" for i in ids],
        "exit_code": [by_id[i].exit_code if i in by_id else None for i in ids],
        "held_seconds": [by_id[i].resource_held_seconds if i in by_id else None for i in ids],
        "failed_checks": [failed.get(i, 0) for i in ids],
    }
    for metric, values in sorted(perf.items()):
        frame[f"perf:{metric}"] = [values.get(i, math.nan) for i in ids]
    return pd.DataFrame(frame).astype({"exit_code": "float64", "held_seconds": "float64"})


def _named(cells: list[Any], extra: dict[Any, str] | None = None) -> str:
    shown = [f"{c} ({extra[c]})" if extra and c in extra else str(c) for c in cells[:MAX_NAMED]]
    more = f", ... ({len(cells)} cells)" if len(cells) > MAX_NAMED else ""
    return ", ".join(shown) + more


def _plans(
    frame: pd.DataFrame, planned: list[dict[str, Any]], run_checks: list[CellsAgreeCheck]
) -> list[CheckPlan]:
    """The run's expectations, as check plans over the ``cells`` table."""
    state_of = dict(zip(frame["cell"], frame["state"], strict=True))
    plans = []

    once = CheckPlan(0, "every planned cell reported once", "c00", "run", "", "")
    once.expected = "each planned cell has exactly one result row; no other cell has one"
    once.expectations = [
        Expect("reported", "reported exactly once", 1, 1, kind="each", table=CELLS),
        Expect("planned", "only planned cells reported", 1, 1, kind="each", table=CELLS),
    ]

    def render_once(outcomes: list[ExpectOutcome]) -> None:
        never = [c for c, n in outcomes[0].unexpected if n == 0]
        twice = [c for c, n in outcomes[0].unexpected if n and n > 1]
        unplanned = [c for c, _ in outcomes[1].unexpected]
        text = listed(
            [
                ("never reported:", _named(never) if never else ""),
                ("reported more than once:", _named(twice) if twice else ""),
                ("reported but not planned:", _named(unplanned) if unplanned else ""),
            ]
        )
        once.observed = f"{len(never) + len(twice) + len(unplanned)} cell(s) off"
        once.failure = text or once.failure

    once.render = render_once
    plans.append(once)

    verdict = CheckPlan(1, "every planned cell has a verdict", "c01", "run", "", "")
    verdict.expected = "state is a verdict: " + ", ".join(VERDICTS)
    verdict.expectations = [
        Expect(
            "state",
            verdict.expected,
            kind="in_set",
            table=CELLS,
            condition=(("planned", "==", 1),),
            value_set=VERDICTS,
        )
    ]

    def render_verdict(outcomes: list[ExpectOutcome]) -> None:
        cells = [c for c, _ in outcomes[0].unexpected]
        verdict.observed = f"{len(cells)} cell(s) without a verdict"
        verdict.failure = f"no verdict: {_named(cells, state_of)}"

    verdict.render = render_verdict
    plans.append(verdict)

    consistent = CheckPlan(2, "no passed cell has a failed check", "c02", "run", "", "")
    consistent.expected = "failed checks == 0 where state == passed"
    consistent.expectations = [
        Expect(
            "failed_checks",
            consistent.expected,
            max_value=0,
            kind="each",
            table=CELLS,
            condition=(("state", "==", CellState.PASSED.value),),
        )
    ]

    def render_consistent(outcomes: list[ExpectOutcome]) -> None:
        cells = {c: f"{n} failed check(s)" for c, n in outcomes[0].unexpected}
        consistent.observed = f"{len(cells)} passed cell(s) with a failed check"
        consistent.failure = f"passed with a failed check: {_named(list(cells), cells)}"

    consistent.render = render_consistent
    plans.append(consistent)

    for i, check in enumerate(run_checks, start=len(plans)):
        plans.append(_cells_agree(i, check, frame, planned))
    return plans


def _cells_agree(
    index: int, check: CellsAgreeCheck, frame: pd.DataFrame, planned: list[dict[str, Any]]
) -> CheckPlan:
    """Each cell's value over the smallest of its group, which GE holds to ``within``.

    The group minimum is the one number computed here (a ratio needs a reference); GE
    judges every cell's ratio and names the cells beyond it.
    """
    plan = CheckPlan(index, check.display_name, f"c{index:02d}", "cells_agree", "", "")
    column = f"perf:{check.metric}"
    ratio_column = f"c{index:02d}_ratio_{check.metric}"
    plan.expected = f"{check.metric} <= {num(check.within)} x the fastest cell of its group"
    by_cell = {c["id"]: c for c in planned}

    def group(cell: str) -> tuple[Any, ...]:
        c = by_cell.get(cell) or {}
        kind = (c.get("machine_spec") or {}).get("backend") if check.same_machine_kind else None
        return (*((c.get("axes") or {}).get(a) for a in check.by), kind)

    values = frame[column].tolist() if column in frame else [math.nan] * len(frame)
    smallest: dict[tuple[Any, ...], float] = {}
    for cell, v in zip(frame["cell"], values, strict=True):
        if v is not None and math.isfinite(v) and v > 0:
            key = group(cell)
            smallest[key] = min(v, smallest.get(key, v))
    ratios = [
        v / smallest[group(cell)] if group(cell) in smallest and math.isfinite(v) else math.nan
        for cell, v in zip(frame["cell"], values, strict=True)
    ]
    frame[ratio_column] = ratios
    plan.expectations = [
        Expect(ratio_column, plan.expected, max_value=check.within, kind="each", table=CELLS)
    ]
    judged = sum(1 for r in ratios if math.isfinite(r))

    def render(outcomes: list[ExpectOutcome]) -> None:
        slow = {c: f"{r:.2f}x" for c, r in outcomes[0].unexpected}
        plan.observed = f"{len(slow)} of {judged} cell(s) beyond {num(check.within)}x"
        plan.failure = (
            f"{len(slow)} cell(s) more than {num(check.within)}x the fastest of their group "
            f"on {check.metric}: {_named(list(slow), slow)}"
        )
        if judged == 0:
            plan.observed = f"no cell has a {check.metric} value"

    plan.render = render
    return plan


def validate_run(
    planned: list[dict[str, Any]],
    rows: list[CellRecord],
    checks: list[CheckRecord],
    *,
    run_checks: list[CellsAgreeCheck] | None = None,
    suite_name: str = "run",
    data_docs_dir: Path | None = None,
) -> RunValidation:
    """Validate the run's table of cells; with ``data_docs_dir``, its Data Docs go there."""

    started = time.perf_counter()
    frame = run_frame(planned, rows, checks)
    plans = _plans(frame, planned, list(run_checks or []))
    run = run_suite(
        plans,
        {CELLS: frame},
        suite_name=suite_name,
        data_docs_dir=data_docs_dir,
        index_columns={CELLS: "cell"},
    )
    failures = []
    for plan in plans:
        passed, error = run.outcome(plan)
        if plan.render is not None and len(run.outcomes(plan)) == len(plan.expectations):
            plan.render(run.outcomes(plan))
        if not passed:
            failures.append(
                f"{plan.name}: {plan.failure}"
                + (f" (Great Expectations error: {error})" if error else "")
            )
    return RunValidation(
        passed=not failures,
        failures=failures,
        data_docs_index=run.data_docs_index,
        seconds=time.perf_counter() - started,
    )
