"""How each check type is observed: one planner per type, in the module of its family.

The modules mirror ``accelmatrix.spec.checks`` (``workload``, ``training``, ``ci``, ...):
a family's models there, its planners here. Every module of this package is imported
below, so adding a check type is a model module, a planner module and a test; nothing here
lists them. Importing the package checks that every registered model has a planner, so a
model without one fails the first import (and every test), not a cell at evaluation time.
"""

from __future__ import annotations

from accelmatrix.evaluation.checks.registry import Planner, planner_for, planners
from accelmatrix.spec.checks import CHECK_TYPES
from accelmatrix.spec.checks.registry import import_modules

__all__ = ["Planner", "planner_for", "planners"]

import_modules(__name__, __path__)

_unplanned = [t for t in CHECK_TYPES if t not in planners()]
_unknown = [t for t in planners() if t not in CHECK_TYPES]
if _unplanned or _unknown:
    raise ImportError(
        "the check registry and the planner table disagree: "
        f"no planner for {_unplanned or 'none'}, no model for {_unknown or 'none'} "
        "(a check type is a model in accelmatrix/spec/checks/ and a planner in "
        "accelmatrix/evaluation/checks/)"
    )
