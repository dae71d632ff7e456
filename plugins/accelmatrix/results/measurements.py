"""Metrics and check verdicts of a cell: replaced as a whole set per cell, read as rows or
as pandas frames."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Table,
    and_,
    delete,
    insert,
    select,
)
from sqlalchemy.engine import Connection

from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.run_records import CheckRecord, MetricRecord, MetricValue
from accelmatrix.results.core import StoreCore
from accelmatrix.results.row_records import check_record, metric_record, records_frame
from accelmatrix.results.schema import (
    CHECK_PERF_FIELDS,
    SCALAR_STEP,
    checks,
    metrics,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


class MeasurementStore(StoreCore):
    """Rows of ``metrics`` and ``checks``."""

    # ------------------------------------------------------------------------------ replaces

    def _replace(
        self, table: Table, key: dict[str, str], rows: list[dict[str, Any]], lock_name: str
    ) -> int:
        where = and_(*(table.c[k] == v for k, v in key.items()))

        def tx(conn: Connection) -> int:
            self._lock(conn, lock_name, *key.values())
            conn.execute(delete(table).where(where))
            if rows:
                conn.execute(insert(table), rows)
            return len(rows)

        return self._write(tx)

    def replace_metrics(
        self, dag_id: str, run_id: str, cell_id: str, rows: Sequence[MetricValue]
    ) -> int:
        """Make ``rows`` the cell's complete set of metrics, atomically; returns their count.

        ``value``: a number (NaN/inf kept; None stored as NaN); ``step``: an int >= 0, or
        None for a scalar; one value per (name, step). Replacing rather than merging means
        a retry that measured fewer metrics leaves no stale values from the failed attempt
        behind.
        """
        key = self._key(dag_id, run_id, cell_id)
        prepared: list[dict[str, Any]] = []
        seen: dict[tuple[str, int], int] = {}
        for i, row in enumerate(rows):
            if not isinstance(row, MetricValue):
                raise TypeError(f"metric row {i} must be a MetricValue, got {row!r}")
            step = row.step
            if step is None:
                step = SCALAR_STEP
            else:
                try:
                    step = operator.index(step)
                except TypeError:
                    raise ValueError(f"metric row {i}: step must be an int, got {step!r}") from None
                if step < 0:
                    raise ValueError(
                        f"metric row {i}: step must be >= 0 ({SCALAR_STEP} is reserved for "
                        "scalars; pass step=None)"
                    )
            value = row.value
            try:
                value = math.nan if value is None else float(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"metric {row.name!r} (row {i}): value {value!r} is not a number"
                ) from None
            fields = self._coerce(
                metrics, {"name": row.name, "unit": row.unit, "source": row.source}
            )
            if not fields["name"]:
                raise ValueError(f"metric row {i}: name must be a non-empty string")
            ident = (fields["name"], step)
            if ident in seen:
                raise ValueError(
                    f"metric {ident[0]!r} step {row.step!r} appears twice "
                    f"(rows {seen[ident]} and {i})"
                )
            seen[ident] = i
            prepared.append({**key, **fields, "step": step, "value": value})
        return self._replace(metrics, key, prepared, "metrics")

    def replace_checks(
        self, dag_id: str, run_id: str, cell_id: str, verdicts: Sequence[CheckVerdict]
    ) -> int:
        """Make ``verdicts`` the cell's complete set of check results, atomically.

        A verdict's ``name``/``type`` are stored as ``check_name``/``check_type`` (here, and
        nowhere else), its ``perf`` fields (a bounded perf check: benchmark, metric, value,
        lower_bound, upper_bound) as their columns; ``warning`` is not stored (the message
        says it). Non-string expected/observed values are stored as JSON text so a
        threshold like 0.5 or a dict of bounds stays readable and parseable.
        """
        import json

        key = self._key(dag_id, run_id, cell_id)
        prepared: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for i, v in enumerate(verdicts):
            if not isinstance(v, CheckVerdict):
                raise TypeError(f"check row {i} must be a CheckVerdict, got {v!r}")
            perf = v.perf or {}
            self._reject_unknown(f"check perf (row {i})", perf, CHECK_PERF_FIELDS)
            row: dict[str, Any] = {
                "check_name": v.name,
                "check_type": v.type or "",
                "passed": v.passed,
                "expected": v.expected,
                "observed": v.observed,
                "message": v.message,
                **{c: perf.get(c) for c in CHECK_PERF_FIELDS},
            }
            for c in ("expected", "observed", "message"):
                if row[c] is not None and not isinstance(row[c], str):
                    row[c] = json.dumps(row[c], sort_keys=True, default=str)
            row = self._coerce(checks, row)
            if not row["check_name"]:
                raise ValueError(f"check row {i}: check_name must be a non-empty string")
            if row["check_name"] in seen:
                raise ValueError(
                    f"check {row['check_name']!r} appears twice (rows {seen[row['check_name']]}"
                    f" and {i})"
                )
            seen[row["check_name"]] = i
            prepared.append({**key, **row})
        return self._replace(checks, key, prepared, "checks")

    def get_metrics(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> list[MetricRecord]:
        """Metric values, ``step`` None for scalars (the sentinel never leaks out)."""
        rows = self._filtered(
            metrics,
            ("dag_id", "run_id", "cell_id", "name", "step"),
            dag_id=dag_id,
            run_id=run_id,
            cell_id=cell_id,
        )
        return [metric_record(r) for r in rows]

    def get_checks(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> list[CheckRecord]:
        rows = self._filtered(
            checks,
            ("dag_id", "run_id", "cell_id", "check_name"),
            dag_id=dag_id,
            run_id=run_id,
            cell_id=cell_id,
        )
        return [check_record(r) for r in rows]

    def has_perf_checks(self, dag_id: str) -> bool:
        """Whether any run of ``dag_id`` has a bounded perf verdict (a series to classify).

        One indexed lookup: the gate asks it before importing pandas for the classification.
        """
        q = (
            select(checks.c.dag_id)
            .where(checks.c.dag_id == dag_id, checks.c.benchmark.is_not(None))
            .limit(1)
        )
        with self._reading() as conn:
            return conn.execute(q).first() is not None

    def metrics_frame(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> pd.DataFrame:
        """Long-form metrics; ``step`` is a nullable Int64 column, <NA> for scalars."""
        import pandas as pd

        rows = self.get_metrics(dag_id, run_id, cell_id)
        df = records_frame(rows, MetricRecord)
        df["step"] = pd.array([r.step for r in rows], dtype="Int64")
        df["value"] = df["value"].astype("float64")
        return df

    def checks_frame(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> pd.DataFrame:

        df = records_frame(self.get_checks(dag_id, run_id, cell_id), CheckRecord)
        df["passed"] = df["passed"].astype(bool)
        return df
