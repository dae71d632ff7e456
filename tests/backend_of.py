"""Build a backend class straight from a machine's JSON form, as a test writes it."""

from __future__ import annotations

from typing import Any

from accelmatrix.backends.machine_kinds import machine_of


def backend_of(cls: Any, machine: Any, *args: Any, **kwargs: Any) -> Any:
    """``cls`` built from ``machine`` (a dict is validated as its kind's model first)."""
    return cls(machine_of(machine) if isinstance(machine, dict) else machine, *args, **kwargs)
