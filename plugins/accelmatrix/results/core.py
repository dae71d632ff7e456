"""The results store's database core: engine, transactions, locks, migrations, validation.

The other modules of this package add the reads and writes of one concern each as
subclasses of :class:`StoreCore`; ``accelmatrix.results.store.ResultsStore`` joins them.
How a write stays idempotent and concurrency-safe:

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
import logging
import operator
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    Table,
    create_engine,
    event,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine, Row, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from accelmatrix import settings
from accelmatrix.results import migrate, schema

__all__ = ["StoreCore"]

T = TypeVar("T")
_log = logging.getLogger(__name__)

MIN_BUSY_TIMEOUT_S = 30.0
# Generic dialects resolve upsert races by retrying; three attempts is plenty because the
# loser of a race always finds the row on its next try.
_GENERIC_ATTEMPTS = 3
_SCHEMA_LOCK_NAME = "accelmatrix.results.schema"
# How long a call waits for a database server it cannot reach (a restart, a failover) before
# it fails with the connection error; ACCELMATRIX_RESULTS_OUTAGE_SECONDS overrides it. SQLite
# has no server: its errors are never waited out here.
OUTAGE_WAIT_S = 120.0
_OUTAGE_POLL_S = (0.5, 5.0)  # first and longest pause between two tries


def _outage_wait_s() -> float:
    try:
        return max(0.0, float(os.environ.get("ACCELMATRIX_RESULTS_OUTAGE_SECONDS", OUTAGE_WAIT_S)))
    except ValueError:
        return OUTAGE_WAIT_S


def _server_unreachable(e: OperationalError) -> bool:
    """The server could not be reached or dropped the connection (no statement failed):
    refused, reset, shut down. A server's own error (SQLSTATE outside classes 08 and 57,
    e.g. a deadlock) is not an outage."""
    if e.connection_invalidated:
        return True
    code = getattr(e.orig, "pgcode", None)
    return code is None or str(code)[:2] in ("08", "57")


def _waiting_out_outages(fn: Callable[[], T], dialect: str) -> T:
    """``fn()``, tried again while the database server is unreachable, for at most
    ``OUTAGE_WAIT_S``. Only for calls that are safe to repeat: a connect, a read, or a write
    transaction (every write of the store is idempotent, and one that did not commit left
    nothing)."""
    if dialect == "sqlite":
        return fn()
    deadline: float | None = None
    pause = _OUTAGE_POLL_S[0]
    while True:
        try:
            return fn()
        except OperationalError as e:
            if not _server_unreachable(e):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + _outage_wait_s()
            if now >= deadline:
                raise
            _log.warning(
                "results store unreachable (retrying for %.0f s more): %s",
                deadline - now,
                str(e.orig).strip().splitlines()[0] if e.orig else e,
            )
            time.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, _OUTAGE_POLL_S[1])


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
                # SQLite's advice for WAL: a commit survives a crash of the process or of
                # Airflow, and only an OS crash can lose the last commits. FULL (the default)
                # adds an fsync to each commit (~5 ms here), taken while holding the one
                # write lock every task of a run queues for.
                cur.execute("PRAGMA synchronous = NORMAL")
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


class StoreCore:
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
    def from_settings(cls) -> Self:
        """The store named by ``ACCELMATRIX_RESULTS_URL``, else the SQLite file under
        ``$ACCELMATRIX_HOME`` (default ``$AIRFLOW_HOME/accelmatrix``, AIRFLOW_HOME default
        ``~/airflow``), resolved by :mod:`accelmatrix.settings` so every process agrees."""

        return cls(settings.results_url())

    def __repr__(self) -> str:
        try:
            shown = make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - repr must never raise
            shown = "<unparsable url>"
        return f"{type(self).__name__}({shown!r})"

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
            # Inherited across fork: give this process a pool of its own without closing
            # the parent's connections (they still belong to the parent), and keep the
            # engine itself, as SQLAlchemy's guide to os.fork() advises. Its dialect, set up
            # on the first connect, and its compiled-statement cache come along, which is
            # what ResultsStore.warm() prepares once for every task process forked after it.
            self._engine.dispose(close=False)
            # The parent's schema check does not vouch for this process's view of the
            # database (it may have been replaced since); check again, cheaply when warm.
            self._schema_ready = False
        else:
            self._engine = self._create_engine()
            # Same pool and listeners; the option only tells SQLite's "begin" hook to go
            # IMMEDIATE.
            self._write_engine = self._engine.execution_options(accelmatrix_write=True)
        self._pid = os.getpid()
        return self._engine

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
        engine = self._write_engine
        conn = _waiting_out_outages(engine.connect, self.dialect)
        with conn, conn.begin():
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        self._ensure_ready()
        engine = self._get_engine()
        with _waiting_out_outages(engine.connect, self.dialect) as conn:
            yield conn

    def _write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one write transaction, retrying lost races on generic dialects and
        waiting out a database server that went away (see ``_waiting_out_outages``)."""
        self._ensure_ready()
        retries = 1 if self.dialect in ("sqlite", "postgresql") else _GENERIC_ATTEMPTS

        def once() -> T:
            with self._writing() as conn:
                return fn(conn)

        for attempt in range(retries):
            try:
                return _waiting_out_outages(once, self.dialect)
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
        # Every task process opens the store once, and all but the first opener of a database
        # find it at head: a plain read says so, without SQLite's write lock (BEGIN
        # IMMEDIATE), which every other writer of the run would queue behind.
        engine = self._get_engine()
        with _waiting_out_outages(engine.connect, self.dialect) as conn:
            if migrate.is_at_head(conn):
                self._schema_ready = True
                return
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

    def _filtered(self, table: Table, order: Sequence[str], **filters: str | None) -> list[Row]:
        stmt = (
            select(table)
            .where(*(table.c[k] == v for k, v in filters.items() if v is not None))
            .order_by(*(table.c[c] for c in order))
        )
        with self._reading() as conn:
            return list(conn.execute(stmt))
