"""``[core] hostname_callable`` for the Celery workers of a test stack.

Two workers on one machine would otherwise report the same host name for every task
instance, so a test could not tell which worker ran what. Each worker AirflowStack starts
carries ``ACCELMATRIX_WORKER_HOSTNAME`` (its Celery node name); the task processes it runs
report that as the task instance's ``hostname``. Kept free of imports so task processes
load it cheaply.
"""

from __future__ import annotations

import os
import socket

ENV = "ACCELMATRIX_WORKER_HOSTNAME"


def worker_hostname() -> str:
    """The worker's name when set, else the fully qualified host name (Airflow's default)."""
    return os.environ.get(ENV) or socket.getfqdn()
