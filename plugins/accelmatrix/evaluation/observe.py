"""Observations: what a cell's outputs say about each of its checks, as ``CheckPlan``s.

The cell's outputs are read once (``CellInputs``: the log scanned for every log check, the
metric series, the bounds files); each check is then handed to the planner of its type
(``accelmatrix.evaluation.checks``), which computes the observed values in plain
Python/pandas and the expectations over them (``check_plan``). Great Expectations only
judges the one-row frame built here (``observation_frame``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix.evaluation.check_plan import CheckPlan
from accelmatrix.evaluation.checks import planner_for
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.evaluation.report import CellOutputs
from accelmatrix.spec.checks import Check

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["observation_frame", "plan_checks"]


def plan_checks(checks: list[Check], outputs: CellOutputs, *, include_dir: Path) -> list[CheckPlan]:
    """Observe the cell's outputs once and turn every check into a ``CheckPlan``."""
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
    return plans


def observation_frame(plans: list[CheckPlan]) -> pd.DataFrame:
    """The one-row DataFrame Great Expectations validates: one column per observation."""
    import pandas as pd

    return pd.DataFrame({col: [val] for plan in plans for col, val in plan.columns.items()})
