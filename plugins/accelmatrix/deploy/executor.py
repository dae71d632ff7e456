"""PreloadedLocalExecutor: a LocalExecutor whose task processes start with accelmatrix loaded.

Under LocalExecutor the workers are forked from the scheduler when the executor starts, and
every task process is forked from a worker. This subclass preloads the task side
(``accelmatrix.deploy.preload``) in the scheduler just before the workers are forked, so every task
process starts warm and ``evaluate`` runs in its own task process instead of deferring. Apart
from the garbage collector and its workers' SIGTERM (both below) it changes nothing else of
LocalExecutor.

The preload puts ~435,000 objects (pandas, Great Expectations, pyarrow) on the scheduler's
heap, where the scheduling loop paid for them: each full garbage collection walked them all.
LocalExecutor freezes the heap only while it forks its workers and unfreezes it after, so
this executor freezes it for good once its workers exist (``gc.freeze``: those objects live
as long as the process anyway), and again should a worker respawn unfreeze it; objects
created later are collected as before. Measured on a 64-cell run (bench_lifecycle): a full
collection in the scheduler 0.35-0.62 s -> 0.09-0.12 s, all its collections 5.7 -> 2.5 s of
CPU per run.

Its idle workers stop on SIGTERM. The 3.3.2 scheduler installs its SIGTERM handler
(``SchedulerJobRunner.register_signals``) before it starts the executor, and a forked worker
inherits it: in any process but the scheduler's main one that handler just returns
(``_exit_gracefully``: ``if not _is_parent_process(): return``), so an idle LocalExecutor
worker ignores SIGTERM, and one orphaned by a scheduler that died without stopping it
(SIGKILL, a crash) waits on its queue until it is SIGKILLed. Here each worker resets SIGTERM
to its default as it starts, as a worker that was spawned instead of forked has it; a busy
worker is unchanged (the task supervisor forwards SIGTERM to its task while the task runs).
A scheduler that stops normally still ends its workers itself (``LocalExecutor.end``).

Configure with ``AIRFLOW__CORE__EXECUTOR=accelmatrix.deploy.executor.PreloadedLocalExecutor``. The
CeleryExecutor counterpart is ``accelmatrix.deploy.celery_config``.
"""

from __future__ import annotations

import gc
import signal
from multiprocessing import util as mp_util

from airflow.executors.local_executor import LocalExecutor

from accelmatrix.deploy.preload import preload_task_side


class PreloadedLocalExecutor(LocalExecutor):
    """LocalExecutor that preloads the task side before it forks its workers."""

    def start(self) -> None:
        # Runs in each process multiprocessing forks from here on: the workers.
        mp_util.register_after_fork(self, _default_sigterm)
        # Only a forked worker inherits the imports; a spawned one (macOS) starts cold.
        if self.is_mp_using_fork:
            preload_task_side()
        super().start()
        gc.freeze()

    def sync(self) -> None:
        super().sync()
        # A worker respawn runs LocalExecutor's freeze/fork/unfreeze, which unfreezes ours too.
        # Freezing again also freezes whatever the loop holds at that moment, never to be
        # collected: once per respawn, and a worker respawns only after one died.
        if gc.get_freeze_count() == 0:
            gc.freeze()


def _default_sigterm(_executor: PreloadedLocalExecutor) -> None:
    """In a forked worker: SIGTERM ends it again (not the scheduler's inherited handler)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
