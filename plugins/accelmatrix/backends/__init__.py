"""Backends: one per machine kind, all behind `accelmatrix.backends.base.Backend`."""

from accelmatrix.backends.base import Backend, CellContext, JobStatus
from accelmatrix.backends.registry import get_backend

__all__ = ["Backend", "CellContext", "JobStatus", "get_backend"]
