"""Per-series perf verdicts (``series_status``) and per-cell alerts (``alerts``): the
state the gate's history classification and alerting keep between runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import (
    and_,
    delete,
    insert,
    update,
)
from sqlalchemy.engine import Connection

from accelmatrix.contracts.series_records import AlertRecord, SeriesStatus
from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore
from accelmatrix.results.row_records import alert_record, series_status_record
from accelmatrix.results.schema import (
    alerts,
    series_status,
    utcnow,
)


class SeriesAlertStore(StoreCore):
    """Rows of ``series_status`` and ``alerts``."""

    # ------------------------------------------------------------------------- series & alerts

    def replace_series_status(
        self, dag_id: str, rows: Sequence[SeriesStatus], *, window_days: int
    ) -> int:
        """Make ``rows`` the suite's complete set of series verdicts, atomically.

        Each row is stored under ``dag_id`` and ``window_days`` (whatever the record says),
        computed now unless it says when. Replaced per suite: a series that left the window
        is gone.
        """
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        now = utcnow()
        prepared = []
        for row in rows:
            values = msgspec.structs.asdict(row)
            values.update(
                dag_id=dag_id, window_days=int(window_days), computed_at=row.computed_at or now
            )
            prepared.append(self._coerce(series_status, values))

        def tx(conn: Connection) -> int:
            self._lock(conn, "series_status", dag_id)
            conn.execute(delete(series_status).where(series_status.c.dag_id == dag_id))
            if prepared:
                conn.execute(insert(series_status), prepared)
            return len(prepared)

        return self._write(tx)

    def get_series_status(
        self, dag_id: str | None = None, status: str | None = None
    ) -> list[SeriesStatus]:
        rows = self._filtered(
            series_status,
            ("dag_id", "benchmark", "cell_id", "metric"),
            dag_id=dag_id,
            status=status,
        )
        return [series_status_record(r) for r in rows]

    def get_alert(self, dag_id: str, cell_id: str) -> AlertRecord | None:
        rows = self._filtered(alerts, ("dag_id",), dag_id=dag_id, cell_id=cell_id)
        return alert_record(rows[0]) if rows else None

    def get_alerts(self, dag_id: str | None = None, status: str | None = None) -> list[AlertRecord]:
        rows = self._filtered(alerts, ("dag_id", "cell_id"), dag_id=dag_id, status=status)
        return [alert_record(r) for r in rows]

    def upsert_alert(self, dag_id: str, cell_id: str, **fields: Any) -> None:
        """Insert the (suite, cell) alert, or update only the given fields of it.

        UPDATE first, INSERT if there was no row (not ``ON CONFLICT``: SQLite checks NOT
        NULL on the insert half even when the row exists, and an update gives few fields).
        Callers are the gates of one suite, which ``max_active_runs`` keeps apart; on SQLite
        the write lock serialises them anyway.
        """
        allowed = tuple(
            c.name for c in alerts.columns if c.name not in ("dag_id", "cell_id", "updated_at")
        )
        self._reject_unknown("alert", fields, allowed)
        key = {
            "dag_id": self._check_id("dag_id", dag_id, schema.ID_LEN),
            "cell_id": self._check_id("cell_id", cell_id, schema.CELL_ID_LEN),
        }
        values = {**self._coerce(alerts, fields), "updated_at": utcnow()}

        def tx(conn: Connection) -> None:
            self._lock(conn, "alerts", *key.values())
            where = and_(*(alerts.c[k] == v for k, v in key.items()))
            if conn.execute(update(alerts).where(where).values(values)).rowcount == 0:
                conn.execute(insert(alerts).values({**key, **values}))

        self._write(tx)
