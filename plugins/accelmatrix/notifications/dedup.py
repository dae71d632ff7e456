"""Per-cell alerts with deduplication: one alert per (suite, cell), stored in ``alerts``;
and the delivery of change groups (``deliver_groups``): a perf regression is alerted once
per cause (history.series.grouping), not per cell, so the gate passes no ``regressions`` here.

The run-level webhook (transport.py) says "this run failed" once per run; on-call needs
something quieter: a cell failing every night is one alert whose recurrence count grows,
not a page per night. So, for each planned cell of a run, by the gate:

* not passed (or its perf series is a regression): open the alert, or count a recurrence
  on the open one; a run counted once, however often its gate is re-run;
* passed, with an open alert: resolve it;
* quarantined: never alerts (its failures are known and accepted).

A sink hears about an alert when it opens, when it escalates from a failure to a perf
regression (with the trend: the last values against their bounds) and when it resolves;
plain recurrences only update the count.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from accelmatrix.contracts.change_point_records import ChangeGroup
from accelmatrix.contracts.run_records import CellRecord
from accelmatrix.notifications import transport as notify

log = logging.getLogger(__name__)

__all__ = ["update_alerts"]


def update_alerts(
    store: Any,
    dag_id: str,
    run_id: str,
    planned: list[dict[str, Any]],
    cells: Mapping[str, CellRecord],
    *,
    regressions: dict[str, list[dict[str, Any]]] | None = None,
    run_url: str = "",
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Update the stored alerts of the run's cells; return the events to notify.

    ``regressions``: cell id -> trend of each of its series classified ``regression``
    (``[{"benchmark", "metric", "lower", "upper", "points": [...]}]``).
    """
    now = now or datetime.now(UTC)
    regressions = regressions or {}
    events = []
    for c in planned:
        cid = c["id"]
        if c.get("quarantined"):
            continue
        row = cells.get(cid)
        state = row.state if row is not None else "missing"
        trend = regressions.get(cid) or []
        bad = state != "passed" or bool(trend)
        kind = "regression" if trend else "failure"
        alert = store.get_alert(dag_id, cid)
        is_open = alert is not None and alert.status == "open"
        event = None
        if bad and not is_open:
            store.upsert_alert(
                dag_id,
                cid,
                status="open",
                kind=kind,
                recurrences=1,
                opened_at=now,
                last_seen_at=now,
                resolved_at=None,
                first_run_id=run_id,
                last_run_id=run_id,
                last_state=state,
                message=(row.message if row is not None else ""),
            )
            event = "opened"
        elif bad:
            assert alert is not None
            same_run = alert.last_run_id == run_id
            escalated = kind == "regression" and alert.kind != "regression"
            store.upsert_alert(
                dag_id,
                cid,
                kind="regression" if escalated else alert.kind,
                recurrences=alert.recurrences + (0 if same_run else 1),
                last_seen_at=now,
                last_run_id=run_id,
                last_state=state,
                message=(row.message if row is not None else "") or alert.message,
            )
            event = "recurred" if escalated else None
        elif is_open:
            store.upsert_alert(
                dag_id,
                cid,
                status="resolved",
                resolved_at=now,
                last_run_id=run_id,
                last_state=state,
            )
            event = "resolved"
        if event is None:
            continue
        stored = store.get_alert(dag_id, cid)
        events.append(
            {
                "event": event,
                "dag_id": dag_id,
                "cell_id": cid,
                "run_id": run_id,
                "run_url": run_url,
                "kind": stored.kind,
                "state": state,
                "recurrences": stored.recurrences,
                "opened_at": stored.opened_at.isoformat(),
                "message": stored.message,
                "trend": trend,
            }
        )
    return events


def deliver(sinks: list[Any], events: list[dict[str, Any]], store: Any = None) -> int:
    """Send every event to every sink; failures are logged (an alert never fails a run).

    ``store``: where a GitHub sink with a repo keeps the alert's issue number (so the
    resolution closes that issue); without it each event stands alone."""

    sent = 0
    for ev in events:
        for sink in sinks:
            try:
                notify.send_alert(sink, ev, store)
                sent += 1
            except Exception as e:  # noqa: BLE001 - the verdict stands whatever a sink does
                _not_sent(f"alert {ev['cell_id']} {ev['event']}", sink, e)
    return sent


def deliver_groups(sinks: list[Any], store: Any, groups: list[ChangeGroup]) -> int:
    """Notify each change group once, to every sink; ``notified_at`` records that it went
    out (to at least one sink), so a later pass never sends it again."""

    sent = 0
    for g in groups:
        row = store.get_change_group(g.id)
        if row is None or row.notified_at is not None:
            continue
        retests = store.get_confirmations(row.dag_id, group_id=row.id)
        ev = notify.group_event(
            row,
            store.get_change_points(row.dag_id, group_id=row.id),
            retests[0] if retests else None,
        )
        ok = False
        for sink in sinks:
            try:
                notify.send_change_group(sink, ev)
                ok = True
                sent += 1
            except Exception as e:  # noqa: BLE001 - the verdict stands whatever a sink does
                _not_sent(f"change group {row.id}", sink, e)
        if ok:
            store.save_change_group(row.dag_id, id=row.id, notified_at=datetime.now(UTC))
    return sent


_UNDEFINED_SAID: set[str] = set()


def _not_sent(what: str, sink: Any, e: Exception) -> None:
    """Log a delivery failure; a sink whose connection does not exist is said once per
    process, with what to configure, instead of an error per alert."""
    if "isn't defined" in str(e) or "not defined" in str(e):
        if sink.conn_id not in _UNDEFINED_SAID:
            _UNDEFINED_SAID.add(sink.conn_id)
            log.warning(
                "alerts go nowhere: the Airflow connection %r is not defined. To receive "
                "them, add it, e.g. `airflow connections add %s --conn-type http "
                "--conn-host hooks.slack.com --conn-schema https --conn-extra "
                '\'{"endpoint": "/services/..."}\'` (the suite\'s notify.alerts names it)',
                sink.conn_id,
                sink.conn_id,
            )
        return
    log.error("%s not sent to %s: %s", what, sink.conn_id, e)
