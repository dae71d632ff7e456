"""What Airflow says about the task instances that own a cell, and the labels naming them.

The janitor asks whether a resource's owner is finished, the gate and the stop handling
(stopped.py) ask for a cell's task states, clearing.py whether a cell's tasks are done.
It is Airflow's side of a cell's ownership, one concept beside the results store's side,
and a leaf: it depends on nothing of accelmatrix.

:class:`SdkOwnerLookup` uses the Task SDK's execution-API calls (inside a task or trigger,
no DB access); :class:`DbOwnerLookup` Airflow's metadata DB (CLI, tests).
"""

from __future__ import annotations

from typing import Any, Protocol

OWNER_GROUP_LABEL = "task-group"
OWNER_INDEX_LABEL = "map-index"
# Task instance states after which a task will not touch its cell's resource again.
FINISHED_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
FINISHED_RUN_STATES = frozenset({"success", "failed"})


class OwnerLookup(Protocol):
    """What the janitor asks Airflow."""

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        """The DAG run's state, or None when there is no such run."""

    def cell_states(
        self, dag_id: str, run_id: str, task_group: str, map_index: int
    ) -> dict[str, str | None]:
        """State of every task instance of one cell (``task_id -> state``)."""


def _state(value: Any) -> str | None:
    """An Airflow state enum or string as its plain value."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


class SdkOwnerLookup:
    """Inside an Airflow task: the Task SDK's calls to the execution API (no DB access)."""

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        if RuntimeTaskInstance.get_dr_count(dag_id=dag_id, run_ids=[run_id]) == 0:
            return None
        return _state(RuntimeTaskInstance.get_dagrun_state(dag_id=dag_id, run_id=run_id))

    def cell_states(
        self, dag_id: str, run_id: str, task_group: str, map_index: int
    ) -> dict[str, str | None]:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = RuntimeTaskInstance.get_task_states(
            dag_id=dag_id, map_index=map_index, run_ids=[run_id]
        ).get(run_id, {})
        # Keys are "<task_id>_<map_index>" for mapped tasks.
        suffix = f"_{map_index}"
        return {
            k.removesuffix(suffix): _state(v)
            for k, v in states.items()
            if k.startswith(f"{task_group}.")
        }


class DbOwnerLookup:
    """Outside a task (CLI, tests): Airflow's metadata DB through its ORM."""

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.query(DagRun.state).filter_by(dag_id=dag_id, run_id=run_id).first()
        if row is None:
            return None
        return _state(row[0]) or "queued"

    def cell_states(
        self, dag_id: str, run_id: str, task_group: str, map_index: int
    ) -> dict[str, str | None]:
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session

        with create_session() as session:
            rows = (
                session.query(TI.task_id, TI.state)
                .filter(TI.dag_id == dag_id, TI.run_id == run_id, TI.map_index == map_index)
                .filter(TI.task_id.startswith(f"{task_group}."))
                .all()
            )
        return {t: _state(s) for t, s in rows}
