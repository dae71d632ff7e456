"""The api-server side of "re-run failed cells": origin check, Airflow's clear API, audit log.

The clear goes through Airflow's own REST endpoint (``POST /api/v2/dags/{dag}/
clearTaskInstances``) on the api-server the page runs in, with a short-lived token of the
user who clicked (the auth manager's ``generate_jwt``): Airflow checks that user's access
again, clears the cells' tasks the way the UI's "Clear" does (setup and teardown widening
included, see accelmatrix.cleanup.clearing) and writes its own audit-log entry with that user as
owner. This module adds one more audit-log entry, ``accelmatrix.rerun_failed_cells``, naming
the cells, which the run page shows ("re-run of 2 failed cells by admin at ...").

The form is posted by the browser with the user's session cookie, so a page elsewhere could
post it too: a POST whose ``Origin`` (or, without one, ``Referer``) is not this site is
refused, and a cookie-authenticated POST with neither is refused as well. A client that
sends its own ``Authorization: Bearer`` token is no browser session and needs neither.

Runs only in the api-server (Airflow's models and settings are there); every read here is
best effort, so the page renders without these facts.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

from accelmatrix.ui.oncall import RerunNote, Target

log = logging.getLogger(__name__)

AUDIT_EVENT = "accelmatrix.rerun_failed_cells"
CLEAR_TIMEOUT = 60.0


class Refused(Exception):
    """The request may not re-run anything; ``status`` and the reason for the user."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def own_origins(headers: Any, scheme: str, base_url: str | None) -> set[str]:
    """The origins this site answers as: the request's own Host (and a proxy's forwarded
    host), and ``[api] base_url``."""
    out = set()
    host = headers.get("host")
    if host:
        out.add(f"{scheme}://{host.lower()}")
    fwd_host = headers.get("x-forwarded-host")
    if fwd_host:
        proto = (headers.get("x-forwarded-proto") or scheme).split(",")[0].strip()
        out.add(f"{proto}://{fwd_host.split(',')[0].strip().lower()}")
    if base_url and (o := _origin(base_url)):
        out.add(o)
    return out


def check_same_origin(headers: Any, scheme: str, base_url: str | None) -> None:
    """Refuse a cross-site POST (see the module docstring)."""
    mine = own_origins(headers, scheme, base_url)
    origin = headers.get("origin")
    if origin and origin != "null":
        if _origin(origin) not in mine:
            raise Refused(403, f"cross-origin request refused (Origin {origin})")
        return
    referer = headers.get("referer")
    if referer:
        if _origin(referer) not in mine:
            raise Refused(403, "cross-origin request refused (Referer of another site)")
        return
    if origin == "null":
        raise Refused(403, "cross-origin request refused (opaque Origin)")
    auth = headers.get("authorization") or ""
    if not auth.lower().startswith("bearer "):
        raise Refused(403, "request without Origin or Referer refused (cookie session)")


def clear_cells(
    *,
    server: str,
    ui_base: str,
    dag_id: str,
    run_id: str,
    todo: list[Target],
    user: Any,
    note: str,
) -> int:
    """Clear each target (and what follows it) through Airflow's REST API as ``user``.
    Returns how many task instances Airflow cleared. Raises Refused with Airflow's answer."""
    body = {
        "dag_run_id": run_id,
        "task_ids": [[t.task_id, t.map_index] for t in todo],
        "include_downstream": True,
        "only_failed": False,
        "reset_dag_runs": True,
        "dry_run": False,
        "note": note[:1000],
    }
    url = f"{server}{ui_base}/api/v2/dags/{dag_id}/clearTaskInstances"
    answer = post_as(
        user,
        url,
        body,
        silent="Airflow's clear API did not answer",
        refused="Airflow refused the clear",
        timeout=CLEAR_TIMEOUT,
    )
    return len(answer.get("task_instances") or [])


def post_as(
    user: Any, url: str, body: dict[str, Any], *, silent: str, refused: str, timeout: float
) -> Any:
    """POST ``body`` to Airflow's REST API at ``url`` with a short-lived token of ``user``
    (the auth manager's ``generate_jwt``), so Airflow checks that user's access and records
    them; the JSON answer. Refused with Airflow's own answer after ``refused``, or 502 after
    ``silent`` when it did not answer."""
    import httpx
    from airflow.api_fastapi.app import get_auth_manager

    token = get_auth_manager().generate_jwt(user, expiration_time_in_seconds=120)
    try:
        r = httpx.post(
            url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )
    except httpx.HTTPError as e:
        raise Refused(502, f"{silent}: {e}") from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text[:300]
        raise Refused(r.status_code, f"{refused}: {detail}")
    return r.json()


def record(dag_id: str, run_id: str, who: str, todo: list[Target], cleared: int) -> None:
    """Who re-ran which cells: the api-server's log and Airflow's audit log."""
    cells = [t.cell_id for t in todo]
    log.info(
        "matrix page: %s re-ran %d failed cell(s) of %s/%s (%d task instances cleared): %s",
        who,
        len(cells),
        dag_id,
        run_id,
        cleared,
        ", ".join(f"{t.cell_id} from {t.task_id}[{t.map_index}]" for t in todo),
    )
    try:
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        extra = json.dumps(
            {"cells": cells, "tasks": [[t.task_id, t.map_index] for t in todo], "cleared": cleared}
        )
        with create_session() as session:
            session.add(
                Log(event=AUDIT_EVENT, owner=who, extra=extra, dag_id=dag_id, run_id=run_id)
            )
    except Exception:  # noqa: BLE001 - Airflow's own audit entry of the clear is there already
        log.warning("matrix page: could not write the re-run's audit-log entry", exc_info=True)


def reruns(dag_id: str, run_id: str) -> list[RerunNote]:
    """The run's re-runs from the page, newest first (empty when not readable)."""
    try:
        from airflow.models.log import Log
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(Log.owner, Log.dttm, Log.extra)
                .where(Log.dag_id == dag_id, Log.run_id == run_id, Log.event == AUDIT_EVENT)
                .order_by(Log.dttm.desc())
                .limit(10)
            ).all()
    except Exception:  # noqa: BLE001 - an extra; the page stands without it
        log.warning("matrix page: re-runs of %s/%s not readable", dag_id, run_id, exc_info=True)
        return []
    out = []
    for owner, when, extra in rows:
        try:
            cells = [str(c) for c in json.loads(extra or "{}").get("cells", [])]
        except (ValueError, AttributeError):
            cells = []
        out.append(RerunNote(owner or "unknown", when, cells))
    return out


def dag_owners(dag_id: str) -> list[str] | None:
    """The DAG's owners as Airflow has them (the suite's ``owners``); None if unknown."""
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            owners = session.scalar(select(DagModel.owners).where(DagModel.dag_id == dag_id))
    except Exception:  # noqa: BLE001 - an extra; the page stands without it
        log.warning("matrix page: owners of %s not readable", dag_id, exc_info=True)
        return None
    if not owners:
        return None
    return [o.strip() for o in owners.split(",") if o.strip()]
