"""Support rules: each value of one axis lists the values of another axis it works with.

A runtime x machine matrix is never a full product: an image built for one CUDA version
does not run on every GPU. The system accelmatrix replaces hard-wired "runtime R runs on
machines M1..Mk" into a shell script; here each runtime says it in its own axis value::

    axes:
      runtime:
        torch-venv: {python: ..., machines: [cpu-1, cpu-2]}
        system-python: {python: ..., machines: [cpu-1]}
      machine: [cpu-1, cpu-2]
    supports:
      - {axis: runtime, field: machines, of: machine}

and every unsupported pair is excluded with the reason "runtime system-python does not
support machine cpu-2", shown in the run plan like any other exclusion.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

_NAME = r"^[a-z][a-z0-9_]*$"


class SupportRule(BaseModel):
    """Values of `axis` list, in their mapping field `field`, the values of `of` they support."""

    model_config = ConfigDict(extra="forbid")

    axis: str = Field(pattern=_NAME, description="the axis whose values declare support")
    field: str = Field("machines", min_length=1, description="their field listing the values")
    of: str = Field("machine", pattern=_NAME, description="the axis those values belong to")


class AxesWithSupports(Protocol):
    """What the rules are applied to: a suite's axes and its support rules.

    A protocol, not ``Suite``: the suite model calls ``validate_supports`` from its own
    validator, so naming the model here would make the two modules import each other.
    """

    axes: Any
    supports: list[SupportRule]

    def axis_labels(self, axis: str) -> list[str]: ...


def validate_supports(suite: AxesWithSupports) -> None:
    """Raise ValueError naming the rule, value and field when a support rule cannot apply."""
    for i, rule in enumerate(suite.supports):
        where = f"supports[{i}]"
        for name in (rule.axis, rule.of):
            if name not in suite.axes:
                raise ValueError(f"{where}: no axis named {name!r} (axes: {', '.join(suite.axes)})")
        if rule.axis == rule.of:
            raise ValueError(f"{where}: axis and of must be different axes")
        values = suite.axes[rule.axis]
        if not isinstance(values, dict):
            raise ValueError(
                f"{where}: the values of axis {rule.axis!r} must be mappings with a "
                f"{rule.field!r} field (they are scalars)"
            )
        allowed = suite.axis_labels(rule.of)
        for label, value in values.items():
            listed = value.get(rule.field) if isinstance(value, dict) else None
            if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
                raise ValueError(
                    f"axes.{rule.axis}.{label}.{rule.field}: must list the {rule.of} values "
                    f"{label!r} supports (values: {', '.join(allowed)}), as required by {where}"
                )
            for want in listed:
                if not any(c in want for c in "*?[") and want not in allowed:
                    raise ValueError(
                        f"axes.{rule.axis}.{label}.{rule.field}: {want!r} is not a value of "
                        f"axis {rule.of!r} (values: {', '.join(allowed)})"
                    )


def unsupported_reason(suite: AxesWithSupports, axes: dict[str, str]) -> str | None:
    """Why a cell's combination is unsupported, or None when every rule allows it."""
    for rule in suite.supports:
        value: Any = suite.axes[rule.axis][axes[rule.axis]]  # type: ignore[index]
        listed = value[rule.field]
        other = axes[rule.of]
        if not any(fnmatch.fnmatchcase(other, w) for w in listed):
            return (
                f"{rule.axis} {axes[rule.axis]} does not support {rule.of} {other} "
                f"(supported: {', '.join(listed) or 'none'})"
            )
    return None
