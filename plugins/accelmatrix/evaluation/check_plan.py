"""What a check planner produces: a ``CheckPlan`` of expectations, tables and verdict text.

Each check becomes a ``CheckPlan``: the expectations to run (described without importing
Great Expectations, so the planners stay testable and cheap), the table each one runs on,
and the human text for the verdict.

Two kinds of table:

* the cell's metrics tables (``metrics_table``): ``steps`` (one row per step, one column
  per metric) and ``scalars``. A check over a metric compiles to expectations that Great
  Expectations computes on those rows: ``ExpectColumnMedianToBeBetween`` and its kin for a
  reduced value, ``ExpectColumnValuesToBeBetween`` with ``mostly`` for every step,
  ``ExpectColumnValuesToNotBeNull`` for NaN and lost steps. GE computes the median and
  names the offending steps; the planner's ``render`` turns GE's outcome (``ExpectOutcome``)
  into the verdict text.
* ``observations``: a one-row table of values a planner observed itself, for checks that are
  not over a metric table (a log line count, an exit status, a file count). Each is "the
  value lies in [min, max]", compiled to ``ExpectColumnMaxToBeBetween`` (the max of a
  one-row column is the value). A value that could not be observed is a null cell, and that
  aggregate FAILS on null, whereas the column-map ``ExpectColumnValuesToBeBetween`` skips
  nulls and would let a missing value pass. Equality is ``min == max``; booleans are 0/1.

The text helpers every family's planner shares (``num``, ``range_text``, ...) live here too:
the verdict reads the same whichever check wrote it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from accelmatrix.evaluation.metrics_table import Condition, Rows
    from accelmatrix.evaluation.observe_inputs import CellInputs

__all__ = [
    "OBSERVATIONS",
    "CheckPlan",
    "Expect",
    "ExpectOutcome",
    "listed",
    "steps_text",
    "finite_or_none",
    "missing_metric",
    "num",
    "range_text",
    "slug",
]


OBSERVATIONS = "observations"  # the one-row table of values a planner observed itself

# What Great Expectations computes over the selected rows: an aggregate lies in the range
# (``max``, ``min``, ``mean``, ``median``), every row does (``each``, with ``mostly``), no
# row is null (``not_null``: a NaN value, or a step the metric was never logged at), every
# value is one of ``value_set`` (``in_set``), or no value repeats (``unique``).
Kind = Literal["max", "min", "mean", "median", "each", "not_null", "in_set", "unique"]


@dataclass(frozen=True)
class Expect:
    """One expectation: over ``column`` of ``table`` (the rows where ``condition`` holds),
    the ``kind`` of value lies in [min_value, max_value]; a None bound is open.

    GE-free on purpose; ``label`` is the text shown for it in Data Docs.
    """

    column: str
    label: str
    min_value: float | None = None
    max_value: float | None = None
    strict_min: bool = False
    kind: Kind = "max"
    table: str = OBSERVATIONS
    condition: Condition = ()
    mostly: float | None = None
    value_set: tuple[Any, ...] | None = None

    @classmethod
    def equals(cls, column: str, label: str, value: int) -> Expect:
        return cls(column, label, min_value=value, max_value=value)

    @classmethod
    def over(
        cls,
        rows: Rows,
        column: str,
        kind: Kind,
        label: str,
        *,
        min_value: float | None = None,
        max_value: float | None = None,
        mostly: float | None = None,
    ) -> Expect:
        """An expectation over ``column``, a view of a metric's ``rows`` in the metrics
        tables (``MetricsTable.view``)."""
        return cls(
            column,
            label,
            min_value=min_value,
            max_value=max_value,
            kind=kind,
            table=rows.table,
            mostly=mostly if mostly is not None and mostly < 1 else None,
        )


@dataclass
class ExpectOutcome:
    """What Great Expectations said of one expectation: the verdict text is built from it.

    ``unexpected`` lists the offending rows as (step, value), in step order, all of them (a
    cell id instead of a step in the run's table).
    """

    success: bool
    observed: Any = None
    unexpected: list[tuple[Any, Any]] = field(default_factory=list)
    element_count: int | None = None
    error: str | None = None


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
    # Table checks: fills observed/failure/success from GE's outcomes (one per expectation,
    # in the order of ``expectations``) once GE has run.
    render: Callable[[list[ExpectOutcome]], None] | None = None


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


MAX_SHOWN_ROWS = 5  # offending steps named in a verdict before "... (k of n)"


def steps_text(steps: list[int], *, of: int | None = None) -> str:
    """Steps as ranges, capped: ``5, 10, 15, 20, 25, ... (19 of 98)``, ``40-59``, ``37``.

    Consecutive steps collapse into ranges; past ``MAX_SHOWN_ROWS`` ranges the rest is
    counted, with ``of`` (the rows judged) when given.
    """
    runs: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:MAX_SHOWN_ROWS]]
    text = ", ".join(shown)
    if len(runs) > MAX_SHOWN_ROWS:
        text += ", ..."
    if len(runs) > MAX_SHOWN_ROWS or of is not None:
        count = len(set(steps))
        text += f" ({count} of {of})" if of is not None else f" ({count} steps)"
    return text


def listed(groups: list[tuple[str, str]]) -> str:
    """``missing 40-59; repeated 30-39``: each (label, items text) whose items are not
    empty, joined; a verdict lists only the kinds of fault it found."""
    return "; ".join(f"{label} {items}" for label, items in groups if items)
