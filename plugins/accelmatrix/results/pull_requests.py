"""Pull requests in the results store: deliveries already acted on, and the runs started
for a pull request's head commit (accelmatrix.ui.github_webhook writes, the gate reads).

Replays are refused here rather than in the api-server's memory: a redelivery may reach
another api-server worker, or arrive after a restart. Two kinds of row share
``github_deliveries``: a delivery id (what GitHub's ``X-GitHub-Delivery`` names), and an
action key (what a delivery does: ``ui.github_delivery.action_key``), stored under
``action:<sha256 of the key>`` with the event ``action``. One table, so one primary key
settles a race between api-server workers for both, and one retention prunes both
(``prune_deliveries``: the maintenance DAG, ``DELIVERY_RETENTION_DAYS``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from accelmatrix.results import schema
from accelmatrix.results.core import StoreCore
from accelmatrix.results.schema import github_deliveries, pull_request_runs, utcnow

__all__ = ["DELIVERY_RETENTION_DAYS", "PR_RUN_KINDS", "PullRequestRun", "PullRequestStore"]

# Deliveries and action keys older than this are pruned by the maintenance DAG. GitHub lets a
# maintainer redeliver a delivery of the last 3 days; 30 days keeps a replayed id refused
# (409) long after that. An older replay is judged by what it does: its action key is gone
# too, but the pull request as GitHub has it now (head sha, label, state) still decides,
# and a run id fixed by (pull request, sha) still starts nothing twice.
DELIVERY_RETENTION_DAYS = 30
ACTION_EVENT = "action"

# "verdict": the suite's cells on the head commit; "compare": the head's perf against the
# base commit, builds interleaved on one machine per cell.
PR_RUN_KINDS = ("verdict", "compare")


@dataclass(frozen=True)
class PullRequestRun:
    """One suite run started for a pull request's head commit."""

    dag_id: str
    run_id: str
    kind: str
    repo: str
    number: int
    head_sha: str
    base_ref: str
    base_sha: str
    sender: str
    fork: bool
    comment_id: int | None = None
    created_at: datetime | None = None


class PullRequestStore(StoreCore):
    """Rows of ``github_deliveries`` and ``pull_request_runs``."""

    def record_delivery(self, delivery_id: str, event: str) -> bool:
        """Remember a delivery; False when its id was seen before (a replay)."""
        self._check_id("delivery_id", delivery_id, schema.ID_LEN)
        values = {"delivery_id": delivery_id, "event": event[:200], "at": utcnow()}

        def tx(conn: Connection) -> bool:
            seen = conn.execute(
                select(github_deliveries.c.delivery_id).where(
                    github_deliveries.c.delivery_id == delivery_id
                )
            ).first()
            if seen is not None:
                return False
            conn.execute(insert(github_deliveries).values(values))
            return True

        try:
            return self._write(tx)
        except IntegrityError:  # another worker recorded it between our read and write
            return False

    def forget_delivery(self, delivery_id: str) -> None:
        """Forget a delivery that was not carried out, so GitHub's "Redeliver" may retry it."""
        c = github_deliveries.c

        def tx(conn: Connection) -> None:
            conn.execute(delete(github_deliveries).where(c.delivery_id == delivery_id))

        self._write(tx)

    def claim_action(self, key: str) -> bool:
        """Take the action ``key`` (``ui.github_delivery.action_key``); False when it was
        taken before: that action was done, whichever delivery asked for it."""
        return self.record_delivery(_action_id(key), ACTION_EVENT)

    def release_action(self, key: str) -> None:
        """Give the action ``key`` back: it was not done (GitHub failed), may be asked again."""
        self.forget_delivery(_action_id(key))

    def prune_deliveries(self, now: datetime, days: int = DELIVERY_RETENTION_DAYS) -> int:
        """Forget deliveries and action keys recorded more than ``days`` before ``now``; how
        many rows went."""
        if days < 1:
            raise ValueError(f"delivery retention of {days} days: at least 1")
        cutoff = now - timedelta(days=days)
        c = github_deliveries.c

        def tx(conn: Connection) -> int:
            return int(conn.execute(delete(github_deliveries).where(c.at < cutoff)).rowcount or 0)

        return self._write(tx)

    def add_pull_request_run(self, run: PullRequestRun) -> bool:
        """Record a run started for a pull request; False when that run is recorded already."""
        if run.kind not in PR_RUN_KINDS:
            raise ValueError(f"kind {run.kind!r}: allowed {', '.join(PR_RUN_KINDS)}")
        self._key(run.dag_id, run.run_id)
        values = self._coerce(
            pull_request_runs,
            {
                "dag_id": run.dag_id,
                "run_id": run.run_id,
                "kind": run.kind,
                "repo": run.repo,
                "number": run.number,
                "head_sha": run.head_sha,
                "base_ref": run.base_ref,
                "base_sha": run.base_sha,
                "sender": run.sender,
                "fork": run.fork,
                "comment_id": run.comment_id,
                "created_at": run.created_at or utcnow(),
            },
        )

        def tx(conn: Connection) -> bool:
            c = pull_request_runs.c
            self._lock(conn, "pull_request_runs", run.dag_id, run.repo, str(run.number))
            if conn.execute(
                select(c.id).where(c.dag_id == run.dag_id, c.run_id == run.run_id)
            ).first():
                return False
            conn.execute(insert(pull_request_runs).values(values))
            return True

        try:
            return self._write(tx)
        except IntegrityError:
            return False

    def pull_request_run(self, dag_id: str, run_id: str) -> PullRequestRun | None:
        """The pull request a run was started for, or None (not a pull request's run)."""
        c = pull_request_runs.c
        stmt = select(pull_request_runs).where(c.dag_id == dag_id, c.run_id == run_id)
        with self._reading() as conn:
            row = conn.execute(stmt).first()
        return _record(row) if row is not None else None

    def pull_request_runs(self, dag_id: str, repo: str, number: int) -> list[PullRequestRun]:
        """Every run of ``dag_id`` started for pull request ``repo#number``, oldest first."""
        c = pull_request_runs.c
        stmt = (
            select(pull_request_runs)
            .where(c.dag_id == dag_id, c.repo == repo, c.number == int(number))
            .order_by(c.id)
        )
        with self._reading() as conn:
            return [_record(r) for r in conn.execute(stmt)]

    def set_pull_request_comment(
        self, dag_id: str, repo: str, number: int, comment_id: int
    ) -> None:
        """The pull request's comment for ``dag_id``: edited in place from now on."""
        c = pull_request_runs.c

        def tx(conn: Connection) -> None:
            conn.execute(
                update(pull_request_runs)
                .where(c.dag_id == dag_id, c.repo == repo, c.number == int(number))
                .values(comment_id=int(comment_id))
            )

        self._write(tx)


def _action_id(key: str) -> str:
    return "action:" + hashlib.sha256(key.encode()).hexdigest()


def _record(row: object) -> PullRequestRun:
    m = row._mapping  # type: ignore[attr-defined]
    return PullRequestRun(
        dag_id=m["dag_id"],
        run_id=m["run_id"],
        kind=m["kind"],
        repo=m["repo"],
        number=int(m["number"]),
        head_sha=m["head_sha"],
        base_ref=m["base_ref"],
        base_sha=m["base_sha"],
        sender=m["sender"],
        fork=bool(m["fork"]),
        comment_id=int(m["comment_id"]) if m["comment_id"] is not None else None,
        created_at=m["created_at"],
    )
