"""Refuse a suite run at trigger time that its ``plan`` would refuse: a root ASGI middleware.

Airflow validates a triggered run's conf against each Param's JSON schema, and nothing
more: a `cells` glob that selects no cell (``model=tiny-mpl,*``) passed, and the run planned
0 cells and ended green. JSON schema cannot say "this glob matches one of these ids", so the
plugin registers this middleware (``fastapi_root_middlewares``) in front of Airflow's
``POST /api/v2/dags/{dag_id}/dagRuns`` (what the trigger form posts too). For a DAG that is
an accelmatrix suite it checks the conf with ``accelmatrix.spec.params.check_run_conf``,
the same check ``python -m accelmatrix plan --params/--cells`` and ``demo --conf`` make,
and answers 400 ``{"detail": "<the same message>"}``: the param values (an unknown name, a
value outside its enum/minimum/maximum/pattern), a glob that selects nothing, a run with
no cell to run, each with the valid values or cell ids.

Backfills too: ``POST /api/v2/backfills`` and ``.../backfills/dry_run`` (the backfill form)
carry the suite in the body (``dag_id``) and the conf every run of the backfill gets in
``dag_run_conf``; a backfill would otherwise start one refused plan per date. The same check,
the same message.

It answers only a caller Airflow would let trigger that DAG (the same JWT and auth
manager, ``POST`` on its runs): everyone else reaches Airflow's own 401/403 untouched, so
the valid cell ids are never shown to someone who may not trigger the suite. Anything it
cannot judge (not a suite, an invalid suite, a body that is not JSON) goes to Airflow as it
came. Imported by every component through the plugin: the standard library only here.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
_BACKFILL = re.compile(r"/api/v2/backfills(?:/dry_run)?/?$")
MAX_BODY = 1 << 20  # a trigger body is a few KB; a larger one is Airflow's to judge
# Where the run conf sits in each body Airflow takes.
TRIGGER_CONF, BACKFILL_CONF = "conf", "dag_run_conf"


def backfill_dag_id(body: bytes) -> str | None:
    """The DAG a backfill request names in its body (None: not one Airflow would take)."""
    try:
        dag_id = (json.loads(body) or {}).get("dag_id")
    except (ValueError, AttributeError):
        return None
    return dag_id if isinstance(dag_id, str) and dag_id else None


def refusal(dag_id: str, body: bytes, conf_key: str = TRIGGER_CONF) -> str | None:
    """Why a run of ``dag_id`` triggered with this request body must not start, or None.
    ``conf_key``: where the body holds the run conf (``dag_run_conf`` for a backfill)."""
    try:
        conf = (json.loads(body) or {}).get(conf_key) or {}
    except (ValueError, AttributeError):
        return None
    if not isinstance(conf, dict):
        return None
    return conf_refusal(dag_id, conf)


def conf_refusal(dag_id: str, conf: dict[str, Any]) -> str | None:
    """Why a run of ``dag_id`` with ``conf`` must not start, or None (also None when
    ``dag_id`` is no valid suite: that DAG says what is wrong when it runs)."""
    # Here, not at the top: every Airflow process loads the plugin that installs this
    # guard, and the suite models load only when a trigger is checked
    # (tests/test_matrix_page.py::test_plugin_module_is_cheap_to_import).
    from accelmatrix import settings
    from accelmatrix.spec.suite_error import SuiteError
    from accelmatrix.spec.suite_files import suite_files, suite_id

    path = next((p for p in suite_files(settings.suites_dir()) if suite_id(p) == dag_id), None)
    if path is None:
        return None
    # The suite models, for the same reason: only a trigger of a suite loads them.
    from accelmatrix.spec.loader import load_suite
    from accelmatrix.spec.params import ParamsError, check_run_conf
    from accelmatrix.spec.plan import PlanError

    try:
        suite = load_suite(path)
    except (SuiteError, OSError):
        return None  # the invalid-suite DAG says what is wrong when it runs
    try:
        check_run_conf(suite, dag_id, conf, f"{dag_id}: conf")
    except ParamsError as e:
        return str(e)
    except PlanError as e:
        return f"{dag_id}: conf: the run would be refused by its plan\n{e}"
    return None


async def _may_trigger(scope: dict[str, Any], dag_id: str) -> bool:
    """Whether Airflow itself would let this request trigger ``dag_id``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.api_fastapi.core_api.security import resolve_user_from_token
    from starlette.requests import Request

    request = Request(scope)
    # As Airflow's get_user: a bearer token wins over the UI's session cookie.
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        token = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    try:
        user = await resolve_user_from_token(token)
        return bool(
            get_auth_manager().is_authorized_dag(
                method="POST",
                access_entity=DagAccessEntity.RUN,
                details=DagDetails(id=dag_id),
                user=user,
            )
        )
    except Exception:  # noqa: BLE001 - 401/403 and anything else: Airflow answers
        return False


class TriggerGuard:
    """Pure ASGI middleware (``fastapi_root_middlewares``) over Airflow's whole app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        match = backfill = None
        if scope["type"] == "http" and scope.get("method") == "POST":
            match = _TRIGGER.search(scope.get("path", ""))
            backfill = None if match else _BACKFILL.search(scope.get("path", ""))
        if match is None and backfill is None:
            await self.app(scope, receive, send)
            return
        chunks, size, first = [], 0, None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                first = message  # a disconnect: hand it on
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if not message.get("more_body") or size > MAX_BODY:
                break
        body = b"".join(chunks)
        more = first is None and size > MAX_BODY
        problem = None
        if first is None and not more:
            if match is not None:
                problem = await _judge(scope, match["dag_id"], body)
            elif (dag_id := backfill_dag_id(body)) is not None:
                problem = await _judge(scope, dag_id, body, BACKFILL_CONF, quoted=False)
        if problem is not None:
            await _send_400(send, problem)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                if first is not None and not body:
                    return first
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        await self.app(scope, replay, send)


async def _judge(
    scope: dict[str, Any],
    dag_id: str,
    body: bytes,
    conf_key: str = TRIGGER_CONF,
    *,
    quoted: bool = True,
) -> str | None:
    """``quoted``: ``dag_id`` comes from the URL path (percent-encoded), not a JSON body."""
    from urllib.parse import unquote

    from anyio import to_thread

    dag_id = unquote(dag_id) if quoted else dag_id
    try:
        problem = await to_thread.run_sync(refusal, dag_id, body, conf_key)
    except Exception:  # noqa: BLE001 - never break triggering: Airflow still validates
        log.exception("accelmatrix could not check the conf of a %s trigger", dag_id)
        return None
    if problem is None or not await _may_trigger(scope, dag_id):
        return None
    log.info("refused a run of %s: %s", dag_id, problem.splitlines()[0])
    return problem


async def _send_400(send: Any, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
