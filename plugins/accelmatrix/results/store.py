"""Idempotent, concurrency-safe reads and writes of accelmatrix's results database.

Every Airflow task of a cell reports here, and Airflow may retry a task or a user may clear
and re-run it, so no write may ever add a second copy of a row. Writes are therefore keyed
by (dag_id, run_id, cell_id) and are either upserts (runs, cells) or "delete this cell's
rows and insert the new set" in one transaction (metrics, checks).

Many task processes write to the same database at once:

* SQLite (the default file): WAL journal mode so readers never block the writer, a busy
  timeout of at least 30 s so a writer waits for the lock instead of failing with
  "database is locked", and write transactions opened with ``BEGIN IMMEDIATE`` so a
  transaction takes the write lock up front instead of failing half way when it upgrades
  from a read lock another writer got to first.
* PostgreSQL: native ``INSERT ... ON CONFLICT DO UPDATE``; the replace-a-cell's-rows writes
  and schema creation take a transaction-scoped advisory lock so two concurrent attempts of
  the same task serialise instead of colliding on the primary key.
* Any other dialect: UPDATE, then INSERT if nothing matched, retried when a concurrent
  writer wins the race (IntegrityError). Correct, just not as cheap.

Each public method opens its own short transaction: task processes are short-lived and
must not hold a lock across a slow workload.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    Table,
    and_,
    create_engine,
    delete,
    event,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import StaticPool

from accelmatrix.results import migrate, schema
from accelmatrix.results.schema import (
    CELL_FIELDS,
    CHECK_ROW_FIELDS,
    METRIC_ROW_FIELDS,
    RUN_FIELDS,
    SCALAR_STEP,
    alerts,
    cells,
    checks,
    metrics,
    runs,
    series_status,
    utcnow,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["ResultsStore", "SCALAR_STEP"]

T = TypeVar("T")

MIN_BUSY_TIMEOUT_S = 30.0
# Generic dialects resolve upsert races by retrying; three attempts is plenty because the
# loser of a race always finds the row on its next try.
_GENERIC_ATTEMPTS = 3
_SCHEMA_LOCK_NAME = "accelmatrix.results.schema"


def _advisory_key(*parts: str) -> int:
    """A stable signed 64-bit key for pg_advisory_xact_lock (Python's hash() is salted)."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _install_sqlite_pragmas(engine: Engine, busy_timeout_s: float, *, wal: bool) -> None:
    """Per-connection SQLite setup; see the module docstring for why each piece exists."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Stop the sqlite3 module from issuing its own BEGINs, so the "begin" hook below
        # decides how each transaction starts.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            # Busy timeout first: switching a fresh file to WAL needs a lock of its own.
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            if wal:
                _switch_to_wal(cur, busy_timeout_s)
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = "IMMEDIATE" if conn.get_execution_options().get("accelmatrix_write") else ""
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


def _switch_to_wal(cur: Any, busy_timeout_s: float) -> None:
    """WAL mode, once per database file (it persists), tolerating concurrent openers.

    Changing the journal mode needs an exclusive lock and SQLite does not always run the
    busy handler for it: several processes opening a fresh file at once get "database is
    locked" straight away. Read the mode first (a file already in WAL needs nothing) and
    retry the switch until the busy timeout.
    """
    import sqlite3

    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode")
            if str(cur.fetchone()[0]).lower() == "wal":
                return
            cur.execute("PRAGMA journal_mode = WAL")
            cur.fetchall()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _currency() -> str:
    """The currency of the pricing file the costs were computed with (USD by default)."""
    try:
        from accelmatrix.pricing import load_pricing

        return load_pricing().currency
    except Exception:  # a run table must render even when the pricing file is broken
        return "(currency of include/pricing.yaml)"


def _one_line(text_: str | None, width: int) -> str:
    s = re.sub(r"\s+", " ", text_ or "").strip()
    return s if len(s) <= width else s[: width - 3] + "..."


def _fmt_seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1f}"


def _join_names(names: Sequence[str], width: int) -> str:
    """Comma-joined names that fit ``width``, with a "+N more" tail when some do not."""
    if not names:
        return "-"
    out: list[str] = []
    for i, n in enumerate(names):
        rest = len(names) - i - 1
        candidate = ", ".join([*out, n])
        tail = f" (+{rest} more)" if rest else ""
        if out and len(candidate) + len(tail) > width:
            return ", ".join(out) + f" (+{len(names) - len(out)} more)"
        out.append(n)
    return ", ".join(out)


class ResultsStore:
    """Handle on one results database, given by a SQLAlchemy URL.

    Cheap to construct (nothing connects until the first call), safe to pickle and to use
    after ``fork``: the engine is rebuilt in a new process rather than sharing sockets or
    SQLite file handles with the parent. The schema is created on first use, so a task
    never fails on a fresh database because nobody ran ``ensure_schema()`` first.
    """

    def __init__(self, url: str, *, busy_timeout_s: float = MIN_BUSY_TIMEOUT_S):
        self.url = url
        # Never below 30 s: under a wide matrix many cells finish together, and a short
        # timeout turns ordinary lock waits into failed tasks.
        self.busy_timeout_s = max(float(busy_timeout_s), MIN_BUSY_TIMEOUT_S)
        self._engine: Engine | None = None
        self._write_engine: Engine | None = None
        self._pid: int | None = None
        self._schema_ready = False

    @classmethod
    def from_settings(cls) -> ResultsStore:
        """The store named by ``ACCELMATRIX_RESULTS_URL``, else the SQLite file under
        ``$ACCELMATRIX_HOME`` (default ``$AIRFLOW_HOME/accelmatrix``, AIRFLOW_HOME default
        ``~/airflow``), resolved by :mod:`accelmatrix.settings` so every process agrees."""
        from accelmatrix import settings

        return cls(settings.results_url())

    def __repr__(self) -> str:
        try:
            shown = make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - repr must never raise
            shown = "<unparsable url>"
        return f"ResultsStore({shown!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_engine=None, _write_engine=None, _pid=None)
        return state

    def close(self) -> None:
        """Close pooled connections (tests, long-lived CLIs); the store stays usable."""
        if self._engine is not None:
            self._engine.dispose()
        self._engine = self._write_engine = None
        self._pid = None

    # ----------------------------------------------------------------- engine & transactions

    @property
    def dialect(self) -> str:
        return self._get_engine().dialect.name

    def _get_engine(self) -> Engine:
        if self._engine is not None and self._pid == os.getpid():
            return self._engine
        if self._engine is not None:
            # Inherited across fork: drop the parent's pool without closing its connections,
            # which still belong to the parent.
            self._engine.dispose(close=False)
        engine = self._create_engine()
        self._engine = engine
        # Same pool and listeners; the option only tells SQLite's "begin" hook to go IMMEDIATE.
        self._write_engine = engine.execution_options(accelmatrix_write=True)
        self._pid = os.getpid()
        return engine

    def _create_engine(self) -> Engine:
        url = make_url(self.url)
        if url.get_backend_name() != "sqlite":
            # pre_ping: a pooled PostgreSQL connection may have been closed by the server or
            # a proxy between two writes of a long task.
            return create_engine(url, pool_pre_ping=True)

        db = url.database or ""
        memory = db in ("", ":memory:") or url.query.get("mode") == "memory"
        if memory:
            # One shared connection, or every checkout would see its own empty database.
            engine = create_engine(
                url, poolclass=StaticPool, connect_args={"check_same_thread": False}
            )
        else:
            if not db.startswith("file:"):
                path = Path(db).expanduser()
                path.parent.mkdir(parents=True, exist_ok=True)
                url = url.set(database=str(path))
            engine = create_engine(url, connect_args={"timeout": self.busy_timeout_s})
        _install_sqlite_pragmas(engine, self.busy_timeout_s, wal=not memory)
        return engine

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        self._get_engine()
        assert self._write_engine is not None
        with self._write_engine.begin() as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        self._ensure_ready()
        with self._get_engine().connect() as conn:
            yield conn

    def _write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one write transaction, retrying lost races on generic dialects."""
        self._ensure_ready()
        retries = 1 if self.dialect in ("sqlite", "postgresql") else _GENERIC_ATTEMPTS
        for attempt in range(retries):
            try:
                with self._writing() as conn:
                    return fn(conn)
            except IntegrityError:
                if attempt == retries - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _lock(self, conn: Connection, *parts: str) -> None:
        """Serialise writers of the same logical rows on PostgreSQL (no-op elsewhere:
        SQLite's BEGIN IMMEDIATE already serialises all writers)."""
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _advisory_key(*parts)})

    # ------------------------------------------------------------------------------- schema

    def ensure_schema(self) -> None:
        """Migrate the database to the newest schema; safe to call from many processes.

        Alembic (accelmatrix.results.migrate) runs inside this store's own write
        transaction and schema lock, so the first opener of a fresh or older database
        migrates it while the others wait, then find it at head. A database from before
        Alembic is adopted by the initial revision (missing tables created, missing
        nullable columns added); one lacking a NOT NULL column is refused with the list.
        """
        attempts = 1 if self.dialect in ("sqlite", "postgresql") else _GENERIC_ATTEMPTS
        for attempt in range(attempts):
            try:
                with self._writing() as conn:
                    self._lock(conn, _SCHEMA_LOCK_NAME)
                    migrate.upgrade(conn)
                break
            except DBAPIError:
                # Generic dialects: another process created a table between our existence
                # check and CREATE TABLE. The next pass sees it and skips it.
                if attempt == attempts - 1:
                    raise
        self._schema_ready = True

    def _ensure_ready(self) -> None:
        if not self._schema_ready:
            self.ensure_schema()

    # ----------------------------------------------------------------------------- validation

    @staticmethod
    def _check_id(what: str, value: Any, max_len: int) -> str:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{what} must be a non-empty string, got {value!r}")
        if len(value) > max_len:
            raise ValueError(f"{what} is {len(value)} characters long; the limit is {max_len}")
        return value

    def _key(self, dag_id: Any, run_id: Any, cell_id: Any = None) -> dict[str, str]:
        key = {
            "dag_id": self._check_id("dag_id", dag_id, schema.ID_LEN),
            "run_id": self._check_id("run_id", run_id, schema.ID_LEN),
        }
        if cell_id is not None:
            key["cell_id"] = self._check_id("cell_id", cell_id, schema.CELL_ID_LEN)
        return key

    @staticmethod
    def _reject_unknown(what: str, given: Mapping[str, Any], allowed: Sequence[str]) -> None:
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown {what} field(s): {', '.join(unknown)}; allowed: {', '.join(allowed)}"
            )

    @staticmethod
    def _coerce(table: Table, values: Mapping[str, Any]) -> dict[str, Any]:
        """Normalise values to their column's Python type, and fail here with the column's
        name rather than deep inside the driver (or, on SQLite, not at all)."""
        out: dict[str, Any] = {}
        for name, v in values.items():
            col = table.c[name]
            where = f"{table.name}.{name}"
            if v is None:
                if not col.nullable:
                    raise ValueError(f"{where} cannot be None")
                out[name] = None
                continue
            ctype = col.type
            bad = ValueError(f"{where}: {v!r} is not a valid {type(ctype).__name__.lower()}")
            if isinstance(ctype, Boolean):
                # Accepts numpy.bool_ and 0/1 too; refuses strings like "false" (truthy!).
                if isinstance(v, str) or v not in (True, False):
                    raise bad
                v = bool(v)
            elif isinstance(ctype, Integer):
                try:
                    v = operator.index(v)  # refuses 1.5 and "1"; takes numpy ints
                except TypeError:
                    raise bad from None
            elif isinstance(ctype, Float):
                if isinstance(v, str | bytes):
                    raise bad
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    raise bad from None
            elif isinstance(ctype, schema.UtcDateTime):
                try:
                    v = schema.to_utc(v)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            elif isinstance(ctype, String):
                if isinstance(v, os.PathLike):
                    v = os.fspath(v)  # data_docs is a path; Path objects are the natural input
                if isinstance(v, Enum):
                    v = v.value  # CellState / RunState: store the plain string, as always
                if not isinstance(v, str):
                    raise bad
                if ctype.length is not None and len(v) > ctype.length:
                    raise ValueError(
                        f"{where} is {len(v)} characters long; the limit is {ctype.length}"
                    )
            out[name] = v
        return out

    # ------------------------------------------------------------------------------- upserts

    def _upsert(self, table: Table, key: dict[str, str], fields: dict[str, Any]) -> None:
        now = utcnow()
        values = {**key, **fields, "updated_at": now}
        set_cols = [*fields, "updated_at"]
        dialect = self.dialect

        if dialect in ("sqlite", "postgresql"):
            if dialect == "sqlite":
                from sqlalchemy.dialects.sqlite import insert as dialect_insert
            else:
                from sqlalchemy.dialects.postgresql import insert as dialect_insert
            stmt = dialect_insert(table).values(values)
            # Only the fields the caller gave are overwritten: a partial update keeps the rest.
            stmt = stmt.on_conflict_do_update(
                index_elements=list(key), set_={c: stmt.excluded[c] for c in set_cols}
            )
            self._write(lambda conn: conn.execute(stmt))
            return

        where = and_(*(table.c[k] == v for k, v in key.items()))

        def generic(conn: Connection) -> None:
            res = conn.execute(update(table).where(where).values({c: values[c] for c in set_cols}))
            if res.rowcount == 0:
                conn.execute(insert(table).values(values))

        self._write(generic)

    def upsert_run(self, dag_id: str, run_id: str, **fields: Any) -> None:
        """Insert the run or update only the given fields; ``created_at`` is set once."""
        self._reject_unknown("run", fields, RUN_FIELDS)
        self._upsert(runs, self._key(dag_id, run_id), self._coerce(runs, fields))

    def upsert_cell(self, dag_id: str, run_id: str, cell_id: str, **fields: Any) -> None:
        """Insert the cell or update only the given fields (unspecified columns keep their
        values), so each task can report just what it learned."""
        self._reject_unknown("cell", fields, CELL_FIELDS)
        self._upsert(cells, self._key(dag_id, run_id, cell_id), self._coerce(cells, fields))

    def record_reaped(
        self,
        *,
        backend: str,
        name: str,
        labels: Mapping[str, str],
        reason: str,
        dry_run: bool,
        dag_id: str | None = None,
        run_id: str | None = None,
        cell_id: str | None = None,
        error: str | None = None,
    ) -> None:
        """Append one janitor decision to ``reaped`` (see accelmatrix.janitor)."""
        row = {
            "backend": backend,
            "name": name,
            "labels": dict(labels),
            "dag_id": dag_id[: schema.ID_LEN] if dag_id else None,
            "run_id": run_id[: schema.ID_LEN] if run_id else None,
            "cell_id": cell_id[: schema.CELL_ID_LEN] if cell_id else None,
            "reason": reason,
            "dry_run": bool(dry_run),
            "error": error,
            "at": schema.utcnow(),
        }
        self._write(lambda conn: conn.execute(insert(schema.reaped).values(row)))

    def get_reaped(self, *, backend: str | None = None) -> list[dict[str, Any]]:
        """Janitor decisions, oldest first (optionally of one backend)."""
        t = schema.reaped
        query = select(t).order_by(t.c.id)
        if backend is not None:
            query = query.where(t.c.backend == backend)
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(query).all()]

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
        self, dag_id: str, run_id: str, cell_id: str, rows: Sequence[Mapping[str, Any]]
    ) -> int:
        """Make ``rows`` the cell's complete set of metrics, atomically; returns their count.

        Row keys: ``name``, ``value`` (float; NaN/inf kept; None stored as NaN), ``step``
        (int >= 0, or None/absent for a scalar), ``unit`` and ``source`` (optional).
        Replacing rather than merging means a retry that measured fewer metrics leaves no
        stale values from the failed attempt behind.
        """
        key = self._key(dag_id, run_id, cell_id)
        prepared: list[dict[str, Any]] = []
        seen: dict[tuple[str, int], int] = {}
        for i, row in enumerate(rows):
            self._reject_unknown(f"metric (row {i})", row, METRIC_ROW_FIELDS)
            if "name" not in row or "value" not in row:
                raise ValueError(f"metric row {i} needs 'name' and 'value': {dict(row)!r}")
            step = row.get("step")
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
            value = row["value"]
            try:
                value = math.nan if value is None else float(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"metric {row['name']!r} (row {i}): value {value!r} is not a number"
                ) from None
            fields = self._coerce(
                metrics,
                {"name": row["name"], "unit": row.get("unit"), "source": row.get("source")},
            )
            if not fields["name"]:
                raise ValueError(f"metric row {i}: name must be a non-empty string")
            ident = (fields["name"], step)
            if ident in seen:
                raise ValueError(
                    f"metric {ident[0]!r} step {row.get('step')!r} appears twice "
                    f"(rows {seen[ident]} and {i})"
                )
            seen[ident] = i
            prepared.append({**key, **fields, "step": step, "value": value})
        return self._replace(metrics, key, prepared, "metrics")

    def replace_checks(
        self, dag_id: str, run_id: str, cell_id: str, verdicts: Sequence[Mapping[str, Any]]
    ) -> int:
        """Make ``verdicts`` the cell's complete set of check results, atomically.

        Keys: ``check_name``, ``passed`` (required), ``check_type``, ``expected``,
        ``observed``, ``message``. Non-string expected/observed values are stored as JSON
        text so a threshold like 0.5 or a dict of bounds stays readable and parseable.
        """
        import json

        key = self._key(dag_id, run_id, cell_id)
        prepared: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for i, v in enumerate(verdicts):
            self._reject_unknown(f"check (row {i})", v, CHECK_ROW_FIELDS)
            if "check_name" not in v or "passed" not in v:
                raise ValueError(f"check row {i} needs 'check_name' and 'passed': {dict(v)!r}")
            row = {c: v.get(c) for c in CHECK_ROW_FIELDS}
            if row["check_type"] is None:
                row["check_type"] = ""
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

    def reset_run(self, dag_id: str, run_id: str) -> int:
        """Delete the run's cells, metrics and checks (not its run row); returns rows deleted.

        Called by ``plan`` when a run is planned again (the whole run cleared, or a backfill
        re-processing a logical date that keeps its run_id): the re-run replaces its rows
        instead of leaving cells, metrics or verdicts of the previous attempt behind.
        """
        key = self._key(dag_id, run_id)

        def tx(conn: Connection) -> int:
            self._lock(conn, "reset", *key.values())
            n = 0
            for table in (metrics, checks, cells):
                n += conn.execute(
                    delete(table).where(
                        table.c.dag_id == key["dag_id"], table.c.run_id == key["run_id"]
                    )
                ).rowcount
            return n

        return self._write(tx)

    # ------------------------------------------------------------------------- series & alerts

    def replace_series_status(
        self, dag_id: str, rows: Sequence[Mapping[str, Any]], *, window_days: int
    ) -> int:
        """Make ``rows`` the suite's complete set of series verdicts, atomically.

        Row keys: ``benchmark``, ``cell_id``, ``metric``, ``status``, ``points``, ``flips``,
        ``trailing``, and optionally ``longest_earlier``, ``last_value``,
        ``last_logical_date``. Replaced per suite: a series that left the window is gone.
        """
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        allowed = tuple(
            c.name for c in series_status.columns if c.name not in ("dag_id", "window_days")
        )
        now = utcnow()
        prepared = []
        for i, row in enumerate(rows):
            self._reject_unknown(f"series status (row {i})", row, allowed)
            values = self._coerce(series_status, dict(row))
            prepared.append(
                {
                    "longest_earlier": 0,
                    "computed_at": now,
                    **values,
                    "dag_id": dag_id,
                    "window_days": int(window_days),
                }
            )

        def tx(conn: Connection) -> int:
            self._lock(conn, "series_status", dag_id)
            conn.execute(delete(series_status).where(series_status.c.dag_id == dag_id))
            if prepared:
                conn.execute(insert(series_status), prepared)
            return len(prepared)

        return self._write(tx)

    def get_series_status(
        self, dag_id: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        return self._filtered(
            series_status,
            ("dag_id", "benchmark", "cell_id", "metric"),
            dag_id=dag_id,
            status=status,
        )

    def suite_dag_ids(self) -> list[str]:
        """Every DAG id with a run in the store."""
        with self._reading() as conn:
            return sorted(r[0] for r in conn.execute(select(runs.c.dag_id).distinct()))

    def latest_logical_date(self, dag_id: str) -> Any:
        """The newest logical date among the DAG's runs (None if none has one)."""
        from sqlalchemy import func

        with self._reading() as conn:
            value = conn.execute(
                select(func.max(runs.c.logical_date)).where(runs.c.dag_id == dag_id)
            ).scalar()
        return schema.UtcDateTime().process_result_value(value, self._get_engine().dialect)

    def get_alert(self, dag_id: str, cell_id: str) -> dict[str, Any] | None:
        rows = self._filtered(alerts, ("dag_id",), dag_id=dag_id, cell_id=cell_id)
        return rows[0] if rows else None

    def get_alerts(
        self, dag_id: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        return self._filtered(alerts, ("dag_id", "cell_id"), dag_id=dag_id, status=status)

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

    # ------------------------------------------------------------------------------- history

    def history_rows(
        self,
        *,
        dag_id: str | None = None,
        suite: str | None = None,
        metric: str | None = None,
        benchmark: str | None = None,
        since: Any = None,
        until: Any = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """The raw rows perf history is built from (see accelmatrix.history.frame).

        ``{"runs": [...], "cells": [...], "metrics": [...], "checks": [...]}`` restricted
        to runs of ``dag_id``/``suite`` whose logical date is in [since, until], metric rows
        named ``metric`` (default: every metric a perf check judged) and perf check rows
        (those with a ``metric``), optionally of one ``benchmark``. Four indexed queries rather than one wide join: each table is read
        once and pandas does the join.
        """
        since_ = schema.to_utc(since)
        until_ = schema.to_utc(until)
        run_q = select(runs)
        if dag_id is not None:
            run_q = run_q.where(runs.c.dag_id == dag_id)
        if suite is not None:
            run_q = run_q.where(runs.c.suite == suite)
        # A run without a logical date (a manual Airflow 3 run) is placed by its start.
        undated = runs.c.logical_date.is_(None)
        if since_ is not None:
            run_q = run_q.where(
                or_(runs.c.logical_date >= since_, and_(undated, runs.c.started_at >= since_))
            )
        if until_ is not None:
            run_q = run_q.where(
                or_(runs.c.logical_date <= until_, and_(undated, runs.c.started_at <= until_))
            )
        with self._reading() as conn:
            run_rows = [dict(r._mapping) for r in conn.execute(run_q)]
            dags = sorted({r["dag_id"] for r in run_rows})
            run_ids = {(r["dag_id"], r["run_id"]) for r in run_rows}

            def rows_of(table: Table, *extra: Any) -> list[dict[str, Any]]:
                if not dags:
                    return []
                q = select(table).where(table.c.dag_id.in_(dags), *extra)
                return [
                    m
                    for m in (dict(r._mapping) for r in conn.execute(q))
                    if (m["dag_id"], m["run_id"]) in run_ids
                ]

            cell_rows = rows_of(cells)
            check_filter = [checks.c.metric.is_not(None)]
            if metric:
                check_filter.append(checks.c.metric == metric)
            if benchmark:
                check_filter.append(checks.c.benchmark == benchmark)
            check_rows = rows_of(checks, *check_filter)
            # Without ``metric``: only metrics some perf check judged, not every loss curve.
            names = [metric] if metric else sorted({c["metric"] for c in check_rows})
            metric_rows = rows_of(metrics, metrics.c.name.in_(names)) if names else []
        for r in metric_rows:
            if r["step"] == SCALAR_STEP:
                r["step"] = None
        return {"runs": run_rows, "cells": cell_rows, "metrics": metric_rows, "checks": check_rows}

    # --------------------------------------------------------------------------------- reads

    @staticmethod
    def _cell_sort_key(c: Mapping[str, Any]) -> tuple[bool, int, str]:
        idx = c.get("cell_index")
        return (idx is None, idx if idx is not None else 0, c["cell_id"])

    def get_run(self, dag_id: str, run_id: str) -> dict[str, Any] | None:
        """The run's row as a dict (params decoded, timestamps aware UTC), or None."""
        key = self._key(dag_id, run_id)
        with self._reading() as conn:
            row = conn.execute(
                select(runs).where(runs.c.dag_id == key["dag_id"], runs.c.run_id == key["run_id"])
            ).first()
        return dict(row._mapping) if row is not None else None

    def perf_points(
        self, dag_id: str, *, since: Any = None, until: Any = None
    ) -> list[dict[str, Any]]:
        """Every perf check verdict of the DAG's runs whose time is in [since, until]: run_id,
        cell_id, benchmark, metric, value (what the check judged), lower_bound, upper_bound,
        and the run's logical_date, started_at and created_at.

        One narrow indexed join, for the matrix page's trend charts: the full
        ``history_rows`` (every cell column of every run) is ~10x more to read for a
        1,024-cell suite. A run without a logical date is placed by its start.
        """
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        since_, until_ = schema.to_utc(since), schema.to_utc(until)
        q = (
            select(
                checks.c.run_id,
                checks.c.cell_id,
                checks.c.benchmark,
                checks.c.metric,
                checks.c.value,
                checks.c.lower_bound,
                checks.c.upper_bound,
                runs.c.logical_date,
                runs.c.started_at,
                runs.c.created_at,
            )
            .select_from(
                checks.join(
                    runs, and_(runs.c.dag_id == checks.c.dag_id, runs.c.run_id == checks.c.run_id)
                )
            )
            .where(
                checks.c.dag_id == dag_id,
                checks.c.metric.is_not(None),
                checks.c.benchmark.is_not(None),
            )
        )
        undated = runs.c.logical_date.is_(None)
        if since_ is not None:
            q = q.where(
                or_(runs.c.logical_date >= since_, and_(undated, runs.c.started_at >= since_))
            )
        if until_ is not None:
            q = q.where(
                or_(runs.c.logical_date <= until_, and_(undated, runs.c.started_at <= until_))
            )
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def get_runs(self, dag_id: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The DAG's runs, newest first (by start, then creation): the matrix page's run
        picker and its "latest run"."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        stmt = (
            select(runs)
            .where(runs.c.dag_id == dag_id)
            .order_by(
                runs.c.started_at.is_(None),
                runs.c.started_at.desc(),
                runs.c.created_at.desc(),
                runs.c.run_id.desc(),
            )
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def get_cells(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every cell of the run, in plan order (cell_index, then cell_id)."""
        key = self._key(dag_id, run_id)
        with self._reading() as conn:
            rows = conn.execute(
                select(cells).where(
                    cells.c.dag_id == key["dag_id"], cells.c.run_id == key["run_id"]
                )
            ).all()
        return sorted((dict(r._mapping) for r in rows), key=self._cell_sort_key)

    def get_cell(self, dag_id: str, run_id: str, cell_id: str) -> dict[str, Any] | None:
        key = self._key(dag_id, run_id, cell_id)
        with self._reading() as conn:
            row = conn.execute(
                select(cells).where(*(cells.c[k] == v for k, v in key.items()))
            ).first()
        return dict(row._mapping) if row is not None else None

    def _filtered(
        self, table: Table, order: Sequence[str], **filters: str | None
    ) -> list[dict[str, Any]]:
        stmt = (
            select(table)
            .where(*(table.c[k] == v for k, v in filters.items() if v is not None))
            .order_by(*(table.c[c] for c in order))
        )
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def get_metrics(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Metric rows as dicts, ``step`` None for scalars (the sentinel never leaks out)."""
        rows = self._filtered(
            metrics,
            ("dag_id", "run_id", "cell_id", "name", "step"),
            dag_id=dag_id,
            run_id=run_id,
            cell_id=cell_id,
        )
        for r in rows:
            if r["step"] == SCALAR_STEP:
                r["step"] = None
        return rows

    def get_checks(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> list[dict[str, Any]]:
        return self._filtered(
            checks,
            ("dag_id", "run_id", "cell_id", "check_name"),
            dag_id=dag_id,
            run_id=run_id,
            cell_id=cell_id,
        )

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

        cols = ["dag_id", "run_id", "cell_id", "name", "step", "value", "unit", "source"]
        rows = self.get_metrics(dag_id, run_id, cell_id)
        df = pd.DataFrame.from_records(rows, columns=cols)
        df["step"] = pd.array([r["step"] for r in rows], dtype="Int64")
        df["value"] = df["value"].astype("float64")
        return df

    def checks_frame(
        self, dag_id: str | None = None, run_id: str | None = None, cell_id: str | None = None
    ) -> pd.DataFrame:
        import pandas as pd

        cols = [c.name for c in checks.columns]
        df = pd.DataFrame.from_records(self.get_checks(dag_id, run_id, cell_id), columns=cols)
        df["passed"] = df["passed"].astype(bool)
        return df

    # ------------------------------------------------------------------------------ reports

    def run_table(self, dag_id: str, run_id: str) -> str:
        """The run's cells as a fixed-width table for task logs and the CLI.

        Cells that only have check rows (their cell row was never written, e.g. a task
        crashed before reporting) are listed too, so a failure is never hidden by a gap.
        """
        cell_rows = self.get_cells(dag_id, run_id)
        failed: dict[str, list[str]] = {}
        for c in self.get_checks(dag_id, run_id):
            if not c["passed"]:
                failed.setdefault(c["cell_id"], []).append(c["check_name"])
        known = {c["cell_id"] for c in cell_rows}
        for cid in sorted(set(failed) - known):
            cell_rows.append({"cell_id": cid, "state": "?", "message": "no cell row recorded"})

        if not cell_rows:
            return f"No cells recorded for {dag_id} / {run_id}"

        header = ("cell", "state", "exit", "held s", "workload s", "failed checks", "message")
        numeric = {2, 3, 4}
        table: list[tuple[str, ...]] = [header]
        counts: dict[str, int] = {}
        for c in cell_rows:
            state = c.get("state") or "-"
            counts[state] = counts.get(state, 0) + 1
            if c.get("quarantined"):
                state += " (quarantined)"
            exit_code = c.get("exit_code")
            message = c.get("message") or c.get("excluded_reason") or ""
            table.append(
                (
                    c["cell_id"],
                    state,
                    "-" if exit_code is None else str(exit_code),
                    _fmt_seconds(c.get("resource_held_seconds")),
                    _fmt_seconds(c.get("workload_seconds")),
                    _join_names(failed.get(c["cell_id"], []), 60),
                    _one_line(message, 80),
                )
            )
        widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]

        def fmt(r: tuple[str, ...]) -> str:
            cells_ = [
                r[i].rjust(widths[i]) if i in numeric else r[i].ljust(widths[i])
                for i in range(len(widths))
            ]
            return ("  ".join(cells_) + "  " + r[-1]).rstrip()

        lines = [fmt(r) for r in table]
        lines.insert(1, "-" * max(len(x) for x in lines))
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        head = f"Results of {dag_id} / {run_id}: {len(cell_rows)} cell(s): {summary}"
        costs = [c["cost"] for c in cell_rows if c.get("cost") is not None]
        if costs:
            head += f"; cost {sum(costs):.6f} {_currency()}"
        return head + "\n" + "\n".join(lines)
