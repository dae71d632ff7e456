"""The steps of one cell, as plain functions: plan, provision, setup, collect, evaluate,
teardown, gate.

The DAG wraps each in a thin operator; keeping the logic here means it reads top to bottom
without Airflow in the way and can be exercised directly. Every step records what it did in
the results store, keyed by (dag_id, run_id, cell_id), so a retry or a clear overwrites its
own row instead of adding one.

One module per step, over shared plumbing (``common``: RunRef, utcnow, CellFailed, the
failure-recording helpers; ``artifacts``: fetching a cell's files once; ``release``: deleting
its machine and recording the held time, by run or teardown); none imports another step.
Callers use the names below
(``from accelmatrix import lifecycle``; ``lifecycle.setup(...)``), not the modules:

    plan_step        plan_run, PlanRejected, cell_refs, cell_spec, planned_cells
    provision_step   begin_provision, finish_provision, provision_failed,
                     record_provision_failure, owner_labels
    setup_step       setup, workload_env
    run_step         record_run_outcome, finish_run (fetch artifacts, release the machine)
    collect_step     collect, record_collect_failure, CollectFailed
    evaluate_step    run_checks, record_evaluation, record_evaluation_error
    teardown_step    teardown
    gate             gate (the run's verdict, leftovers reaped, history, alerts, notify)
"""

from accelmatrix.cell_state import EARLIER_FAILURES, NEVER_RAN
from accelmatrix.lifecycle.collect_step import CollectFailed, collect, record_collect_failure
from accelmatrix.lifecycle.common import CellFailed, RunRef, utcnow
from accelmatrix.lifecycle.evaluate_step import (
    checks_are_warm,
    record_evaluation,
    record_evaluation_error,
    run_checks,
)
from accelmatrix.lifecycle.gate import gate
from accelmatrix.lifecycle.plan_step import (
    PlanRejected,
    cell_refs,
    cell_spec,
    plan_run,
    planned_cells,
)
from accelmatrix.lifecycle.provision_step import (
    begin_provision,
    finish_provision,
    owner_labels,
    provision_failed,
    record_provision_failure,
)
from accelmatrix.lifecycle.release import released_by
from accelmatrix.lifecycle.run_step import finish_run, record_run_outcome
from accelmatrix.lifecycle.setup_step import setup, workload_env
from accelmatrix.lifecycle.teardown_step import teardown

# The per-process store (accelmatrix.results); the name stays importable here.
from accelmatrix.results import results_store

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
