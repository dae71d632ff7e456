"""Airflow cluster policy: a cell's mapped task instances carry its cell id from the moment
they exist, not only once they run.

Why: the grid, REST's ``rendered_map_index`` and on-call's searches name a mapped task
instance by its ``map_index_template``. Airflow 3.3.2 renders that template only when the
task process starts (the Task SDK's ``_prepare``), so until then a waiting task instance
(no state, scheduled, queued) shows a bare "0", "1", ... and a 256-cell run is a wall of
numbers. Airflow calls ``task_instance_mutation_hook`` for every mapped task instance it
creates (``TaskMap.expand_mapped_task``, ``DagRun._revise_map_indexes_if_mapped``) and
when it refreshes one from its task; this hook gives it the name there. The name comes from
the list the cell group is mapped over (the plan's XCom: one ``{id, index, machine}`` per
cell, in map-index order), so it is exactly what the task's own template renders when it
starts (``{{ task.cell.id }}``, steps/cell_operator.py): the name never changes under the user.

Registered as a policy plugin through the ``airflow.policy`` entry point (pyproject.toml),
Airflow's way to ship a policy in a package: no ``airflow_local_settings.py`` to install.
The hook runs inside the scheduler's own database session and must never break scheduling:
it touches only task instances whose template is ours, reads one XCom row per run and
mapped group per transaction, and swallows its own errors (the task still names itself
when it starts, as before).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow.policies import hookimpl

log = logging.getLogger(__name__)

# Airflow's column is String(250).
MAX_NAME = 250

# (transaction, (dag_id, run_id, task_id, key), cell ids): the last list read, reused while
# the same scheduler transaction expands the other tasks of the group (6 x N calls).
_last: tuple[Any, tuple[str, str, str, str], list[str]] | None = None


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
    """Name a waiting mapped cell task by its cell id (see the module docstring)."""
    try:
        _name(task_instance, dag_run)
    except Exception:  # noqa: BLE001 - naming must never stop the scheduler
        log.debug("could not name %s by its cell", task_instance, exc_info=True)


def _name(ti: Any, dag_run: Any) -> None:
    # Imported here, not at the top: Airflow imports this module while it initialises its
    # own settings in every process (policy plugins load first), before the Task SDK and the
    # ORM models can be imported.
    from accelmatrix.steps.cell_operator import CELL_NAME

    map_index = getattr(ti, "map_index", None)
    if not isinstance(map_index, int) or map_index < 0 or ti._rendered_map_index is not None:
        return
    task = getattr(ti, "task", None)
    if task is None or getattr(task, "map_index_template", None) != CELL_NAME:
        return
    group = task.get_closest_mapped_task_group()
    source = getattr(getattr(group, "_expand_input", None), "value", {}).get("cell")
    if source is None:
        return
    session = _session_of(dag_run) or _session_of(ti)
    if session is None:
        return
    ids = _mapped_ids(session, ti.dag_id, ti.run_id, source.operator.task_id, source.key)
    if map_index < len(ids) and ids[map_index]:
        ti._rendered_map_index = ids[map_index][:MAX_NAME]


def _session_of(obj: Any) -> Any:
    from sqlalchemy.orm import object_session

    return object_session(obj) if obj is not None else None


def _mapped_ids(session: Any, dag_id: str, run_id: str, task_id: str, key: str) -> list[str]:
    """The cell ids of the list a cell group is mapped over, in map-index order."""
    global _last
    # Here for the reason given in _name.
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    wanted = (dag_id, run_id, task_id, key)
    txn = session.get_transaction()
    if txn is not None and _last is not None and _last[0] is txn and _last[1] == wanted:
        return _last[2]
    row = session.scalar(
        select(XComModel).where(
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.task_id == task_id,
            XComModel.key == key,
            XComModel.map_index == -1,
        )
    )
    value = XComModel.deserialize_value(row) if row is not None else []
    if isinstance(value, str):
        value = json.loads(value)
    ids = [str(c.get("id") or "") if isinstance(c, dict) else "" for c in value or []]
    _last = (txn, wanted, ids)
    return ids
