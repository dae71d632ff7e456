"""Preload the task side into a process that will fork task processes.

Why: every Airflow task process starts from a fork (LocalExecutor: of a worker forked from
the scheduler; CeleryExecutor: of a prefork pool child forked from the ``airflow celery
worker`` process). A task process starts with whatever its parent had imported and imports
the rest itself: our steps, pandas, the results store, and for ``evaluate`` Great
Expectations, which alone costs ~2.5 s of CPU per process. Doing that work once in the
parent, before it forks, makes every task process start warm; with Great Expectations
loaded, ``evaluate`` judges the cell in its own task process instead of deferring to the
triggerer (``lifecycle.checks_are_warm``).

This is the same idea as Airflow's ``[dag_processor] parsing_pre_import_modules`` for DAG
parsers; Airflow has no such setting for task processes, so the two places that fork them
call this: ``accelmatrix.deploy.executor.PreloadedLocalExecutor`` and the Celery worker hook in
``accelmatrix.deploy.celery_config``. Nothing here opens a connection, starts a thread or keeps a
file open (a fork would copy them): it imports and computes, and the results store's
connections it opens to warm up are closed before it returns.
"""

from __future__ import annotations

import importlib
import logging
import time

from accelmatrix import settings
from accelmatrix.dag_factory import prebuild_dags
from accelmatrix.evaluation.evaluate_cell import warm_up
from accelmatrix.results import results_store
from accelmatrix.results.migrate import head

log = logging.getLogger(__name__)

# What a cell's task process imports on its way through the steps: the operators, the
# lifecycle steps and the results store, the backends whose modules are light, and Great
# Expectations through the module that imports it (so that module's once-per-process state
# is set too). The cloud backends (tpu_vm, k8s_*) are left out: their clients are heavy and
# most task processes never need them.
TASK_SIDE_MODULES = (
    "pandas",
    "accelmatrix.steps.provision.operator",
    "accelmatrix.steps.run.operator",
    "accelmatrix.steps.setup.operator",
    "accelmatrix.steps.collect.operator",
    "accelmatrix.steps.teardown.operator",
    "accelmatrix.steps.evaluate.operator",
    "accelmatrix.steps.provision.trigger",
    "accelmatrix.steps.run.trigger",
    "accelmatrix.steps.evaluate.trigger",
    "accelmatrix.lifecycle",
    "accelmatrix.results.store",
    "accelmatrix.reports.text_table",  # the gate logs the run's table
    "accelmatrix.reports.run_page",
    "accelmatrix.metrics.sources",
    "accelmatrix.evaluation",
    "accelmatrix.evaluation.offline_docs",
    "accelmatrix.evaluation.run_table",  # the gate validates the run's table of cells
    "accelmatrix.cleanup.clearing",
    "accelmatrix.cleanup.stopped",
    # plan and the gate read the suite (spec models; the DAG is built without them), and the
    # gate updates the perf history and alerts: notifications.transport alone imports the
    # HTTP provider and aiohttp (0.21 s). Imported in the gate task they were 0.3-0.4 s of CPU
    # at the run's serial end, every run (bench_lifecycle, 2026-11-28).
    "accelmatrix.spec.loader",
    "accelmatrix.spec.followup_plan",
    "accelmatrix.history.change_points.tracking",
    "accelmatrix.history.change_points.report",
    "accelmatrix.history.series.series",
    "accelmatrix.history.retests.followup",
    "accelmatrix.notifications.dedup",
    "accelmatrix.notifications.transport",
    "accelmatrix.cleanup.janitor",
    "accelmatrix.pricing",
    "accelmatrix.backends.local.backend",
    "accelmatrix.backends.ssh.backend",
)
# Modules that need an optional extra (pyproject.toml): without it they are not preloaded,
# and that is no failure (the deployment has no machine of that kind).
OPTIONAL_MODULES = {"accelmatrix.backends.ssh.backend": ("paramiko", "accelmatrix[ssh]")}


def import_task_side_modules() -> list[str]:
    """Import TASK_SIDE_MODULES; return those that failed (an absent extra is no failure)."""
    failed = []
    for name in TASK_SIDE_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:
            extra = OPTIONAL_MODULES.get(name)
            if extra and isinstance(e, ModuleNotFoundError) and e.name == extra[0]:
                log.info("not preloading %s: %s is not installed (%s)", name, *extra)
                continue
            log.exception("preloading %s failed; task processes will import it themselves", name)
            failed.append(name)
    return failed


def preload_task_side() -> list[str]:
    """Import the task side and warm Great Expectations; return what failed.

    Nothing here is fatal: a module that fails to import is logged and skipped, and the
    task that needs it imports it again and reports the real error where on-call reads it,
    in that task's log.
    """
    started = time.perf_counter()
    failed = import_task_side_modules()
    try:
        # What each task process computes once from files: the results schema's head
        # revision (Alembic reads its scripts), and the DAG file's own build (the suite
        # shapes, the code fingerprint, Airflow's lazily imported DAG parts, and the DAGs
        # themselves, which each forked task process takes instead of building its own).
        head()
        prebuild_dags()
    except Exception:
        log.exception("preloading the DAG build failed; task processes will do it themselves")
        failed.append("build_dags")
    try:
        # The results store's first use (engine and dialect, the schema check, the steps'
        # first reads), with every connection closed again before any fork.
        results_store().warm()
    except Exception:
        log.exception("warming the results store failed; task processes will open it cold")
        failed.append("results_store")
    try:
        # Great Expectations, its Data Docs templates, and one made-up cell evaluated, which
        # loads what GE, pandas and pyarrow leave for first use (threads: none; tqdm's
        # monitor is off, see gx_suite.import_gx).
        warm_up(rehearse_with=settings.include_dir())
    except Exception:
        log.exception("preloading Great Expectations failed; evaluate will defer")
        failed.append("great_expectations")
    log.info(
        "preloaded the accelmatrix task side for forked task processes in %.1f s",
        time.perf_counter() - started,
    )
    return failed
