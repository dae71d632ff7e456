"""A run's life: its own steps, plan (before any cell) and gate (after every cell), and the
names of every cell step's work.

Each cell step lives in its package under ``accelmatrix.steps`` (its operator, its trigger
when it waits, and its work: the step without Airflow, which records its outcome). Every
step records what it did in the results store, keyed by (dag_id, run_id, cell_id), so a
retry or a clear overwrites its own row instead of adding one. The DAG's run-level tasks,
preflight and the tests call the steps through the names below
(``from accelmatrix import lifecycle``; ``lifecycle.setup(...)``):

    plan_step            plan_run, PlanRejected
    steps.common         RunRef, utcnow, CellFailed, cell_refs, cell_spec, planned_cells
    steps.provision      begin_provision, finish_provision, provision_failed,
                         record_provision_failure, owner_labels
    steps.setup          setup, workload_env
    steps.run            record_run_outcome, finish_run (fetch artifacts, release the machine)
    steps.collect        collect, record_collect_failure, CollectFailed
    steps.evaluate       run_checks, record_evaluation, record_evaluation_error
    steps.teardown       teardown
    gate                 gate (the run's verdict, leftovers reaped, history, alerts, notify)
"""

from accelmatrix.cell_state import EARLIER_FAILURES, NEVER_RAN
from accelmatrix.lifecycle.gate import gate
from accelmatrix.lifecycle.plan_step import PlanRejected, plan_run

# The per-process store (accelmatrix.results); the name stays importable here.
from accelmatrix.results import results_store
from accelmatrix.steps.collect.work import CollectFailed, collect, record_collect_failure
from accelmatrix.steps.common import CellFailed, RunRef, cell_refs, cell_spec, planned_cells, utcnow
from accelmatrix.steps.evaluate.work import (
    checks_are_warm,
    record_evaluation,
    record_evaluation_error,
    run_checks,
)
from accelmatrix.steps.provision.work import (
    begin_provision,
    finish_provision,
    owner_labels,
    provision_failed,
    record_provision_failure,
)
from accelmatrix.steps.release import released_by
from accelmatrix.steps.run.work import finish_run, record_run_outcome
from accelmatrix.steps.setup.work import setup, workload_env
from accelmatrix.steps.teardown.work import teardown

__all__ = [
    "EARLIER_FAILURES",
    "NEVER_RAN",
    "CellFailed",
    "CollectFailed",
    "PlanRejected",
    "RunRef",
    "begin_provision",
    "cell_refs",
    "cell_spec",
    "checks_are_warm",
    "collect",
    "finish_provision",
    "finish_run",
    "gate",
    "owner_labels",
    "plan_run",
    "planned_cells",
    "provision_failed",
    "record_collect_failure",
    "record_evaluation",
    "record_evaluation_error",
    "record_provision_failure",
    "record_run_outcome",
    "released_by",
    "results_store",
    "run_checks",
    "setup",
    "teardown",
    "utcnow",
    "workload_env",
]
