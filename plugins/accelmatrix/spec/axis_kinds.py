"""Typed axes: an axis whose values are validated by a domain module at suite load time.

    axis_kinds: {config: inference_model_config}

Every value of the axis goes through the kind's ``normalize(value, where)`` when the suite
is loaded (so before anything is provisioned): an invalid value is rejected with the file,
the field path and what is allowed; a valid one gets its defaults filled in, so
``${axis.config.dtype}`` works even when the YAML leaves dtype to its default. A kind may
also add env vars to each cell (``cell_env``) and a text for the plan table (``describe``).

Kinds are imported lazily by dotted path and must only import light modules (this runs at
DAG parse time).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Literal

AxisKind = Literal["inference_model_config"]

_KINDS: dict[str, str] = {
    "inference_model_config": "accelmatrix.inference.configs",
}


def _module(kind: str) -> ModuleType:
    return importlib.import_module(_KINDS[kind])


def normalize_axis(kind: str, axis: str, values: Any) -> dict[str, Any]:
    """Validate and normalize every value of one axis; raise ValueError naming the path."""
    if not isinstance(values, dict):
        raise ValueError(
            f"axes.{axis}: an axis of kind {kind} maps a name to each value "
            "(e.g. base: {deployment_framework: hf_transformers, dtype: float32})"
        )
    mod = _module(kind)
    problems, out = [], {}
    for label, value in values.items():
        try:
            out[label] = mod.normalize(value, f"axes.{axis}.{label}")
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))
    return out


def cell_extras(kinds: dict[str, str], values: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(env to add, plan-table notes) for one cell, from its typed axes' values."""
    env: dict[str, str] = {}
    notes: list[str] = []
    for axis, kind in kinds.items():
        mod = _module(kind)
        env.update(mod.cell_env(values[axis]))
        notes.append(mod.describe(values[axis]))
    return env, notes
