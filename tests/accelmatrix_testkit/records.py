"""Store records built in a test without a store: a cell, a check verdict, an alert, with
the key fields a test does not care about filled in; and a verdict as the evaluate step
hands it to the store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.run_records import CellRecord, CheckRecord
from accelmatrix.contracts.series_records import AlertRecord

__all__ = ["alert", "cell", "check", "verdict"]

DAG_ID = "dag"
RUN_ID = "run"


def cell(cell_id: str, **fields: Any) -> CellRecord:
    """A cell of run ``run`` of ``dag`` (``dag_id``/``run_id`` may be given)."""
    fields.setdefault("dag_id", DAG_ID)
    fields.setdefault("run_id", RUN_ID)
    return CellRecord(cell_id=cell_id, **fields)


def check(cell_id: str, passed: bool, **fields: Any) -> CheckRecord:
    """A check verdict of a cell; its name is ``check`` unless given."""
    fields.setdefault("dag_id", DAG_ID)
    fields.setdefault("run_id", RUN_ID)
    fields.setdefault("check_name", "check")
    return CheckRecord(cell_id=cell_id, passed=passed, **fields)


def verdict(name: str, passed: bool, **fields: Any) -> CheckVerdict:
    """A check verdict for ``replace_checks``: type, expected, observed and message empty
    unless given (``perf`` too: a bounded perf check's fields)."""
    for k in ("type", "expected", "observed", "message"):
        fields.setdefault(k, "")
    return CheckVerdict(name=name, passed=passed, **fields)


def alert(cell_id: str, **fields: Any) -> AlertRecord:
    """An open failure alert of a cell, seen first and last now, in run ``run``."""
    now = datetime.now(UTC)
    for k, v in (
        ("dag_id", DAG_ID),
        ("status", "open"),
        ("kind", "failure"),
        ("opened_at", now),
        ("last_seen_at", now),
        ("first_run_id", RUN_ID),
        ("last_run_id", RUN_ID),
    ):
        fields.setdefault(k, v)
    return AlertRecord(cell_id=cell_id, **fields)
