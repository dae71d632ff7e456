"""What only Airflow knows about a run: task tries and who stopped it (api-server only).

The results store says what each cell did; Airflow's metadata database says how often a
task ran (a cleared cell's ``run`` task has try_number 2) and who acted on the run (its
audit log: the UI's "Mark run as failed" is a ``patch_dag_run`` event with the user as
owner). The page runs inside the api-server, which already holds that database session,
so it reads both with Airflow's own models instead of asking the REST API for them.

Best effort: any error (another Airflow version, a database hiccup) leaves the facts out
and the page still renders from the results store.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

log = logging.getLogger(__name__)

# Audit-log events of Airflow 3.3.2 that stop a run or a task from outside.
STOP_EVENTS = (
    "patch_dag_run",
    "patch_task_instance",
    "bulk_task_instances",
    "delete_dag_run",
    "post_clear_task_instances",
)

Tries = dict[tuple[str, int], tuple[int, datetime | None]]


@dataclass
class StopEvent:
    owner: str
    when: datetime | None
    event: str
    detail: str

    def line(self) -> str:
        when = f" at {self.when:%Y-%m-%d %H:%M} UTC" if self.when else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"stopped by {self.owner}{when}: {self.event}{detail}"


def run_facts(dag_id: str, run_id: str) -> tuple[Tries, StopEvent | None]:
    """(task tries, the latest stop event) of one DAG run; empty when not readable."""
    try:
        from airflow.models.log import Log
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            tries: Tries = {
                (t, m): (int(n or 0), start)
                for t, m, n, start in session.execute(
                    select(TI.task_id, TI.map_index, TI.try_number, TI.start_date).where(
                        TI.dag_id == dag_id, TI.run_id == run_id
                    )
                )
            }
            events = session.execute(
                select(Log.owner, Log.dttm, Log.event, Log.extra)
                .where(Log.dag_id == dag_id, Log.run_id == run_id, Log.event.in_(STOP_EVENTS))
                .order_by(Log.dttm.desc())
                .limit(50)
            ).all()
    except Exception:  # noqa: BLE001 - facts are extras; the page stands without them
        log.warning(
            "matrix page: Airflow facts of %s/%s not readable", dag_id, run_id, exc_info=True
        )
        return {}, None
    for owner, when, event, extra in events:
        detail = _detail(extra)
        # A PATCH that only edits a note is no stop: it must set a state.
        if event.startswith(("patch_", "bulk_")) and "state=" not in detail:
            continue
        return tries, StopEvent(owner or "unknown", when, event, detail)
    return tries, None


def _detail(extra: str | None) -> str:
    """``state=failed`` from the event's JSON extra (other fields left out)."""
    try:
        data = json.loads(extra or "{}")
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    return ", ".join(f"{k}={data[k]}" for k in ("state", "new_state") if k in data)
