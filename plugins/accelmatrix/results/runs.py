"""Runs and cells: the keyed upserts every step reports through, their reads, the
per-run reset, and the janitor's ``reaped`` log.

A suite's **follow-up runs** (re-tests of named builds: confirm, bisect, compare) are runs
of its DAG too, but never the suite's "latest run" nor a point of its history: a run is one
when its run type is in ``schema.FOLLOWUP_RUN_TYPES``, its params hold the block
``accelmatrix_followup`` (``spec.followup.FOLLOWUP_KEY``), or its run id has a follow-up
prefix (``accelmatrix_confirm__`` ...: a run refused before its plan recorded a run type).
``is_followup`` says so of a row, ``suite_runs`` as a SQL condition.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from sqlalchemy import (
    Table,
    Text,
    and_,
    cast,
    delete,
    func,
    insert,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.contracts.run_records import (
    CellRecord,
    CellStateRecord,
    ReapedRecord,
    RunCellTotals,
    RunRecord,
)
from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore
from accelmatrix.results.fence import StepTry, SupersededTry
from accelmatrix.results.row_records import (
    cell_record,
    cell_state_record,
    reaped_record,
    run_cell_totals,
    run_record,
)
from accelmatrix.results.schema import (
    CELL_FIELDS,
    RUN_FIELDS,
    cell_specs,
    cells,
    checks,
    metrics,
    runs,
    step_tries,
    utcnow,
)

# spec.followup.FOLLOWUP_KEY (the results store imports nothing of spec).
FOLLOWUP_PARAM = "accelmatrix_followup"
FOLLOWUP_RUN_ID_PREFIXES = tuple(f"accelmatrix_{k}__" for k in schema.FOLLOWUP_RUN_TYPES)
RunKinds = Literal["all", "suite", "followups"]


def is_followup(run: RunRecord) -> bool:
    """Whether a run is a follow-up run (a re-test), not a run of the suite."""
    if run.run_type in schema.FOLLOWUP_RUN_TYPES:
        return True
    if isinstance(run.params, Mapping) and run.params.get(FOLLOWUP_PARAM) is not None:
        return True
    return run.run_id.startswith(FOLLOWUP_RUN_ID_PREFIXES)


def suite_runs(table: Table = runs) -> Any:
    """SQL: the rows of ``table`` (``runs``) that are runs of the suite, not follow-ups
    (``is_followup``'s rule; params are canonical JSON text, so the block is the key
    followed by an object)."""
    c = table.c
    return and_(
        or_(c.run_type.is_(None), c.run_type.not_in(schema.FOLLOWUP_RUN_TYPES)),
        not_(cast(c.params, Text).contains(f'"{FOLLOWUP_PARAM}": {{', autoescape=True)),
        *(not_(c.run_id.startswith(p, autoescape=True)) for p in FOLLOWUP_RUN_ID_PREFIXES),
    )


class RunCellStore(StoreCore):
    """Rows of ``runs``, ``cells`` and ``reaped``."""

    # ------------------------------------------------------------------------------- upserts

    def _upsert(self, table: Table, key: dict[str, str], fields: dict[str, Any]) -> None:
        self._write(lambda conn: self._upsert_in(conn, table, key, fields))

    def _upsert_in(
        self, conn: Connection, table: Table, key: dict[str, str], fields: dict[str, Any]
    ) -> None:
        """Insert the row or update only ``fields``, inside the caller's transaction."""
        values = {**key, **fields}
        if "updated_at" in table.c:
            values["updated_at"] = utcnow()
        set_cols = [c for c in values if c not in key]
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
            conn.execute(stmt)
            return
        # Other dialects: update, else insert; a lost race raises IntegrityError, which
        # ``_write`` retries.
        where = and_(*(table.c[k] == v for k, v in key.items()))
        res = conn.execute(update(table).where(where).values({c: values[c] for c in set_cols}))
        if res.rowcount == 0:
            conn.execute(insert(table).values(values))

    def upsert_run(self, dag_id: str, run_id: str, **fields: Any) -> None:
        """Insert the run or update only the given fields; ``created_at`` is set once."""
        self._reject_unknown("run", fields, RUN_FIELDS)
        self._upsert(runs, self._key(dag_id, run_id), self._coerce(runs, fields))

    def upsert_cell(
        self, dag_id: str, run_id: str, cell_id: str, *, fence: StepTry | None = None, **fields: Any
    ) -> None:
        """Insert the cell or update only the given fields (unspecified columns keep their
        values), so each task can report just what it learned.

        With ``fence`` (the writing task's try), the write is refused with
        ``SupersededTry`` when a newer try of the same task has written this cell: a stale
        try must not move the row back (results/fence.py). Unfenced writers (plan, the
        gate, triggers, the janitor) write as before.
        """
        self._reject_unknown("cell", fields, CELL_FIELDS)
        key = self._key(dag_id, run_id, cell_id)
        values = self._coerce(cells, fields)
        if fence is None:
            self._upsert(cells, key, values)
            return

        def tx(conn: Connection) -> None:
            # PostgreSQL: one writer per cell at a time (SQLite's BEGIN IMMEDIATE already is).
            self._lock(conn, "step_tries", *key.values())
            fence_key = {**key, "task_id": fence.task_id}
            newest = conn.execute(
                select(step_tries.c.try_number).where(
                    *(step_tries.c[k] == v for k, v in fence_key.items())
                )
            ).scalar()
            if newest is not None and newest > fence.try_number:
                raise SupersededTry(cell_id, fence, newest)
            self._upsert_in(conn, step_tries, fence_key, {"try_number": fence.try_number})
            self._upsert_in(conn, cells, key, values)

        self._write(tx)

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
        """Append one janitor decision to ``reaped`` (see accelmatrix.cleanup.janitor)."""
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

    def get_reaped(self, *, backend: str | None = None) -> list[ReapedRecord]:
        """Janitor decisions, oldest first (optionally of one backend)."""
        t = schema.reaped
        query = select(t).order_by(t.c.id)
        if backend is not None:
            query = query.where(t.c.backend == backend)
        with self._reading() as conn:
            return [reaped_record(r) for r in conn.execute(query).all()]

    def reset_run(self, dag_id: str, run_id: str) -> int:
        """Delete the run's cells, their specs, metrics, checks and try fences (not its run
        row); returns rows deleted.

        Called by ``plan`` when a run is planned again (the whole run cleared, or a backfill
        re-processing a logical date that keeps its run_id): the re-run replaces its rows
        instead of leaving cells, metrics or verdicts of the previous attempt behind.
        """
        key = self._key(dag_id, run_id)

        def tx(conn: Connection) -> int:
            self._lock(conn, "reset", *key.values())
            n = 0
            for table in (metrics, checks, cells, cell_specs, step_tries):
                n += conn.execute(
                    delete(table).where(
                        table.c.dag_id == key["dag_id"], table.c.run_id == key["run_id"]
                    )
                ).rowcount
            return n

        return self._write(tx)

    def suite_dag_ids(self) -> list[str]:
        """Every DAG id with a run in the store."""
        with self._reading() as conn:
            return sorted(r[0] for r in conn.execute(select(runs.c.dag_id).distinct()))

    def latest_logical_date(self, dag_id: str) -> Any:
        """The newest logical date among the DAG's runs, follow-up runs aside (a re-test
        triggered tonight re-tests older builds); None if none has one."""
        with self._reading() as conn:
            value = conn.execute(
                select(func.max(runs.c.logical_date)).where(runs.c.dag_id == dag_id, suite_runs())
            ).scalar()
        return schema.UtcDateTime().process_result_value(value, self._get_engine().dialect)

    @staticmethod
    def _cell_sort_key(c: CellRecord) -> tuple[bool, int, str]:
        idx = c.cell_index
        return (idx is None, idx if idx is not None else 0, c.cell_id)

    def get_run(self, dag_id: str, run_id: str) -> RunRecord | None:
        """The run (params decoded, timestamps aware UTC), or None."""
        key = self._key(dag_id, run_id)
        with self._reading() as conn:
            row = conn.execute(
                select(runs).where(runs.c.dag_id == key["dag_id"], runs.c.run_id == key["run_id"])
            ).first()
        return run_record(row) if row is not None else None

    def get_runs(
        self, dag_id: str, limit: int | None = None, *, which: RunKinds = "all"
    ) -> list[RunRecord]:
        """The DAG's runs, newest build first: by logical date (a run without one, by its
        start), then start, then creation. The matrix page's run picker and its "latest
        run": after a backfill of last week's builds, the latest is still today's build,
        not the backfill run that happened to start last.

        ``which="suite"``: the suite's own runs only (scheduled, manual, backfill), no
        follow-up run (``is_followup``), which would otherwise sit newest: a re-test is
        triggered after the run it re-tests, and may carry tonight's logical date.
        ``which="followups"``: the follow-up runs only."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        if which not in ("all", "suite", "followups"):
            raise ValueError(f"which must be all, suite or followups, got {which!r}")
        when = func.coalesce(runs.c.logical_date, runs.c.started_at)
        where = [runs.c.dag_id == dag_id]
        if which == "suite":
            where.append(suite_runs())
        elif which == "followups":
            where.append(not_(suite_runs()))
        stmt = (
            select(runs)
            .where(*where)
            .order_by(
                when.is_(None),
                when.desc(),
                runs.c.started_at.is_(None),
                runs.c.started_at.desc(),
                runs.c.created_at.desc(),
                runs.c.run_id.desc(),
            )
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._reading() as conn:
            return [run_record(r) for r in conn.execute(stmt)]

    def latest_runs(self, dag_id: str, limit: int) -> list[RunRecord]:
        """The suite's latest ``limit`` runs, follow-up runs aside (``suite_runs``), newest
        first in the order of the builds tested: by logical date (a run without one by its
        start, else its creation), then build (``runtime_version``), then start, then run id.

        The history page's columns (ui/history.py): a backfill of last week's builds started
        today takes the place of its dates, and two runs of one date stand in build order.
        ``get_runs`` orders by time alone, for the run picker and the "latest run"."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        c = runs.c
        when = func.coalesce(c.logical_date, c.started_at, c.created_at)
        stmt = (
            select(runs)
            .where(c.dag_id == dag_id, suite_runs())
            .order_by(when.desc(), c.runtime_version.desc(), c.started_at.desc(), c.run_id.desc())
            .limit(limit)
        )
        with self._reading() as conn:
            return [run_record(r) for r in conn.execute(stmt)]

    def cell_states_of_runs(self, dag_id: str, run_ids: Collection[str]) -> list[CellStateRecord]:
        """Each cell's state, plan index and quarantine in each of the given runs of the DAG,
        in no particular order; a cell missing from a run has no record for it.

        The history page's grid of cells x runs (ui/history.py): one query over ``cells``
        reading four columns, not the whole row ``get_cells`` reads run by run (30,720 rows
        for 1,024 cells x 30 runs, against the page's 1 s goal: bench/bench_page.py)."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        if not run_ids:
            return []
        c = cells.c
        stmt = select(c.run_id, c.cell_id, c.cell_index, c.state, c.quarantined).where(
            c.dag_id == dag_id, c.run_id.in_(sorted(set(run_ids)))
        )
        with self._reading() as conn:
            return [cell_state_record(r) for r in conn.execute(stmt)]

    def cell_totals_of_runs(self, dag_id: str, run_ids: Collection[str]) -> list[RunCellTotals]:
        """Per given run of the DAG that has cells: how many, and their summed cost.

        The history page's re-tests section (a follow-up run's samples and what they cost),
        counted and summed by the database rather than reading every cell of each run."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        if not run_ids:
            return []
        c = cells.c
        stmt = (
            select(c.run_id, func.count(), func.sum(c.cost))
            .where(c.dag_id == dag_id, c.run_id.in_(sorted(set(run_ids))))
            .group_by(c.run_id)
        )
        with self._reading() as conn:
            return [run_cell_totals(r) for r in conn.execute(stmt)]

    def builds_of_runs(self, dag_id: str, run_ids: Collection[str]) -> dict[str, str]:
        """run_id -> build tested (``runtime_version``) of the given runs of the DAG; a run
        without one is left out.

        The trend charts' points name their build (ui/trend_model.py), and ``perf_points``
        does not carry it: one narrow read of two columns of ``runs``."""
        self._check_id("dag_id", dag_id, schema.ID_LEN)
        if not run_ids:
            return {}
        c = runs.c
        stmt = select(c.run_id, c.runtime_version).where(
            c.dag_id == dag_id,
            c.run_id.in_(sorted(set(run_ids))),
            c.runtime_version.is_not(None),
        )
        with self._reading() as conn:
            return {run_id: build for run_id, build in conn.execute(stmt)}

    def get_cells(self, dag_id: str, run_id: str) -> list[CellRecord]:
        """Every cell of the run, in plan order (cell_index, then cell_id)."""
        key = self._key(dag_id, run_id)
        with self._reading() as conn:
            rows = conn.execute(
                select(cells).where(
                    cells.c.dag_id == key["dag_id"], cells.c.run_id == key["run_id"]
                )
            ).all()
        return sorted((cell_record(r) for r in rows), key=self._cell_sort_key)

    def put_cell_specs(self, dag_id: str, run_id: str, specs: Mapping[str, JsonObject]) -> None:
        """Replace the run's planned cell specs (cell id -> spec) in one transaction."""
        key = self._key(dag_id, run_id)
        rows = [
            {**key, "cell_id": self._check_id("cell_id", cid, schema.CELL_ID_LEN), "spec": spec}
            for cid, spec in specs.items()
        ]

        def tx(conn: Connection) -> None:
            self._lock(conn, "cell_specs", *key.values())
            conn.execute(
                delete(cell_specs).where(
                    cell_specs.c.dag_id == key["dag_id"], cell_specs.c.run_id == key["run_id"]
                )
            )
            if rows:
                conn.execute(insert(cell_specs), rows)

        self._write(tx)

    def get_cell_specs(
        self, dag_id: str, run_id: str, cell_ids: list[str] | None = None
    ) -> dict[str, JsonObject]:
        """The run's planned cell specs by cell id (only ``cell_ids`` when given)."""
        key = self._key(dag_id, run_id)
        where = [cell_specs.c.dag_id == key["dag_id"], cell_specs.c.run_id == key["run_id"]]
        if cell_ids is not None:
            where.append(cell_specs.c.cell_id.in_(cell_ids))
        with self._reading() as conn:
            rows = conn.execute(select(cell_specs.c.cell_id, cell_specs.c.spec).where(*where))
            return {r.cell_id: r.spec for r in rows}

    def get_cell(self, dag_id: str, run_id: str, cell_id: str) -> CellRecord | None:
        key = self._key(dag_id, run_id, cell_id)
        with self._reading() as conn:
            row = conn.execute(
                select(cells).where(*(cells.c[k] == v for k, v in key.items()))
            ).first()
        return cell_record(row) if row is not None else None
