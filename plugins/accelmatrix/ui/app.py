"""The matrix page's FastAPI app, mounted by Airflow's api-server under ``/accelmatrix``.

Airflow 3.3.2 does not protect plugin apps: the api-server mounts them as they are. So every
route here depends on Airflow's own ``get_user`` (the JWT from ``Authorization: Bearer`` or
the ``_token`` cookie the Airflow UI sets, validated by the configured auth manager, revoked
tokens included), and asks the same auth manager whether that user may read the suite's DAG
runs. Anonymous requests get 401, a bad or expired token 401/403, another team's DAG 403.

Built on the first request (see ``asgi.py``), inside the api-server, where Airflow's auth
manager is initialised: importing this module pulls in FastAPI and Airflow's API package.
"""

import logging
import threading
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from accelmatrix.history.change_points.triage import apply_triage
from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import (
    cell_page,
    compare_trigger,
    files,
    github_webhook,
    history,
    model,
    oncall,
    render,
    rerun,
    tabs,
)
from accelmatrix.ui.airflow_facts import run_facts

log = logging.getLogger(__name__)

URL_PREFIX = "/accelmatrix"
# The pages need no script at all: forbid them, so an escaping bug cannot become XSS.
PAGE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'"
)
# Data Docs are files written during a run (a workload could have planted HTML there): a
# sandbox gives them an opaque origin, so their scripts cannot use the user's Airflow
# session.
FILE_CSP = "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox"

# A workload's files shown as text in the browser (the rest is downloaded).
TEXT_SUFFIXES = frozenset(
    {".log", ".txt", ".json", ".jsonl", ".csv", ".tsv", ".xml", ".yaml", ".yml", ".md", ".out"}
)

_store_lock = threading.Lock()
_store: ResultsStore | None = None


def results_store() -> ResultsStore:
    """One store (one connection pool) per api-server process."""
    global _store
    with _store_lock:
        if _store is None:
            _store = ResultsStore.from_settings()
        return _store


# The page's own view in Airflow's UI (the plugin's react_apps entry, url_route below):
# the view fetches pages with this header, and their links then lead back into the view.
VIEW_ROUTE = "/plugin/accelmatrix"
EMBED_HEADER = "x-accelmatrix-embed"
STATIC = Path(__file__).with_name("static")


def _bases(request: Request) -> tuple[str, str]:
    """(Airflow UI base, this app's base) from where the api-server mounted the app."""
    app_base = request.scope.get("root_path", "").rstrip("/")
    ui_base = app_base[: -len(URL_PREFIX)] if app_base.endswith(URL_PREFIX) else ""
    return ui_base, app_base


def _page_base(request: Request) -> str:
    """Where links to other matrix pages point: into Airflow's UI when the page is shown by
    the navigation entry's view, else to this app (the page opened on its own)."""
    ui_base, app_base = _bases(request)
    return ui_base + VIEW_ROUTE if request.headers.get(EMBED_HEADER) == "1" else app_base


def same_origin(request: Request, base_url: str | None = None) -> bool:
    """Whether a state-changing request comes from a page of this server (CSRF defence).

    The page authenticates with Airflow's ``_token`` cookie, which a browser also sends
    with a form another site POSTs here (SameSite=Lax stops that only across sites, not
    from another port or subdomain of the same one). Browsers send ``Origin`` with every
    POST (``Referer`` where an old one does not): it must name this server, as the
    request's ``Host`` (or a proxy's ``X-Forwarded-Host``) or Airflow's ``[api] base_url``
    names it. A request with no Origin and no Referer, or ``Origin: null``, is refused. A
    request carrying its own ``Authorization: Bearer`` token is no CSRF risk (a browser
    never adds one by itself) and passes: scripts may triage with a token."""
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return True
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source.strip().lower() == "null":
        return False
    src = urlsplit(source.strip())
    if src.scheme not in ("http", "https") or not src.netloc:
        return False
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}
    if base_url:
        hosts.add(urlsplit(base_url).netloc)
    return src.netloc.lower() in {h.strip().lower() for h in hosts if h}


