"""Celery configuration for accelmatrix's workers: Airflow's default, plus a warm worker.

Set ``[celery] celery_config_options = accelmatrix.deploy.celery_config.CELERY_CONFIG``
(docker-compose.yaml does). The dict is Airflow's ``DEFAULT_CELERY_CONFIG`` unchanged;
importing this module also connects one handler to Celery's ``worker_init`` signal.

Why: an ``airflow celery worker`` runs each task in a process forked from one of its prefork
pool children, which are forked from the worker's main process. Celery sends ``worker_init``
in that main process before it creates the pool, so preloading there
(``accelmatrix.deploy.preload``) makes every pool child, and every task process forked from one,
start warm, as ``PreloadedLocalExecutor`` does for LocalExecutor. The scheduler and the
api-server import this module too (they build the same Celery app to send tasks), but they
never send ``worker_init``, so they preload nothing.

Celery's own ``imports`` setting would only import modules; the preload also builds the DAGs
once and warms Great Expectations, hence the signal.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_init

from accelmatrix.deploy.preload import preload_task_side

CELERY_CONFIG: dict[str, Any] = dict(DEFAULT_CELERY_CONFIG)


@worker_init.connect
def preload_before_the_pool_forks(**_: Any) -> None:
    """Celery's ``worker_init``: the worker's main process, before its pool is forked."""
    preload_task_side()
