"""Planner of ``steps_complete``: every expected step of each metric, present once, finite.

Model: accelmatrix.spec.checks.steps. The metrics table has a row for every step the
check expects (``MetricsTable`` adds the ones nobody logged), so Great Expectations sees
the holes. Per metric, over the expected steps:

* ``ExpectColumnValuesToNotBeNull`` over the metric's ``finite`` view (``MetricsTable.view``):
  a step never logged, logged as NaN or as an infinity is null there; the verdict tells
  which from the table (``<metric>__logged``, the value itself);
* ``ExpectColumnValuesToBeBetween`` on ``<metric>__repeats`` with a max of 1, where a step
  was logged twice (the table keeps the last value; collect counts the rest).

The failure names the steps as ranges: ``loss: missing 40-59; repeated 30-39; NaN at 37``.
"""

from __future__ import annotations

import math

from accelmatrix.evaluation.check_plan import (
    CheckPlan,
    Expect,
    ExpectOutcome,
    listed,
    steps_text,
)
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.metrics_table import STEP
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.steps import StepsCompleteCheck

__all__ = ["plan_steps_complete"]


@planner(StepsCompleteCheck)
def plan_steps_complete(c: StepsCompleteCheck, p: CheckPlan, inp: CellInputs) -> None:
    expected = c.expected_steps()
    if expected is None:
        col = f"{p.prefix}__steps_known"
        p.expected = f"steps {c.first_step}..(first_step + steps - 1) of {', '.join(c.metrics)}"
        p.observed = f"steps = {c.steps!r}"
        p.failure = f"steps: {c.steps!r} is not a whole number >= 1 (after rendering)"
        p.columns = {col: 0}
        p.expectations = [Expect.equals(col, "steps is a whole number (1 = yes)", 1)]
        return
    first, last = expected.start, expected.stop - 1
    p.expected = f"steps {first}-{last} of {', '.join(c.metrics)}: each once, finite"
    absent: list[str] = []
    judged: list[tuple[str, int]] = []  # (metric, expectations of it)
    for metric in c.metrics:
        if inp.tables.logged(metric) is None:
            absent.append(metric)
            continue
        rows = inp.tables.rows_in(metric, expected)
        p.expectations.append(
            Expect.over(
                rows,
                inp.tables.view(rows, "finite"),
                "not_null",
                f"{metric}: a finite value at every step {first}-{last}",
            )
        )
        repeats = inp.tables.repeats_column(metric)
        if repeats is not None:
            counted = inp.tables.rows_in(metric, expected, column=repeats)
            p.expectations.append(
                Expect.over(
                    counted,
                    inp.tables.view(counted, "values"),
                    "each",
                    f"{metric}: every step logged once",
                    max_value=1,
                )
            )
        judged.append((metric, 2 if repeats else 1))
    if absent:
        col = f"{p.prefix}__absent_metrics"
        p.columns = {col: len(absent)}
        p.expectations.append(Expect.equals(col, f"metrics never logged: {absent}", 0))
    n = len(expected)

    def render(outcomes: list[ExpectOutcome]) -> None:
        problems = [f"{m}: no step at all (metrics collected: {inp.metric_names})" for m in absent]
        faults = 0
        at = 0
        for metric, count in judged:
            nulls, *repeats = outcomes[at : at + count]
            at += count
            value_at = dict(
                zip(
                    inp.tables.steps[STEP].tolist(),
                    inp.tables.steps[metric].tolist(),
                    strict=True,
                )
            )
            logged = dict(
                zip(
                    inp.tables.steps[STEP].tolist(),
                    inp.tables.logged(metric).tolist(),  # type: ignore[union-attr]
                    strict=True,
                )
            )
            bad = [s for s, _ in nulls.unexpected]
            missing = [s for s in bad if not logged.get(s)]
            nan = [s for s in bad if logged.get(s) and math.isnan(value_at[s])]
            infinite = [s for s in bad if logged.get(s) and math.isinf(value_at[s])]
            repeated = [s for s, _ in repeats[0].unexpected] if repeats else []
            text = listed(
                [
                    ("missing", steps_text(missing) if missing else ""),
                    ("repeated", steps_text(repeated) if repeated else ""),
                    ("NaN at", steps_text(nan) if nan else ""),
                    ("infinite at", steps_text(infinite) if infinite else ""),
                ]
            )
            faults += len(bad) + len(repeated)
            if text:
                problems.append(f"{metric}: {text}")
        p.observed = (
            f"all {n} step(s) complete"
            if not problems
            else f"{faults} faulty step(s)"
            + (f", {len(absent)} metric(s) absent" if absent else "")
        )
        p.failure = "; ".join(problems) or p.failure
        p.success = f"steps {first}-{last} of {', '.join(c.metrics)}: each once, finite"

    p.render = render
