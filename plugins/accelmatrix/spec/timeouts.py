"""The one timeout rule: how long each part of a cell may take, and Airflow's backstops.

``CellTimeouts`` turns the suite's ``workload.timeout`` and ``workload.setup_timeout`` into
every timer a cell has: the setup and run tasks' ``execution_timeout`` (dag_factory), the
run task's deferral timeout (RunWorkloadOperator) and the workload's deadline, which
WorkloadTrigger enforces by killing the workload. Airflow's timers are backstops around
the limits accelmatrix enforces itself and never tighter, so a cell fails with
accelmatrix's message ("timed out after N s and was killed"), not Airflow's.

Standard library only: dag_factory reads it while a DAG file is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

# Between the workload's deadline, which the trigger enforces by killing the workload, and
# Airflow's deferral timeout: a backstop that fires only if the triggerer itself is stuck.
DEFER_GRACE_SECONDS = 300
# The same backstop past a machine's own provisioning deadline (valid-until, provision
# timeout), which the provision trigger enforces: longer, because a trigger that gives up
# deletes what it requested before it fires, and a TPU delete can take minutes.
PROVISION_GRACE_SECONDS = 900
# Airflow's timeout of an evaluation deferred to the triggerer (it takes about a second a
# cell): a backstop for a triggerer that never runs it.
EVALUATION_DEFERRAL = timedelta(minutes=15)
# How long the teardown task keeps trying to delete a machine whose cloud API it cannot
# reach (a control-plane upgrade, a network blip): a delete is idempotent, and a teardown
# that gives up leaves the machine running until the janitor's next pass. Within the
# teardown task's execution_timeout (30 min).
TEARDOWN_API_PATIENCE_SECONDS = 300
# A task's own execution_timeout allows this much beyond the limit of the work inside it
# (connecting, writing the results store).
TASK_GRACE_SECONDS = 60


@dataclass(frozen=True)
class CellTimeouts:
    """How long each part of a cell may take, from the suite's ``workload`` limits.

    ``workload_s`` counts from when the workload starts running: a wait for capacity (a
    Kueue queue) does not count, the trigger moves its deadline while the backend says
    queued.
    """

    setup_s: int
    workload_s: int

    def setup_task(self) -> timedelta:
        """``execution_timeout`` of the setup task: the setup commands' own limit, plus
        the grace."""
        return timedelta(seconds=self.setup_s + TASK_GRACE_SECONDS)

    def run_task(self) -> timedelta:
        """``execution_timeout`` of the run task's worker part. A run defers after a brief
        watch, but a retry after an infrastructure failure replaces the machine and runs
        setup inline before it submits, so the limit covers setup as well."""
        return timedelta(seconds=self.setup_s + self.workload_s + TASK_GRACE_SECONDS)

    def run_deferral(self, queue_wait_s: float) -> timedelta:
        """Airflow's timeout of the run task's deferral: the workload's limit, the longest
        the backend lets it wait for capacity, and the grace."""
        return timedelta(seconds=self.workload_s + queue_wait_s + DEFER_GRACE_SECONDS)

    def workload_deadline(self, started_at: float) -> float:
        """The epoch second by which a workload that started at ``started_at`` is killed."""
        return started_at + self.workload_s


def provision_deferral(wait_s: float) -> timedelta:
    """Airflow's timeout of a provision deferral (the provision task's, or a run retry's
    that replaces its machine): ``wait_s`` until the machine's own deadline, plus the
    grace."""
    return timedelta(seconds=wait_s + PROVISION_GRACE_SECONDS)
