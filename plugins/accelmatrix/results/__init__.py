"""accelmatrix's own results database (run history for perf tracking), not Airflow's.

DAG files import accelmatrix while the scheduler parses them, so this package must not pull
in SQLAlchemy (or pandas) at import time: ``ResultsStore`` is resolved on first attribute
access. ``from accelmatrix.results import ResultsStore`` inside a task is fine; at module
level of a DAG file it would defeat the point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from accelmatrix.results.store import SCALAR_STEP, ResultsStore

__all__ = ["ResultsStore", "SCALAR_STEP"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from accelmatrix.results import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
