"""Supervising a workload process on a Linux host: the local and SSH machine families share it.

``supervise.py`` is the runner itself (stdlib only, run by file path: on the Airflow worker
for a local cell, uploaded to the host for an SSH or TPU VM cell); ``status`` reads what it
leaves in ``status.json``; ``procfs`` finds a process group's live members in ``/proc``.
"""

from pathlib import Path

# The runner script, by file path (it is run, not imported).
RUNNER = Path(__file__).with_name("supervise.py")
