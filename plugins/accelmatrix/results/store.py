"""``ResultsStore``: every read and write of accelmatrix's results database, one handle.

The code is split by concern (core.py: engine, locks, migrations, validation; runs.py;
measurements.py; series_status.py; history_queries.py; change_points.py; stored_bounds.py;
pull_requests.py); this class joins them so callers keep one object with the same methods,
picklable and cheap to construct.
"""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from accelmatrix.results.change_points import ChangePointStore
from accelmatrix.results.history_queries import HistoryQueries
from accelmatrix.results.measurements import MeasurementStore
from accelmatrix.results.migrate import is_at_head
from accelmatrix.results.pull_requests import PullRequestStore
from accelmatrix.results.runs import RunCellStore
from accelmatrix.results.schema import SCALAR_STEP
from accelmatrix.results.series_status import SeriesAlertStore
from accelmatrix.results.stored_bounds import BoundsStore

__all__ = ["ResultsStore", "ResultsStoreError", "SCALAR_STEP"]

# What a store call raises when the database fails (unreachable, locked past the retries, a
# broken schema): callers outside accelmatrix.results catch this name, never SQLAlchemy's.
ResultsStoreError = SQLAlchemyError


class ResultsStore(
    RunCellStore,
    MeasurementStore,
    SeriesAlertStore,
    HistoryQueries,
    ChangePointStore,
    BoundsStore,
    PullRequestStore,
):
    """Handle on one results database, given by a SQLAlchemy URL (see core.StoreCore).

    Every concern is a subclass of StoreCore, so this is one engine, one lock, one schema
    check. The run's text table is accelmatrix.reports.text_table, which reads through it.
    """

    def warm(self) -> bool:
        """Do once what each process's first use of the store costs, then close up.

        Called in a process that forks task processes (accelmatrix.deploy.preload), so that each
        forked task starts with the engine's dialect set up and the schema check and the
        steps' first reads compiled: py-spy found that first use at ~10 %
        of a short task process's CPU. Only reads: nothing is created or migrated here
        (the first task still does that, under the schema lock). Every connection is
        closed before returning, so a fork copies no open database handle. Returns whether
        the database was at head (the reads ran).
        """
        engine = self._get_engine()
        try:
            with engine.connect() as conn:
                if not is_at_head(conn):
                    return False
            self._schema_ready = True  # just checked: the reads below need not ask again
            # The reads every step starts with, on a key that never exists.
            self.get_cell_specs("-", "-", ["-"])
            self.get_cell("-", "-", "-")
            return True
        finally:
            self._schema_ready = False
            engine.dispose()
