"""Observations: what a cell's outputs say about each of its checks, as ``CheckPlan``s.

The cell's outputs are read once (``CellInputs``: the log scanned for every log check, the
metric series, the bounds files); each check is then handed to the planner of its type
(``accelmatrix.evaluation.checks``), which compiles it to expectations over the cell's
metrics tables, or over values it observed itself (``check_plan``). ``tables`` hands Great
Expectations every table: the metrics tables and the one-row ``observations``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix.contracts.check_verdicts import CellOutputs
from accelmatrix.evaluation.check_plan import OBSERVATIONS, CheckPlan
from accelmatrix.evaluation.checks import planner_for
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks import Check

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["plan_cell", "plan_checks", "tables"]


def plan_checks(checks: list[Check], outputs: CellOutputs, *, include_dir: Path) -> list[CheckPlan]:
    """Every check of the cell as a ``CheckPlan`` (``plan_cell`` also returns the tables)."""
    return plan_cell(checks, outputs, include_dir=include_dir)[0]


def plan_cell(
    checks: list[Check], outputs: CellOutputs, *, include_dir: Path
) -> tuple[list[CheckPlan], CellInputs]:
    """Read the cell's outputs once and turn every check into a ``CheckPlan``."""
    inp = CellInputs(checks, outputs, include_dir)
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
        planner_for(check.type)(check, plan, inp)
        plans.append(plan)
    return plans, inp


def tables(plans: list[CheckPlan], inp: CellInputs) -> dict[str, pd.DataFrame]:
    """Every table Great Expectations validates: the metrics tables, and the one-row
    ``observations`` of the values planners observed themselves (one column each)."""
    import pandas as pd

    observed = pd.DataFrame({col: [val] for plan in plans for col, val in plan.columns.items()})
    return {OBSERVATIONS: observed, **inp.tables.frames()}
