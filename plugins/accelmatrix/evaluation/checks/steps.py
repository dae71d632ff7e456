"""Planner of ``steps_complete``: every expected step of each metric, present once, finite.

Model: accelmatrix.spec.checks.steps. The metrics table has a row for every step the
check expects (``MetricsTable`` adds the ones nobody logged), so Great Expectations sees
the holes. Per metric, over the expected steps:

* ``ExpectColumnValuesToNotBeNull``: a step never logged and a step logged as NaN are both
  null there; the ``<metric>__logged`` column tells the verdict which is which;
* ``ExpectColumnValuesToBeBetween`` with the largest finite float as bounds: an infinite
  value;
* ``ExpectColumnValuesToBeBetween`` on ``<metric>__repeats`` with a max of 1: a step
  logged twice (the table keeps the last value; collect counts the rest).

The failure names the steps as ranges: ``loss: missing 40-59; repeated 30-39; NaN at 37``.
"""

from __future__ import annotations

import sys

from accelmatrix.evaluation.check_plan import CheckPlan, Expect, ExpectOutcome, steps_text
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.metrics_table import STEP, STEPS_TABLE
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.steps import StepsCompleteCheck

__all__ = ["plan_steps_complete"]

_LARGEST = sys.float_info.max


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
    in_range = ((STEP, ">=", first), (STEP, "<=", last))
    absent: list[str] = []
    judged: list[tuple[str, int]] = []  # (metric, expectations of it)
    for metric in c.metrics:
        if inp.tables.logged(metric) is None:
            absent.append(metric)
            continue
        count = 3 if inp.tables.repeats_column(metric) else 2
        judged.append((metric, count))
        p.expectations += [
            Expect(
                metric,
                f"{metric}: a value at every step {first}-{last}",
                kind="not_null",
                table=STEPS_TABLE,
                condition=in_range,
            ),
            Expect(
                metric,
                f"{metric}: every value finite",
                min_value=-_LARGEST,
                max_value=_LARGEST,
                kind="each",
                table=STEPS_TABLE,
                condition=in_range,
            ),
        ]
        if count == 3:
            p.expectations.append(
                Expect(
                    f"{metric}__repeats",
                    f"{metric}: every step logged once",
                    max_value=1,
                    kind="each",
                    table=STEPS_TABLE,
                    condition=in_range,
                )
            )
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
            nulls, finite, *repeats = outcomes[at : at + count]
            at += count
            logged = dict(
                zip(
                    inp.tables.steps[STEP].tolist(),
                    inp.tables.logged(metric).tolist(),  # type: ignore[union-attr]
                    strict=True,
                )
            )
            null_steps = [s for s, _ in nulls.unexpected]
            missing = [s for s in null_steps if not logged.get(s)]
            nan = [s for s in null_steps if logged.get(s)]
            parts = []
            if missing:
                parts.append(f"missing {steps_text(missing)}")
            if repeats and repeats[0].unexpected:
                parts.append(f"repeated {steps_text([s for s, _ in repeats[0].unexpected])}")
            if nan:
                parts.append(f"NaN at {steps_text(nan)}")
            if finite.unexpected:
                parts.append(f"infinite at {steps_text([s for s, _ in finite.unexpected])}")
            faults += len(missing) + len(nan) + len(finite.unexpected)
            faults += len(repeats[0].unexpected) if repeats else 0
            if parts:
                problems.append(f"{metric}: " + "; ".join(parts))
        p.observed = (
            f"all {n} step(s) complete"
            if not problems
            else f"{faults} faulty step(s)"
            + (f", {len(absent)} metric(s) absent" if absent else "")
        )
        p.failure = "; ".join(problems) or p.failure
        p.success = f"steps {first}-{last} of {', '.join(c.metrics)}: each once, finite"

    p.render = render
