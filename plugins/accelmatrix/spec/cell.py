"""CellSpec: one cell of a run's plan, typed, from the plan task to the gate.

The plan (``accelmatrix.spec.plan``) renders a suite's placeholders for each combination of
its axes and validates the result once as a ``CellSpec``: its machine is the backend's own
machine model, its workload the suite's ``Workload`` model, its checks the registered check
models. Every step, operator and trigger takes this object. It becomes JSON only where it
must cross a process boundary: the results store's ``cell_specs`` row the plan writes and
each task reads back (``to_json`` / ``from_json``), and a trigger's kwargs.

The workload keeps the backend's own placeholders (``${work_dir}``, ``${python}``): they
are filled in on the machine, with the values the backend knows only after provisioning.

``timeouts`` gives the cell's ``CellTimeouts`` (accelmatrix.spec.timeouts), the one rule
for how long each part of it may take.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from accelmatrix.spec.checks import Check
from accelmatrix.spec.suite import Machine
from accelmatrix.spec.suite_parts import Workload
from accelmatrix.spec.timeouts import CellTimeouts

__all__ = ["CellSpec"]


class CellSpec(BaseModel):
    """What one cell runs, where, and how it is judged (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str  # `runtime=pt213,machine=cpu-small`: the cell's name in the grid and the store
    index: int  # its place in the plan (and its map index)
    axes: dict[str, str]  # axis -> label
    values: dict[str, Any]  # axis -> the value behind the label (a dict for a typed axis)
    machine: str  # the suite's machine name
    backend: str  # the machine's backend kind (`local`, `tpu-vm`, ...)
    pool: str
    machine_spec: Machine
    workload: Workload
    checks: list[Check]
    quarantined: bool = False
    quarantine_reason: str | None = None
    notes: list[str] = []  # plan-table text from typed axes

    @cached_property
    def machine_json(self) -> dict[str, Any]:
        """The machine as JSON (pricing, the janitor's list of machines); backends take
        ``machine_spec``, the model itself."""
        return self.machine_spec.model_dump(mode="json")

    @property
    def expected_exit(self) -> int:
        """The exit code the workload should end with (its ``exit_status`` check)."""
        return next((c.expected for c in self.checks if c.type == "exit_status"), 0)

    @property
    def timeouts(self) -> CellTimeouts:
        return CellTimeouts(setup_s=self.workload.setup_timeout, workload_s=self.workload.timeout)

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in ``cell_specs`` and carried in a trigger's kwargs."""
        return self.model_dump(mode="json")

    def serialize(self) -> dict[str, Any]:
        """The JSON form, for Airflow's rendered-template view of a step's ``cell`` field
        (the Task SDK serialises a template field through its ``serialize()``)."""
        return self.to_json()

    @classmethod
    def from_json(cls, value: CellSpec | dict[str, Any]) -> CellSpec:
        """A cell back from its JSON form (a ``CellSpec`` passes through)."""
        return value if isinstance(value, cls) else cls.model_validate(value)
