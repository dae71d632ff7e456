"""CellOperator: the one base of every per-cell step (provision, setup, run, collect,
evaluate, teardown).

What the steps share lives here, once:

* ``cell`` is a template field: Airflow resolves the mapped ``cell`` argument before the
  task runs. ``map_index_template`` reads the operator's own rendered field, so it renders
  to the cell id before ``execute`` (a template over a context variable set inside
  ``execute`` would only name the task after ``execute`` returned). The cluster policy
  (accelmatrix/deploy/policy.py) writes the same name when Airflow creates the task instance, so
  the grid shows it in every state; the task itself only carries it into its final state
  and holds back the Task SDK's early PATCH of it (``_hold_back_early_name``).
* ``cell`` arrives as a reference (id, index, machine: what the DAG maps over) and is
  replaced by the planned cell, a typed ``CellSpec`` read from the results store, right
  after rendering (``render_template_fields``), before anything reads it;
  lifecycle/plan_step.py says why the cells do not travel through Airflow themselves.
* ``ref(context)``: which run, task group and map index this step belongs to (labels on
  the resource, keys in the results store).
* No return value is pushed as XCom except ``provision``'s (``pushes_xcom``): the resource
  record is the one value another task reads. Every other step's outcome lives in the
  results store and its log; an XCom would cost one more Execution API write (and a row in
  Airflow's database) per cell and step that nothing reads.

Values resolved from XCom are never Jinja-rendered (Airflow marks them as seen), so a user
value containing ``{{ ... }}`` stays text.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseOperator

from accelmatrix.contracts.machine_records import (
    MachineResource,
    ResourceBase,
    resource_from_json,
)
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import RunRef, cell_spec

# Airflow's grid, REST ``rendered_map_index`` and the logs name a mapped task by this. It
# renders the mapped reference (a dict: Jinja falls back from the attribute to the key) and
# the CellSpec the reference is replaced by alike.
CELL_NAME = "{{ task.cell.id }}"


class InfrastructureFailure(Exception):
    """The machine failed, not the workload: the task fails and is retried when the suite
    sets retries (a test failure never is)."""


class CellOperator(BaseOperator):
    """A step of one cell of a suite's matrix (``cell``: its CellSpec once rendered)."""

    template_fields: tuple[str, ...] = ("cell",)
    cell: CellSpec
    # Whether the step's return value becomes its XCom (see the module docstring).
    pushes_xcom = False

    def __init__(self, *, cell: Any, **kwargs: Any):
        kwargs.setdefault("map_index_template", CELL_NAME)
        kwargs.setdefault("do_xcom_push", self.pushes_xcom)
        super().__init__(**kwargs)
        self.cell = cell

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render as usual, then swap the mapped cell reference for the planned cell."""
        super().render_template_fields(context, jinja_env)
        self.cell = cell_spec(self.ref(context), self.cell)
        self._hold_back_early_name(context)

    def _hold_back_early_name(self, context: Any) -> None:
        """Spare the Execution API the early ``rendered-map-index`` PATCH of every task.

        Why: the cluster policy (accelmatrix/deploy/policy.py) already named this task instance
        by its cell id when Airflow created it, so the PATCH the Task SDK sends right after
        rendering (``_prepare``) writes the value the row holds. In a 64-cell run it was
        384 of 3,397 Execution API calls, each an api-server request and a write to
        Airflow's database.

        How: ``_prepare`` renders the name early only when the context carries a
        ``map_index_template``, and renders it right after this method returns. So the
        template leaves the context here and comes back in ``pre_execute``, the first
        thing the task runs; the runtime task instance holds the name meanwhile. After
        ``execute`` Airflow renders the template again, finds the same name and sends
        nothing; the name still travels with the task's final state (or its deferral).
        """
        if context.get("map_index_template") != CELL_NAME or not isinstance(self.cell, CellSpec):
            return
        name = self.render_template(CELL_NAME, context)
        if not name:
            return
        context["ti"].rendered_map_index = name
        context["map_index_template"] = None
        self._held_back_name = True

    def pre_execute(self, context: Any) -> None:
        """Give the context its name template back (see ``_hold_back_early_name``)."""
        if getattr(self, "_held_back_name", False):
            context["map_index_template"] = CELL_NAME
            self._held_back_name = False
        super().pre_execute(context)

    @staticmethod
    def ref(context: Any):
        """The run (and mapped task group, map index) this step belongs to."""
        return RunRef.from_context(context)

    @staticmethod
    def triggers_end_tasks() -> bool:
        """Whether a trigger's ``TaskSuccessEvent``/``TaskFailedEvent`` will end this task.

        True under a real triggerer. False under ``dag.test()`` (the demo and the fast DAG
        tests): its in-process supervisor runs the trigger inline and then resumes the task
        on the worker with the event's payload whatever the event is
        (``airflow/sdk/definitions/dag.py`` ``_run_task``), so XComs of a task-ending event
        would be lost. There the trigger hands its outcome back to ``execute_complete``.
        """
        from airflow.sdk.execution_time import task_runner

        comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
        return type(comms).__name__ != "InProcessSupervisorComms"

    @staticmethod
    def provisioned_resource(context: Any) -> MachineResource:
        """The resource ``provision`` returned for this cell.

        Pulled explicitly rather than passed as an argument: Airflow requires every direct
        downstream of a setup task to use ALL_SUCCESS, and collect must also run after a
        failed workload (ALL_DONE_SETUP_SUCCESS).
        """
        ti = context["ti"]
        group = ti.task_id.rsplit(".", 1)[0]
        resource = ti.xcom_pull(task_ids=f"{group}.provision", map_indexes=ti.map_index)
        if not resource:
            raise RuntimeError(f"no resource recorded by {group}.provision[{ti.map_index}]")
        return resource_record(resource)


def resource_record(value: Any) -> MachineResource:
    """The resource record ``provision`` returned (its JSON form, this step's XCom), however
    Airflow handed it over.

    A provision that ended in the triggerer pushed its record through
    ``TaskSuccessEvent(xcoms=...)``; Airflow 3.3.2 stores such values JSON-encoded once more
    than a worker's return value (``XComModel.set`` serializes what the execution API would
    have stored as is), so readers get the JSON text. Resource records are always objects.
    """
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict | ResourceBase):
        raise TypeError(f"a resource record must be a JSON object, got {type(value).__name__}")
    return resource_from_json(value)
