"""PreloadedLocalExecutor: a LocalExecutor whose task processes start with accelmatrix loaded.

Why: under LocalExecutor every task process is forked (``os.fork``) from a worker process,
and the workers are forked from the scheduler when the executor starts. A task process
therefore starts with whatever the scheduler had imported at that moment, and imports the
rest itself: our steps, pandas, the results store, and for ``evaluate`` Great Expectations,
which alone costs ~2.5 s of CPU per process. That is why ``evaluate`` used to defer to the
triggerer (warm there) at the price of a triggerer round trip on every cell's critical path.

This executor imports the task side once in the scheduler, just before the workers are
forked, the way Airflow's own DAG processor pre-imports modules before it forks a parser
(``[dag_processor] parsing_pre_import_modules``). Airflow has no such setting for task
processes, hence this subclass; it changes nothing else of LocalExecutor. Nothing here
opens a connection, a thread or a file handle (forking would copy them): it only imports.

With Great Expectations already loaded, ``evaluate`` runs in its own task process instead of
deferring (``EvaluateCellOperator``); everywhere else (CeleryExecutor workers, a plain
LocalExecutor) it still defers to the triggerer, where it is warm.

Configure with ``AIRFLOW__CORE__EXECUTOR=accelmatrix.executor.PreloadedLocalExecutor``.
"""

from __future__ import annotations

import importlib
import logging
import time

from airflow.executors.local_executor import LocalExecutor

from accelmatrix import settings

log = logging.getLogger(__name__)

# What a cell's task process imports on its way through the steps: the DAG file's factory,
# the operators, the lifecycle steps and the results store, the backends whose modules are
# light, and Great Expectations through the module that imports it (so that module's
# once-per-process state is set too). The cloud backends (tpu_vm, k8s_*) are left out:
# their clients are heavy and most task processes never need them.
TASK_SIDE_MODULES = (
    "pandas",
    "accelmatrix.dag_factory",
    "accelmatrix.operators.provision",
    "accelmatrix.operators.run",
    "accelmatrix.operators.steps",
    "accelmatrix.operators.evaluate",
    "accelmatrix.triggers.provision",
    "accelmatrix.triggers.workload",
    "accelmatrix.triggers.evaluation",
    "accelmatrix.lifecycle",
    "accelmatrix.results.store",
    "accelmatrix.metrics.sources",
    "accelmatrix.evaluation",
    "accelmatrix.evaluation.offline_docs",
    "accelmatrix.clearing",
    "accelmatrix.stopped",
    "accelmatrix.pricing",
    "accelmatrix.backends.local",
    "accelmatrix.backends.ssh",
)


def preload_task_side() -> list[str]:
    """Import the task side and Great Expectations; return what failed.

    A module that fails to import is logged and skipped: the task that needs it imports it
    again and reports the real error where on-call reads it, in that task's log.
    """
    started = time.perf_counter()
    failed = []
    for name in TASK_SIDE_MODULES:
        try:
            importlib.import_module(name)
        except Exception:
            log.exception("preloading %s failed; task processes will import it themselves", name)
            failed.append(name)
    try:
        # What each task process computes once from files: the results schema's head
        # revision (Alembic reads its scripts), and the DAG file's own build (the suite
        # shapes, the code fingerprint, Airflow's lazily imported DAG parts).
        from accelmatrix.dag_factory import build_dags
        from accelmatrix.results.migrate import head

        head()
        build_dags()
    except Exception:
        log.exception("preloading the DAG build failed; task processes will do it themselves")
        failed.append("build_dags")
    try:
        # Great Expectations, its Data Docs templates, and one made-up cell evaluated, which
        # loads what GE, pandas and pyarrow leave for first use (threads: none; tqdm's
        # monitor is off, see gx_suite.import_gx).
        from accelmatrix.evaluation.evaluate import warm_up

        warm_up(rehearse_with=settings.include_dir())
    except Exception:
        log.exception("preloading Great Expectations failed; evaluate will defer")
        failed.append("great_expectations")
    log.info(
        "preloaded the accelmatrix task side for forked task processes in %.1f s",
        time.perf_counter() - started,
    )
    return failed


class PreloadedLocalExecutor(LocalExecutor):
    """LocalExecutor that imports the task side before it forks its workers."""

    def start(self) -> None:
        # Only a forked worker inherits the imports; a spawned one (macOS) starts cold.
        if self.is_mp_using_fork:
            preload_task_side()
        super().start()
