"""What a check planner produces: a ``CheckPlan`` of observed values and ``Expect``ations.

Each check becomes a ``CheckPlan``: the observed values (columns of a one-row DataFrame),
the expectations to run on them (described without importing Great Expectations, so the
planners stay testable and cheap), and the human text for the verdict. Great Expectations
then only decides pass/fail on numbers we computed ourselves, which keeps the checks easy
to reason about and the GE suite small.

Every expectation is "the value lies in [min, max]", compiled to GE's
``ExpectColumnMaxToBeBetween`` (the max of a one-row column is the value). A value we could
not observe (missing metric, missing log, NaN loss) is a null cell, and that aggregate FAILS
on null, whereas the column-map ``ExpectColumnValuesToBeBetween`` skips nulls and would let
a missing metric pass. The aggregate is also ~5x cheaper per expectation, shows the observed
value in Data Docs, and avoids GE 1.24 Data Docs rendering bugs with failed set and pair
expectations. Equality is ``min == max``; booleans are stored as 0/1.

The text helpers every family's planner shares (``num``, ``range_text``, ...) live here too:
the verdict reads the same whichever check wrote it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelmatrix.evaluation.observe_inputs import CellInputs

__all__ = [
    "CheckPlan",
    "Expect",
    "finite_or_none",
    "missing_metric",
    "num",
    "range_text",
    "slug",
]


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


def slug(text: str) -> str:
    """``text`` as a column-name part: Data Docs and pandas both read it unquoted."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "x"


def finite_or_none(x: float | None) -> float | None:
    """NaN becomes null: "no observed value" in Data Docs, and a failure. inf stays a number."""
    return None if x is None or math.isnan(x) else x


def range_text(lo: float | None, subject: str, hi: float | None) -> str:
    """``lo <= subject <= hi`` with an open side left out, ``==`` when both are equal."""
    if lo is not None and hi is not None:
        return f"{subject} == {num(lo)}" if lo == hi else f"{num(lo)} <= {subject} <= {num(hi)}"
    if lo is not None:
        return f"{subject} >= {num(lo)}"
    return f"{subject} <= {num(hi)}"


def missing_metric(p: CheckPlan, metric: str, inp: CellInputs) -> None:
    """The verdict text of a check whose metric was never collected: it names what was."""
    p.observed = "missing"
    p.failure = f"metric {metric!r} not found; metrics collected: {inp.metric_names}"
