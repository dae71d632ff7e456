"""The one planner table: check ``type`` -> the function that observes it in a cell's outputs.

A planner fills a ``CheckPlan`` from a check and the cell's parsed outputs (``CellInputs``).
Each family module of ``accelmatrix.evaluation.checks`` decorates its planners with
``@planner(Model)``, keyed by the same ``type`` tag as the model's registration in
``accelmatrix.spec.checks.registry``; the package checks that every model has exactly one.
Separate from the spec's table because planners may read files and use pandas, which
suite validation (at DAG parse time) must never import.

The bottom of the package: it imports no family module, so families import it freely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accelmatrix.spec.checks.registry import check_type_of

if TYPE_CHECKING:
    from pydantic import BaseModel

    from accelmatrix.evaluation.check_plan import CheckPlan
    from accelmatrix.evaluation.observe_inputs import CellInputs

__all__ = ["Planner", "planner", "planner_for", "planners"]

Planner = Callable[[Any, "CheckPlan", "CellInputs"], None]

_PLANNERS: dict[str, Planner] = {}


def planner(model: type[BaseModel]) -> Callable[[Planner], Planner]:
    """Decorator: the planner of ``model``'s check type. A second one for a type raises."""
    tag = check_type_of(model)

    def add(fn: Planner) -> Planner:
        known = _PLANNERS.get(tag)
        if known is not None and _name(known) != _name(fn):
            raise ValueError(
                f"check type {tag!r} has two planners: {known.__module__}.{known.__qualname__} "
                f"and {fn.__module__}.{fn.__qualname__}"
            )
        _PLANNERS[tag] = fn
        return fn

    return add


def _name(obj: Any) -> str:
    """Module and qualified name: the same function imported again (a reload) is no duplicate."""
    return f"{obj.__module__}.{obj.__qualname__}"


def planners() -> dict[str, Planner]:
    """Every check type with a planner, and its planner (a copy)."""
    return dict(_PLANNERS)


def planner_for(tag: str) -> Planner:
    """The planner of check type ``tag``; KeyError naming the types that have one."""
    try:
        return _PLANNERS[tag]
    except KeyError:
        known = ", ".join(sorted(_PLANNERS)) or "none"
        raise KeyError(f"no planner for check type {tag!r} (planned: {known})") from None
