"""``ResultsStore``: every read and write of accelmatrix's results database, one handle.

The code is split by concern (core.py: engine, locks, migrations, validation; runs.py;
measurements.py; series.py; history_queries.py; report.py); this class joins them so
callers keep one object with the same methods, picklable and cheap to construct.
"""

from __future__ import annotations

from accelmatrix.results.history_queries import HistoryQueries
from accelmatrix.results.report import RunReport
from accelmatrix.results.schema import SCALAR_STEP
from accelmatrix.results.series import SeriesAlertStore

__all__ = ["ResultsStore", "SCALAR_STEP"]


class ResultsStore(RunReport, SeriesAlertStore, HistoryQueries):
    """Handle on one results database, given by a SQLAlchemy URL (see core.StoreCore).

    RunReport brings RunCellStore and MeasurementStore (the report reads both); every
    concern is a subclass of StoreCore, so this is one engine, one lock, one schema check.
    """
