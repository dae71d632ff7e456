"""The results store of this process: one ``ResultsStore`` per results URL.

Every step writes several times; building an engine and re-checking the schema under a
write lock for each write would put that on every task's hot path. Lifecycle, janitor,
stopped, history and the UI helpers all need "the" store; it lives here, below all of
them, instead of in lifecycle.py (which made history and the janitor import the lifecycle).
Importing this module stays light: SQLAlchemy loads on the first call.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from accelmatrix import settings

if TYPE_CHECKING:  # pragma: no cover
    from accelmatrix.results.store import ResultsStore

__all__ = ["results_store"]


def results_store() -> ResultsStore:
    """The store named by the settings (``ACCELMATRIX_RESULTS_URL``), cached per URL."""
    return _store_for(settings.results_url())


@functools.cache
def _store_for(url: str) -> ResultsStore:
    # Here, not at the top: DAG files import accelmatrix while the scheduler parses them,
    # and SQLAlchemy must not load then (tests/test_results_store.py checks the package).
    from accelmatrix.results.store import ResultsStore

    return ResultsStore(url)
