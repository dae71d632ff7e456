"""Re-centered step-time bounds: one row per benchmark per re-centering, newest in force.

The bounds files under include/ come from git (a DAG bundle, git-sync) and are never
written: when accelmatrix re-centers a benchmark's bounds (the maintenance DAG, or a
person accepting a change) it appends a row here, with who, when and why. Readers overlay
the newest row of each (file, benchmark) on the file (``evaluation.bounds.apply_stored``);
``python -m accelmatrix bounds export FILE`` prints the file with them applied, for a PR.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import msgspec
from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.contracts.series_records import BoundsRecord, BoundsValues
from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore
from accelmatrix.results.row_records import bounds_record
from accelmatrix.results.schema import bounds, utcnow

__all__ = ["BOUNDS_REASONS", "BoundsStore"]

BOUNDS_REASONS = ("accepted change", "maintenance")


class BoundsStore(StoreCore):
    """Rows of ``bounds``."""

    def add_bounds(
        self,
        file: str,
        rows: Iterable[BoundsValues],
        *,
        reason: str,
        by: str,
        detail: JsonObject | None = None,
        note: str | None = None,
        at: datetime | None = None,
    ) -> list[int]:
        """Append one row per benchmark of ``file`` (relative to the include dir), all in
        one transaction; their ids. The newest row of a (file, benchmark) is in force.
        ``reason``, ``by``, ``detail``, ``note`` and ``at`` are the same for every row."""
        self._check_id("file", file, schema.NAME_LEN)
        if reason not in BOUNDS_REASONS:
            raise ValueError(f"reason {reason!r}: allowed {', '.join(BOUNDS_REASONS)}")
        if not by:
            raise ValueError("who re-centers the bounds (by) must be named")
        common = self._coerce(
            bounds,
            {"file": file, "reason": reason, "by": by, "at": at or utcnow(), "note": note},
        )
        values = []
        for i, row in enumerate(rows):
            if not isinstance(row, BoundsValues):
                raise TypeError(f"bounds row {i} must be a BoundsValues, got {row!r}")
            self._check_id("benchmark", row.benchmark, schema.NAME_LEN)
            fields = self._coerce(bounds, msgspec.structs.asdict(row))
            values.append({**common, **fields, "detail": dict(detail or {})})
        if not values:
            return []

        def tx(conn: Connection) -> list[int]:
            self._lock(conn, "bounds", file)
            return [
                int(conn.execute(insert(bounds).values(v)).inserted_primary_key[0]) for v in values
            ]

        return self._write(tx)

    def bounds_in_force(self, file: str) -> dict[str, BoundsRecord]:
        """benchmark -> its newest row of ``file`` (none: the file's values hold)."""
        b = bounds.c
        newest = (
            select(func.max(b.id)).where(b.file == file).group_by(b.benchmark).scalar_subquery()
        )
        stmt = select(bounds).where(b.id.in_(newest))
        with self._reading() as conn:
            return {r.benchmark: bounds_record(r) for r in conn.execute(stmt)}

    def get_bounds_history(
        self,
        files: Iterable[str] | None = None,
        *,
        benchmark: str | None = None,
        limit: int | None = None,
    ) -> list[BoundsRecord]:
        """Stored rows, newest first (of these files, of this benchmark)."""
        b = bounds.c
        where = []
        if files is not None:
            where.append(b.file.in_(list(files)))
        if benchmark is not None:
            where.append(b.benchmark == benchmark)
        stmt = select(bounds).where(*where).order_by(b.id.desc())
        if limit is not None:
            stmt = stmt.limit(int(limit))
        with self._reading() as conn:
            return [bounds_record(r) for r in conn.execute(stmt)]
