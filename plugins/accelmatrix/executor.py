"""PreloadedLocalExecutor: a LocalExecutor whose task processes start with accelmatrix loaded.

Under LocalExecutor the workers are forked from the scheduler when the executor starts, and
every task process is forked from a worker. This subclass preloads the task side
(``accelmatrix.preload``) in the scheduler just before the workers are forked, so every task
process starts warm and ``evaluate`` runs in its own task process instead of deferring. It
changes nothing else of LocalExecutor.

Configure with ``AIRFLOW__CORE__EXECUTOR=accelmatrix.executor.PreloadedLocalExecutor``. The
CeleryExecutor counterpart is ``accelmatrix.celery_config``.
"""

from __future__ import annotations

from airflow.executors.local_executor import LocalExecutor

from accelmatrix.preload import preload_task_side


class PreloadedLocalExecutor(LocalExecutor):
    """LocalExecutor that preloads the task side before it forks its workers."""

    def start(self) -> None:
        # Only a forked worker inherits the imports; a spawned one (macOS) starts cold.
        if self.is_mp_using_fork:
            preload_task_side()
        super().start()