def create_app() -> FastAPI:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.api_fastapi.core_api.security import get_user

    # No `from __future__ import annotations` in this module: FastAPI reads these
    # annotations at route definition, and a local alias must be a real object.
    User = Annotated[Any, Depends(get_user)]

    app = FastAPI(title="accelmatrix matrix page", docs_url=None, redoc_url=None, openapi_url=None)

    def allowed(user: Any, dag_id: str, entity: Any) -> bool:
        return get_auth_manager().is_authorized_dag(
            method="GET", access_entity=entity, details=DagDetails(id=dag_id), user=user
        )

    def require(user: Any, dag_id: str, entity: Any = DagAccessEntity.RUN) -> None:
        if not allowed(user, dag_id, entity):
            raise HTTPException(status_code=403, detail="Forbidden")

    def may_triage(user: Any, dag_id: str) -> bool:
        """Setting a change's triage state edits what the suite's runs mean: the same
        right as editing one of its DAG runs (Airflow's PATCH of a run's state or note asks
        for PUT on DagAccessEntity.RUN). SimpleAuthManager: roles user, op and admin;
        viewer not."""
        return get_auth_manager().is_authorized_dag(
            method="PUT",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=dag_id),
            user=user,
        )

    def html(body: str, status_code: int = 200) -> HTMLResponse:
        return HTMLResponse(
            body,
            status_code=status_code,
            headers={
                "Content-Security-Policy": PAGE_CSP,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-store",
                "Referrer-Policy": "same-origin",
                "Vary": "X-Accelmatrix-Embed",
            },
        )

    @app.post("/github/webhook")
    async def github_webhook_delivery(request: Request) -> Response:
        """GitHub's deliveries: signed with the webhook secret, not an Airflow login
        (accelmatrix.ui.github_webhook)."""
        return await github_webhook.receive(request, results_store)

    @app.get("/static/matrix-view.js")
    def view_script() -> FileResponse:
        """The navigation entry's React view (see static/matrix-view.js). The one route
        without authentication: Airflow's UI imports it as a module, and it holds no data,
        only code that fetches the (authenticated) pages with the user's own cookie."""
        return FileResponse(
            STATIC / "matrix-view.js",
            media_type="text/javascript",
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _errors(request: Request, exc: StarletteHTTPException) -> Response:
        # Browsers get a page with a way forward; API clients the usual JSON.
        if "text/html" not in request.headers.get("accept", ""):
            return await http_exception_handler(request, exc)
        ui_base, app_base = _bases(request)
        link = None
        if exc.status_code == 401:
            back = request.url
            if request.headers.get(EMBED_HEADER) == "1":  # back to the view, not the bare page
                inner = request.url.path[len(app_base) :] if app_base else request.url.path
                back = request.url.replace(path=f"{ui_base}{VIEW_ROUTE}{inner}")
            link = (f"{ui_base}/auth/login?next={quote(str(back), safe='')}", "log in")
        title = {401: "Not logged in", 403: "Forbidden", 404: "Not found"}.get(
            exc.status_code, "Error"
        )
        resp = html(render.message_page(title, str(exc.detail), link), exc.status_code)
        for k, v in (exc.headers or {}).items():
            resp.headers[k] = v
        return resp

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, user: User) -> HTMLResponse:
        suites = [
            s
            for s in model.list_suites(results_store())
            if allowed(user, s.dag_id, DagAccessEntity.RUN)
        ]
        return html(render.suites_page(suites, _page_base(request)))

    @app.get("/suites/{dag_id}", response_class=HTMLResponse)
    def suite(
        request: Request,
        dag_id: str,
        user: User,
        run_id: str | None = None,
    ) -> HTMLResponse:
        require(user, dag_id)
        ui_base, app_base = _bases(request)

        store = results_store()
        shown = run_id or next((r.run_id for r in model.suite_runs(store, dag_id, 1)), None)
        tries, stop = run_facts(dag_id, shown) if shown else ({}, None)
        try:
            view = model.load_run_view(
                store,
                dag_id,
                run_id or None,
                # The workload's last log line is task-log content: only for those who may
                # read the task logs anyway.
                log_tails=allowed(user, dag_id, DagAccessEntity.TASK_LOGS),
                tries=tries,
                stopped_by=stop.line() if stop else None,
            )
        except ValueError as e:  # an over-long or empty id
            raise HTTPException(status_code=404, detail=str(e)) from None
        if view is None:
            what = f"run {run_id!r} of {dag_id!r}" if run_id else f"any run of {dag_id!r}"
            raise HTTPException(status_code=404, detail=f"no results recorded for {what}")
        panel, shown = oncall_panel(request, user, view, store)
        return html(
            render.run_page(
                view,
                ui_base=ui_base,
                app_base=app_base,
                page_base=_page_base(request),
                panel=panel,
                cells=shown,
            )
        )

    def oncall_panel(
        request: Request, user: Any, view: model.RunView, store: ResultsStore
    ) -> tuple[str, list[model.CellView]]:
        """Filters, the re-run form, cost and owners (ui/oncall.py, ui/rerun.py)."""

        run_id = view.run.run_id
        reruns = rerun.reruns(view.dag_id, run_id)
        oncall.mark_rerunning(view.cells, reruns)  # cleared cells show in progress
        filters = oncall.parse_filters(request.query_params.multi_items())
        shown = oncall.apply(view.cells, filters)
        panel = oncall.render_panel(
            cells=view.cells,
            shown=shown,
            axes=view.axes,
            filters=filters,
            dag_id=view.dag_id,
            run_id=run_id,
            page_base=_page_base(request),
            app_base=_bases(request)[1],
            embedded=request.headers.get(EMBED_HEADER) == "1",
            can_rerun=may_edit(user, view.dag_id),
            cost=oncall.run_cost(store.get_cells(view.dag_id, run_id)),
            owners=rerun.dag_owners(view.dag_id),
            reruns=reruns,
        )
        return panel, shown

    def may_edit(user: Any, dag_id: str) -> bool:
        # What Airflow's clearTaskInstances endpoint itself requires.
        return get_auth_manager().is_authorized_dag(
            method="PUT",
            access_entity=DagAccessEntity.TASK_INSTANCE,
            details=DagDetails(id=dag_id),
            user=user,
        )

    def edit_form_from_this_site(request: Request, user: Any, dag_id: str, what: str) -> None:
        """A form that changes something: edit access to the DAG, posted from this site
        (ui/rerun.check_same_origin); an HTTPException otherwise."""
        from airflow.configuration import conf

        require(user, dag_id)
        if not may_edit(user, dag_id):
            raise HTTPException(status_code=403, detail=f"{what} needs edit access")
        try:
            rerun.check_same_origin(
                request.headers, request.url.scheme, conf.get("api", "base_url", fallback="")
            )
        except rerun.Refused as e:
            raise HTTPException(status_code=e.status, detail=e.reason) from None

    @app.post("/suites/{dag_id}/rerun")
    async def rerun_failed(request: Request, dag_id: str, user: User) -> Response:
        """Re-run the failed cells the form names (ui/rerun.py): edit access to the DAG,
        same-origin only, through Airflow's clear API; then back to the run's page."""
        from starlette.concurrency import run_in_threadpool

        edit_form_from_this_site(request, user, dag_id, "re-running cells")
        form = await request.form()
        run_id = str(form.get("run_id") or "")
        wanted = {str(c) for c in form.getlist("cell")}
        if not run_id or not wanted:
            raise HTTPException(status_code=400, detail="no run or no cell to re-run")
        view = await run_in_threadpool(model.load_run_view, results_store(), dag_id, run_id)
        if view is None:
            raise HTTPException(status_code=404, detail=f"no results recorded for {run_id!r}")
        todo, _ = oncall.targets(c for c in view.cells if c.cell_id in wanted)
        if not todo:
            raise HTTPException(status_code=409, detail="none of these cells failed")
        ui_base, app_base = _bases(request)
        host, port = request.scope.get("server") or ("127.0.0.1", 8080)
        who = user.get_name()
        try:
            cleared = await run_in_threadpool(
                lambda: rerun.clear_cells(
                    server=f"{request.url.scheme}://{host}:{port}",
                    ui_base=ui_base,
                    dag_id=dag_id,
                    run_id=run_id,
                    todo=todo,
                    user=user,
                    note=f"re-run of failed cells from the test matrix by {who}",
                )
            )
        except rerun.Refused as e:
            raise HTTPException(status_code=e.status, detail=e.reason) from None
        await run_in_threadpool(rerun.record, dag_id, run_id, who, todo, cleared)
        back = (ui_base + VIEW_ROUTE) if form.get("view") == "1" else app_base
        query = [("run_id", run_id)] + [
            (k, str(v)) for k, v in form.multi_items() if k in ("failed", "axis")
        ]
        from urllib.parse import urlencode

        return RedirectResponse(
            f"{back}/suites/{quote(dag_id, safe='')}?{urlencode(query)}", status_code=303
        )

    @app.get("/suites/{dag_id}/history", response_class=HTMLResponse)
    def suite_history(
        request: Request, dag_id: str, user: User, runs: int = history.DEFAULT_RUNS
    ) -> HTMLResponse:
        require(user, dag_id)
        n = max(1, min(runs, history.MAX_RUNS))
        try:
            view = history.load_history(results_store(), dag_id, n)
        except ValueError as e:  # an over-long or empty id
            raise HTTPException(status_code=404, detail=str(e)) from None
        if view is None:
            raise HTTPException(status_code=404, detail=f"no results recorded for {dag_id!r}")
        _, app_base = _bases(request)
        return html(
            render.history_page(
                view,
                page_base=_page_base(request),
                n_runs=n,
                form_base=app_base,
                can_edit=may_triage(user, dag_id),
            )
        )

    @app.post("/suites/{dag_id}/compare")
    async def compare_builds(request: Request, dag_id: str, user: User) -> Response:
        """Start a comparison of two builds (the history page's form): edit access to the
        DAG, same-origin only, a run triggered through Airflow's REST API as the user, with
        the conf block ``accelmatrix_compare`` (the trigger guard checks it); then the new
        run's page."""
        from starlette.concurrency import run_in_threadpool

        edit_form_from_this_site(request, user, dag_id, "comparing builds")
        try:
            form = await request.form()
            block = compare_trigger.request_of(
                {k: str(v) for k, v in form.items() if k in ("base", "head", "cells", "pairs")}
            )
            ui_base, app_base = _bases(request)
            host, port = request.scope.get("server") or ("127.0.0.1", 8080)
            run_id = await run_in_threadpool(
                lambda: compare_trigger.trigger(
                    server=f"{request.url.scheme}://{host}:{port}",
                    ui_base=ui_base,
                    dag_id=dag_id,
                    block=block,
                    user=user,
                )
            )
        except rerun.Refused as e:
            raise HTTPException(status_code=e.status, detail=e.reason) from None
        return RedirectResponse(
            f"{app_base}/suites/{quote(dag_id, safe='')}?run_id={quote(run_id, safe=':')}",
            status_code=303,
        )

    @app.post("/suites/{dag_id}/changes/{what}/{change_id}/triage")
    def triage(
        request: Request,
        dag_id: str,
        what: str,
        change_id: int,
        user: User,
        state: Annotated[str, Form(max_length=64)],
        note: Annotated[str, Form()] = "",
        runs: Annotated[int, Form()] = history.DEFAULT_RUNS,
        embed: Annotated[str, Form(max_length=1)] = "",
    ) -> RedirectResponse:
        """Set a change group's (``what=group``) or change point's (``change``) triage
        state from the history page's form; who is the logged-in user. Then back to the
        history page at that entry (303: the browser GETs it)."""
        try:
            from airflow.configuration import conf

            base_url = conf.get("api", "base_url", fallback=None)
        except Exception:  # noqa: BLE001 - no configured base URL: the Host header decides
            base_url = None
        if not same_origin(request, base_url):
            raise HTTPException(
                status_code=403, detail="refused: a form posted from another site (origin)"
            )
        require(user, dag_id)
        if not may_triage(user, dag_id):
            raise HTTPException(
                status_code=403, detail=f"setting a state needs edit access to {dag_id!r}"
            )
        if what not in ("group", "change"):
            raise HTTPException(status_code=404, detail=f"no change kind {what!r}")
        if len(note) > history.NOTE_MAX:
            raise HTTPException(
                status_code=400, detail=f"note longer than {history.NOTE_MAX} characters"
            )
        try:
            apply_triage(
                results_store(),
                what,
                change_id,
                state,
                by=user.get_name(),
                note=note.strip() or None,
                dag_id=dag_id,
            )
        except KeyError as e:
            raise HTTPException(status_code=404, detail=str(e).strip("'\"")) from None
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        ui_base, app_base = _bases(request)
        base = ui_base + VIEW_ROUTE if embed == "1" else app_base
        n = max(1, min(runs, history.MAX_RUNS))
        anchor = f"group-{change_id}" if what == "group" else f"change-{change_id}"
        return RedirectResponse(
            f"{base}/suites/{quote(dag_id, safe='')}/history?runs={n}#{anchor}", status_code=303
        )

    @app.get("/tabs/{url_route}")
    def tab(
        request: Request,
        url_route: str,
        user: User,
        dag_id: str,
        run_id: str = "",
        task_id: str = "",
        map_index: int = -1,
    ) -> RedirectResponse:
        """A tab of Airflow's DAG, DAG run or task instance page (ui/tabs.py): the page it
        shows for these ids. A task that is not one cell's (plan, gate: no map index) shows
        its run's matrix. The page itself checks access again."""

        require(user, dag_id)
        shown = tabs.by_route(url_route)
        if shown is None:
            raise HTTPException(status_code=404, detail=f"no tab {url_route!r}")
        if shown.destination == "task_instance" and map_index < 0:
            shown = next(t for t in tabs.TABS if t.destination == "dag_run")
        path = tabs.page_path(
            shown, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
        )
        return RedirectResponse(_bases(request)[1] + path, status_code=307)

    @app.get("/suites/{dag_id}/cell", response_class=HTMLResponse)
    def cell(
        request: Request, dag_id: str, user: User, run_id: str, task_id: str, map_index: int
    ) -> HTMLResponse:
        """One cell's evidence (ui/cell_page.py), named by one of its task instances."""

        require(user, dag_id)
        tries, _ = run_facts(dag_id, run_id)
        try:
            ev = cell_page.load_cell(
                results_store(),
                dag_id,
                run_id,
                task_id,
                map_index,
                log_tails=allowed(user, dag_id, DagAccessEntity.TASK_LOGS),
                tries=tries,
                reruns=rerun.reruns(dag_id, run_id),
            )
        except ValueError as e:  # an over-long or empty id
            raise HTTPException(status_code=404, detail=str(e)) from None
        if ev is None:
            raise HTTPException(
                status_code=404,
                detail=f"no cell of run {run_id!r} of {dag_id!r} is task {task_id}[{map_index}]",
            )
        ui_base, app_base = _bases(request)
        return html(
            cell_page.render_cell_page(
                ev, ui_base=ui_base, app_base=app_base, page_base=_page_base(request)
            )
        )

    @app.get("/suites/{dag_id}/files/{path:path}")
    def evidence(dag_id: str, path: str, user: User) -> FileResponse:
        """A run's evidence (ui/files.py): the run report, a cell's Data Docs, logs,
        metrics and collected artifacts. Task-log content: read access to the task logs."""
        require(user, dag_id, DagAccessEntity.TASK_LOGS)
        found = files.evidence_file(dag_id, path)
        if found is None:
            raise HTTPException(status_code=404, detail="no such evidence file")
        target, kind = found
        headers = {
            "Content-Security-Policy": FILE_CSP,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
        }
        if kind in (files.DOCS, files.RUN_REPORT):
            return FileResponse(target, headers=headers)
        # What a workload wrote is shown as text or downloaded, never rendered as a page.
        if target.suffix.lower() in TEXT_SUFFIXES or files.CELL_FILES.fullmatch(target.name):
            return FileResponse(target, media_type="text/plain; charset=utf-8", headers=headers)
        return FileResponse(
            target, media_type="application/octet-stream", filename=target.name, headers=headers
        )

    return app
