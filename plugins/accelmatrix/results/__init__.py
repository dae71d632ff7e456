"""accelmatrix's own results database (run history for perf tracking), not Airflow's.

DAG files import accelmatrix while the scheduler parses them, so this package must not pull
in SQLAlchemy (or pandas) at import time: ``ResultsStore`` is resolved on first attribute
access. ``from accelmatrix.results import ResultsStore`` inside a task is fine; at module
level of a DAG file it would defeat the point.

``results_store()`` is the process's store: one ``ResultsStore`` per results URL. Every
step writes several times; building an engine and re-checking the schema under a write
lock for each write would put that on every task's hot path.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from accelmatrix import settings

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from accelmatrix.results.store import SCALAR_STEP, ResultsStore

__all__ = ["ResultsStore", "SCALAR_STEP", "results_store"]


def results_store() -> ResultsStore:
    """The store named by the settings (``ACCELMATRIX_RESULTS_URL``), cached per URL."""
    return _store_for(settings.results_url())


@functools.cache
def _store_for(url: str) -> ResultsStore:
    return __getattr__("ResultsStore")(url)


def __getattr__(name: str) -> Any:
    if name in ("ResultsStore", "SCALAR_STEP"):
        # Here, not at the top: SQLAlchemy loads with the store module, and DAG parsing
        # imports this package (tests/test_results_store.py checks it stays unloaded).
        from accelmatrix.results import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
