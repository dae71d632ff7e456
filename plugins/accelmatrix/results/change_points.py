"""Change points of perf series and the groups (causes) they belong to, with their triage.

The detector and the grouping are pure functions in ``accelmatrix.history``; this module
only keeps their output between runs, and the triage people give it: a state, who set it
and when. Triage of a group applies to every change point in it (one decision per cause).
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import IntegrityError

from accelmatrix.contracts.change_point_records import (
    OPEN_STATES,
    TRIAGE_STATES,
    ChangeGroup,
    ChangePoint,
    Confirmation,
)
from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore, _advisory_key
from accelmatrix.results.row_records import change_group, change_point, confirmation
from accelmatrix.results.schema import change_groups, change_points, confirmations, utcnow

__all__ = ["OPEN_STATES", "TRIAGE_STATES", "ChangePointStore"]

# The triage states and the open ones are the change records' (accelmatrix.contracts).

_POINT_FIELDS = tuple(
    c.name for c in change_points.columns if c.name not in ("id", "dag_id", "updated_at")
)
_GROUP_FIELDS = tuple(
    c.name for c in change_groups.columns if c.name not in ("id", "dag_id", "updated_at")
)
_CONFIRMATION_FIELDS = tuple(
    c.name for c in confirmations.columns if c.name not in ("id", "dag_id", "updated_at")
)


class ChangePointStore(StoreCore):
    """Rows of ``change_points`` and ``change_groups``."""

    # ------------------------------------------------------------------------------ points

    def get_change_points(
        self,
        dag_id: str | None = None,
        *,
        cell_id: str | None = None,
        metric: str | None = None,
        group_id: int | None = None,
        states: Iterable[str] | None = None,
        since: datetime | None = None,
        ids: Iterable[int] | None = None,
    ) -> list[ChangePoint]:
        """Change points, oldest first (by the first run at the new level)."""
        c = change_points.c
        where = []
        for col, v in (("dag_id", dag_id), ("cell_id", cell_id), ("metric", metric)):
            if v is not None:
                where.append(c[col] == v)
        if group_id is not None:
            where.append(c.group_id == int(group_id))
        if states is not None:
            where.append(c.state.in_(list(states)))
        if since is not None:
            where.append(c.logical_date >= schema.to_utc(since))
        if ids is not None:
            where.append(c.id.in_([int(i) for i in ids]))
        stmt = select(change_points).where(*where).order_by(c.logical_date, c.cell_id, c.metric)
        with self._reading() as conn:
            return [change_point(r) for r in conn.execute(stmt)]

    def save_change_point(self, dag_id: str, *, id: int | None = None, **fields: Any) -> int:
        """Insert a change point (``id`` None) or update the given fields of one; its id.
        The fields are ``ChangePoint``'s (``id`` and ``dag_id`` aside)."""
        return self._save(change_points, _POINT_FIELDS, dag_id, fields, id)

    def delete_change_points(self, ids: Sequence[int]) -> int:
        """Delete change points the detector no longer finds (only untriaged ones are ever
        passed: a person's decision is kept)."""
        if not ids:
            return 0

        def tx(conn: Connection) -> int:
            stmt = delete(change_points).where(change_points.c.id.in_([int(i) for i in ids]))
            return conn.execute(stmt).rowcount

        return self._write(tx)

    # ------------------------------------------------------------------------------ groups

    def get_change_groups(
        self,
        dag_id: str | None = None,
        *,
        states: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
    ) -> list[ChangeGroup]:
        """Groups, newest first."""
        g = change_groups.c
        where = []
        if dag_id is not None:
            where.append(g.dag_id == dag_id)
        if states is not None:
            where.append(g.state.in_(list(states)))
        if ids is not None:
            where.append(g.id.in_([int(i) for i in ids]))
        stmt = select(change_groups).where(*where).order_by(g.logical_date.desc(), g.id.desc())
        with self._reading() as conn:
            return [change_group(r) for r in conn.execute(stmt)]

    def get_change_group(self, group_id: int) -> ChangeGroup | None:
        rows = self.get_change_groups(ids=[group_id])
        return rows[0] if rows else None

    def save_change_group(self, dag_id: str, *, id: int | None = None, **fields: Any) -> int:
        """Insert a group (``id`` None) or update the given fields of one; its id. The
        fields are ``ChangeGroup``'s (``id`` and ``dag_id`` aside)."""
        return self._save(change_groups, _GROUP_FIELDS, dag_id, fields, id)

    def delete_change_groups(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0

        def tx(conn: Connection) -> int:
            stmt = delete(change_groups).where(change_groups.c.id.in_([int(i) for i in ids]))
            return conn.execute(stmt).rowcount

        return self._write(tx)

    # ----------------------------------------------------------------------- confirmations

    def start_confirmation(self, dag_id: str, group_id: int, **fields: Any) -> Confirmation | None:
        """Record the re-test of a group (``fields``: ``Confirmation``'s); None when the
        group already has one (the unique key decides, so two gates racing start one
        re-test, never two)."""
        try:
            cid = self._save(
                confirmations, _CONFIRMATION_FIELDS, dag_id, {**fields, "group_id": group_id}, None
            )
        except IntegrityError:
            return None
        return self.get_confirmations(ids=[cid])[0]

    def get_confirmations(
        self,
        dag_id: str | None = None,
        *,
        group_id: int | None = None,
        ids: Iterable[int] | None = None,
        states: Iterable[str] | None = None,
    ) -> list[Confirmation]:
        """Re-tests, oldest first."""
        c = confirmations.c
        where = []
        if dag_id is not None:
            where.append(c.dag_id == dag_id)
        if group_id is not None:
            where.append(c.group_id == int(group_id))
        if ids is not None:
            where.append(c.id.in_([int(i) for i in ids]))
        if states is not None:
            where.append(c.state.in_(list(states)))
        with self._reading() as conn:
            rows = conn.execute(select(confirmations).where(*where).order_by(c.id))
            return [confirmation(r) for r in rows]

    def save_confirmation(self, dag_id: str, *, id: int, **fields: Any) -> int:
        """Update the given fields of a re-test (``Confirmation``'s)."""
        return self._save(confirmations, _CONFIRMATION_FIELDS, dag_id, fields, id)

    # ------------------------------------------------------------------------------ triage

    def set_triage(
        self, what: str, id: int, state: str, *, by: str, note: str | None = None
    ) -> ChangeGroup | ChangePoint:
        """Set the triage state of a group (and every change point in it) or of one change
        point; records who and when. Returns the updated record; KeyError if there is none."""
        if what not in ("group", "change"):
            raise ValueError(f"what must be 'group' or 'change', got {what!r}")
        if state not in TRIAGE_STATES:
            raise ValueError(f"state {state!r}: allowed {', '.join(TRIAGE_STATES)}")
        if not by:
            raise ValueError("who sets the state (by) must be named")
        now = utcnow()
        values: dict[str, Any] = {"state": state, "state_by": by, "state_at": now}
        if note is not None:
            values["note"] = note
        values = {**self._coerce(change_points, values), "updated_at": now}
        table = change_groups if what == "group" else change_points

        def tx(conn: Connection) -> int:
            n = conn.execute(update(table).where(table.c.id == int(id)).values(values)).rowcount
            if n and what == "group":
                conn.execute(
                    update(change_points).where(change_points.c.group_id == int(id)).values(values)
                )
            return n

        if not self._write(tx):
            raise KeyError(f"no change {what} with id {id}")
        if what == "group":
            return self.get_change_groups(ids=[id])[0]
        return self.get_change_points(ids=[id])[0]

    # ------------------------------------------------------------------------------ passes

    @contextmanager
    def changes_lock(self, dag_id: str, timeout_s: float = 300.0) -> Iterator[None]:
        """Hold the suite's change-point lock: one pass (read, match, write, group) at a
        time per suite, across processes.

        A pass is many short transactions, so the database's own write lock does not keep
        two gates of one suite (``max_active_runs`` > 1, a backfill beside the nightly)
        from both inserting the same change or both opening a group. PostgreSQL: a
        session advisory lock on a connection held for the pass. SQLite: an exclusive
        ``flock`` on a file beside the database (every writer is on this machine anyway).
        Other dialects: no lock (the unique key on change points still refuses doubles).
        """
        url = make_url(self.url)
        backend = url.get_backend_name()
        if backend == "postgresql":
            engine = self._get_engine()
            with engine.connect() as conn:
                key = _advisory_key("change_points", dag_id)
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            return
        if backend != "sqlite" or not url.database or url.database == ":memory:":
            yield
            return
        path = Path(url.database).with_name(Path(url.database).name + ".changes.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as f:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"change-point lock {path} held for over {timeout_s:.0f} s"
                        ) from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ------------------------------------------------------------------------------ helpers

    def _save(
        self,
        table: Any,
        allowed: Sequence[str],
        dag_id: str,
        fields: Mapping[str, Any],
        id: int | None,
    ) -> int:
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        self._reject_unknown(table.name, fields, allowed)
        now = utcnow()
        values = {**self._coerce(table, fields), "updated_at": now}

        def tx(conn: Connection) -> int:
            if id is None:
                self._lock(conn, table.name, dag_id)
                res = conn.execute(insert(table).values({**values, "dag_id": dag_id}))
                return int(res.inserted_primary_key[0])
            stmt = update(table).where(table.c.id == int(id), table.c.dag_id == dag_id)
            if conn.execute(stmt.values(values)).rowcount == 0:
                raise KeyError(f"no {table.name} row {id} of {dag_id}")
            return int(id)

        return self._write(tx)
