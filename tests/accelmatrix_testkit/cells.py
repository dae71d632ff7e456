"""A cell built by hand, for tests that drive one step of a cell's life without a plan."""

from __future__ import annotations

from typing import Any

from accelmatrix.spec.cell import CellSpec


def bare_cell(cell_id: str, machine_spec: dict[str, Any], machine: str) -> CellSpec:
    """The cell ``axis=value`` on ``machine_spec`` (the suite's machine ``machine``), with a
    no-op workload and no checks."""
    axis, value = cell_id.split("=", 1)
    return CellSpec(
        id=cell_id,
        index=0,
        axes={axis: value},
        values={axis: value},
        machine=machine,
        backend=machine_spec["backend"],
        pool=f"accelmatrix_{machine}",
        machine_spec=machine_spec,
        workload={"run": ["true"]},
        checks=[],
    )
