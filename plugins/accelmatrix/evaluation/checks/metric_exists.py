"""Planner of ``metric_exists``: how many finite values of the metric the cell collected.

Model: accelmatrix.spec.checks.metric_exists. The observed number is the count of finite
values (NaN, from an unparsable value or a diverged run, and inf do not count), and the
expectation is "at least one": a metric that is there but never a number is as useless to
every other check as one that is not there.
"""

from __future__ import annotations

import math

from accelmatrix.evaluation.check_plan import CheckPlan, Expect, slug
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.metric_exists import MetricExistsCheck

__all__ = ["plan_metric_exists"]


@planner(MetricExistsCheck)
def plan_metric_exists(c: MetricExistsCheck, p: CheckPlan, inp: CellInputs) -> None:
    col = f"{p.prefix}__finite_{slug(c.metric)}"
    series = inp.series(c.metric)
    values = [] if series is None else [float(v) for v in series]
    finite = sum(1 for v in values if math.isfinite(v))
    p.expected = "present"
    if not values:
        p.observed = "absent"
        p.failure = (
            f"metric {c.metric!r} is absent, expected present; "
            f"metrics collected: {inp.metric_names}"
        )
    elif finite == 0:
        p.observed = "only NaN" if all(math.isnan(v) for v in values) else "only NaN/inf"
        p.failure = (
            f"metric {c.metric!r} has {len(values)} value(s), none finite ({p.observed}), "
            "expected present"
        )
    else:
        p.observed = f"{finite} finite value(s)"
        p.success = f"metric {c.metric!r} present: {p.observed}"
    p.columns = {col: finite}
    p.expectations = [Expect(col, f"finite values of {c.metric} >= 1", min_value=1)]
