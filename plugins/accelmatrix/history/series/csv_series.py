"""Read one series from a CSV file with the header ``time,value``, for
``python -m accelmatrix changepoints FILE.csv``: people export a series from another
system (or CI produces one) and want the same detector the history uses.

Every problem is one ``SeriesFileError`` naming the file, the row and the field, and what
is allowed; nothing is guessed. Times are all integers or all ISO-8601 dates/datetimes;
points are analysed in time order (a file out of order is sorted, stably).
"""

from __future__ import annotations

import csv
import math
from datetime import UTC, date, datetime
from pathlib import Path

__all__ = ["MIN_POINTS", "SeriesFileError", "read_series"]

MIN_POINTS = 3


class SeriesFileError(ValueError):
    """The file cannot be read as a series; the message says where and why."""


def read_series(path: Path) -> tuple[list[int | str], list[float]]:
    """(times as written, values), in time order."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SeriesFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SeriesFileError(f"{path}: cannot be read: {e}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in ("time", "value") if c not in header]
    if missing:
        raise SeriesFileError(
            f"{path}: missing column(s) {', '.join(missing)}; the header must name "
            f"time and value (found: {', '.join(header) or 'no header'})"
        )
    reader.fieldnames = header
    rows: list[tuple[object, int | str, float]] = []
    kinds: set[str] = set()
    for line, row in enumerate(reader, start=2):
        raw_t = (row.get("time") or "").strip()
        raw_v = (row.get("value") or "").strip()
        key, kind = _time(path, line, raw_t)
        kinds.add(kind)
        if len(kinds) > 1:
            raise SeriesFileError(
                f"{path}: line {line}: time {raw_t!r} mixes integers and dates; use one kind"
            )
        try:
            v = float(raw_v)
        except ValueError:
            raise SeriesFileError(f"{path}: line {line}: value {raw_v!r} is not a number") from None
        if not math.isfinite(v):
            raise SeriesFileError(
                f"{path}: line {line}: value {raw_v!r} is not a finite number (NaN and "
                "infinity are not allowed: drop the point or fill it)"
            )
        rows.append((key, int(raw_t) if kind == "integer" else raw_t, v))
    if len(rows) < MIN_POINTS:
        raise SeriesFileError(f"{path}: {len(rows)} point(s); a series needs at least {MIN_POINTS}")
    rows.sort(key=lambda r: r[0])  # type: ignore[arg-type,return-value]
    return [r[1] for r in rows], [r[2] for r in rows]


def _time(path: Path, line: int, raw: str) -> tuple[object, str]:
    try:
        return int(raw), "integer"
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        try:
            t = datetime.combine(date.fromisoformat(raw), datetime.min.time())
        except ValueError:
            raise SeriesFileError(
                f"{path}: line {line}: time {raw!r} is neither an integer nor an ISO date "
                "(2026-11-28 or 2026-11-28T02:00:00)"
            ) from None
    # Aware and naive datetimes do not compare: sort on the wall-clock time in UTC.
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return t, "date"
