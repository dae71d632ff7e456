"""Backends: one package per machine family (local, ssh, tpu_vm, kubernetes), all behind
`accelmatrix.backends.base.Backend`; `accelmatrix.backends.machine_kinds` names every kind's class
and imports it when a task asks (`get_backend`)."""

from accelmatrix.backends.base import Backend, CellContext, JobStatus
from accelmatrix.backends.machine_kinds import get_backend

__all__ = ["Backend", "CellContext", "JobStatus", "get_backend"]
