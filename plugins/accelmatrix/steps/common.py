"""Shared plumbing of the cell steps: which run a step belongs to (RunRef), the clock, the
failure Airflow must not retry, and the helpers several steps use to record a failure or read
a cell's JSON files. Every step module imports from here; nothing here imports a step."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix import settings
from accelmatrix.cell_state import EARLIER_FAILURES
from accelmatrix.results import results_store
from accelmatrix.results.fence import StepTry
from accelmatrix.spec.cell import CellSpec

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class RunRef:
    """Which DAG run a step belongs to."""

    dag_id: str
    run_id: str
    # The mapped task group and map index of the asking task: resources carry them as
    # labels so the janitor can ask Airflow whether the cell's tasks still run.
    task_group: str | None = None
    map_index: int | None = None
    # The asking task try: fences the cell's row against an older try of the same task that
    # still runs after Airflow moved on (results/fence.py). None outside a task (triggers).
    task_id: str | None = None
    try_number: int | None = None

    @property
    def fence(self) -> StepTry | None:
        if self.task_id is None or self.try_number is None:
            return None
        return StepTry(self.task_id, self.try_number)

    def artifacts(self, cell_id: str) -> Path:
        return settings.cell_artifacts_dir(self.dag_id, self.run_id, cell_id)

    @classmethod
    def from_context(cls, context: Any) -> RunRef:
        """The run of an Airflow task context."""
        ti = context.get("ti") if hasattr(context, "get") else None
        map_index = getattr(ti, "map_index", None)
        task_id = str(getattr(ti, "task_id", "") or "")
        mapped = isinstance(map_index, int) and map_index >= 0 and "." in task_id
        try_number = getattr(ti, "try_number", None)
        return cls(
            dag_id=context["dag"].dag_id,
            run_id=context["run_id"],
            task_group=task_id.rsplit(".", 1)[0] if mapped else None,
            map_index=map_index if mapped else None,
            task_id=task_id or None,
            try_number=try_number if isinstance(try_number, int) else None,
        )


class CellFailed(AirflowFailException):
    """A cell (or the run) failed its checks: deterministic, so Airflow must not retry."""


def _record_step_failure(cell: CellSpec, ref: RunRef, state: str, message: str) -> None:
    log.error("cell %s: %s", cell.id, message)
    store = results_store()
    prior = store.get_cell(ref.dag_id, ref.run_id, cell.id)
    if prior is not None and prior.state in EARLIER_FAILURES and prior.state != state:
        state = prior.state
        if prior.message:
            message = f"{prior.message}; {message}"
    store.upsert_cell(
        ref.dag_id, ref.run_id, cell.id, fence=ref.fence, state=state, message=message[:4000]
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class CellRef(TypedDict):
    """What the DAG maps over for one cell (the JSON Airflow stores as the mapped value): its
    name in the grid (id), its place in the plan (index) and what a multi-machine suite's
    per-machine selector filters on (machine)."""

    id: str
    index: int
    machine: str


def cell_refs(cells: list[CellSpec]) -> list[CellRef]:
    """What the DAG maps over: a small reference per planned cell (see the module doc)."""
    return [CellRef(id=c.id, index=c.index, machine=c.machine) for c in cells]


def cell_spec(ref: RunRef, cell: CellRef | CellSpec) -> CellSpec:
    """The planned cell that ``cell`` (a reference, or already a cell) stands for."""
    return planned_cells(ref, [cell])[0]


def planned_cells(ref: RunRef, cells: list[CellRef] | list[CellSpec]) -> list[CellSpec]:
    """The planned cells that ``cells`` (references, or cells) stand for, in their order.

    A full cell (a ``CellSpec``, or its JSON form: a run planned before cell_specs existed
    mapped over full cells) needs no lookup. A reference whose spec is missing is an error
    that names the run and the cell: the run was reset (cleared whole, re-planned) under
    this task.
    """
    refs = {c["id"] for c in cells if isinstance(c, dict) and "workload" not in c}
    specs = results_store().get_cell_specs(ref.dag_id, ref.run_id, list(refs)) if refs else {}
    if missing := sorted(refs - specs.keys()):
        raise RuntimeError(
            f"no planned spec for cell {missing[0]!r} of {ref.dag_id} / {ref.run_id} in the "
            "results store (cell_specs); was the run re-planned meanwhile?"
        )
    return [CellSpec.from_json(specs.get(c["id"], c) if isinstance(c, dict) else c) for c in cells]
