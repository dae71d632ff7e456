"""``POST /accelmatrix/github/webhook``: a label on a pull request runs a suite on its head.

GitHub cannot hold an Airflow token, so this one route of the plugin app is not behind
Airflow's login: a delivery proves itself by its HMAC signature under the secret kept in
the Airflow connection ``accelmatrix_github_webhook`` (its password). What a delivery
asks for is judged by ``ui.github_delivery.decide`` (pure); this module carries it out,
inside the api-server, which holds Airflow's metadata database.

The answer (``receive``, then ``handle``) reads no more than it must and calls no GitHub:

* an oversized body is answered 413 after its bytes are read and dropped (up to
  ``DRAIN_LIMIT``; beyond, the connection is closed), so the sender sees the 413, not a
  reset;
* the secret is read only for a delivery that passed the cheap checks (size, a signature
  header, a delivery id), and kept ``SECRET_TTL_S``; a secrets backend or metadata
  database that fails to answer is a 503 (GitHub's "Redeliver" retries), never a 403;
* a replayed delivery id is refused (409), remembered in the results store so a
  redelivery to another api-server worker, or after a restart, is refused too;
* an accepted delivery is answered 202 and queued (``WORK``): what needs GitHub is done
  after the answer, so a slow GitHub never holds an api-server worker nor GitHub's 10 s.

The work (``carry_out``), once per suite the delivery asks for:

* the action key (event, action, pull request, head sha, label) is taken in the store:
  the same action asked twice is done once, and a replay of it costs no GitHub call;
* the pull request as GitHub has it now (``GET /pulls/<n>``): GitHub signs the body, not
  the delivery id, so a captured body sent again under a new id must still describe the
  pull request: a push or a label at another head sha, a label since removed, a
  ``closed`` after a reopen do nothing (``github_delivery.stale``) and give the key back;
* a fork's head runs only when the label was just added by someone with write access
  (GitHub's permission API); otherwise the pull request gets the bot's comment saying a
  maintainer must add the label;
* the run is created with Airflow's own ``trigger_dag`` under ``pr-<number>-<sha>``: a
  second delivery for the same commit finds the run. Its conf is
  ``{<ref_param>: <head sha>}``, checked like any trigger's (``spec.params.check_run_conf``);
* the pull request's runs recorded before the head's are marked failed if still going,
  as the UI's "Mark run as failed" does (their teardowns still run); a run recorded after
  (a newer head) is never touched;
* the head commit gets a "pending" status linking the run's matrix page. The gate sets
  the final status and writes the comment (``notifications.pull_request``).

A GitHub error on the way (the pull request, the permission) gives the delivery and its
action keys back, so GitHub's "Redeliver" does it again; a failed pending status never
stops the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.hooks.github import WRITE_PERMISSIONS, GithubError, PullRequestHook
from accelmatrix.notifications.pull_request import (
    matrix_url,
    refusal_comment,
    refusal_marker,
    set_status_quietly,
)
from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore, ResultsStoreError
from accelmatrix.spec.followup_plan import COMPARE_KEY
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.spec.suite_files import suite_files, suite_id
from accelmatrix.ui.github_delivery import (
    MAX_BODY,
    Decision,
    PullRequest,
    SuiteTrigger,
    action_key,
    decide,
    run_id_for,
    stale,
)
from accelmatrix.ui.trigger_guard import conf_refusal

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

SECRET_CONN_ID = "accelmatrix_github_webhook"
# The suites' github blocks are read again at most this often (a request may be one of a
# flood; the suites change when a DAG bundle does).
SUITES_TTL_S = 5.0
# The secret is read again at most this often: a flood of signed-looking requests costs one
# read of the secrets backend (the metadata database) per interval, not one each. A rotated
# secret is in force this long after the connection changed.
SECRET_TTL_S = 30.0
# An oversized body is read and dropped up to this many bytes before the 413, so the sender
# sees the answer; a larger one is answered with "Connection: close" unread. GitHub caps a
# delivery at 25 MB.
DRAIN_LIMIT = 32 << 20
# Deliveries carried out at once, and waiting, after their answer. A full queue answers 503:
# nothing is recorded, so GitHub's "Redeliver" may send it again.
WORKERS = 16
QUEUE_MAX = 2000


class SecretUnavailable(Exception):
    """The secrets backends failed to answer (the metadata database restarting): whether a
    secret is configured is not known, so the delivery is neither refused nor accepted."""


@dataclass
class Outcome:
    """The answer: its status and a JSON body saying what was started, refused, cancelled."""

    status: int
    detail: str
    started: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"detail": self.detail}
        for k in ("started", "refused", "cancelled"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        return out


_secret_lock = threading.Lock()
_secret_cache: tuple[float, str | None] | None = None


def webhook_secret() -> str | None:
    """The webhook secret (the connection's password), or None when none is configured;
    kept ``SECRET_TTL_S``. Raises ``SecretUnavailable`` when no backend had it and one
    failed: Airflow's ``Connection.get_connection_from_secrets`` logs such a failure at
    debug level and says "not defined", which would turn a database restart into a 403;
    the backends are asked here, in Airflow's order, so the failure is seen."""
    global _secret_cache
    now = time.monotonic()
    with _secret_lock:
        if _secret_cache is not None and now - _secret_cache[0] < SECRET_TTL_S:
            return _secret_cache[1]
    from airflow.configuration import ensure_secrets_loaded

    failures = []
    value: str | None = None
    for backend in ensure_secrets_loaded():
        try:
            conn = backend.get_connection(SECRET_CONN_ID)
        except Exception as e:  # noqa: BLE001 - any backend failure: not known, not "none"
            failures.append(f"{type(backend).__name__}: {type(e).__name__}")
            continue
        if conn is not None:
            value = conn.password or None
            break
    else:
        if failures:
            raise SecretUnavailable("; ".join(failures))
    with _secret_lock:
        _secret_cache = (now, value)
    return value


_suites_cache: tuple[float, list[SuiteTrigger]] | None = None


def suite_triggers() -> list[SuiteTrigger]:
    """Every valid suite's ``github`` block (an invalid suite triggers nothing)."""
    global _suites_cache
    now = time.monotonic()
    if _suites_cache is not None and now - _suites_cache[0] < SUITES_TTL_S:
        return _suites_cache[1]

    out = []
    for path in suite_files(settings.suites_dir()):
        try:
            gh = load_suite(path).github
        except (SuiteError, OSError):
            continue
        if gh is None:
            continue
        dag_id = suite_id(path)
        out.append(
            SuiteTrigger(
                dag_id=dag_id,
                repo=gh.repo,
                label=gh.label,
                ref_param=gh.ref_param,
                conn_id=gh.conn_id,
                context=gh.context or f"accelmatrix/{dag_id}",
                compare=gh.compare,
                params=tuple(gh.params.items()),
            )
        )
    _suites_cache = (now, out)
    return out


async def receive(request: Request, store: Callable[[], ResultsStore]) -> Response:
    """The route: the body read within ``MAX_BODY`` (an oversized one drained, then 413),
    then ``handle`` off the event loop."""
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    declared = request.headers.get("content-length", "")
    size, body = 0, bytearray()
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY:
            body += chunk
        elif size > DRAIN_LIMIT or (declared.isdigit() and int(declared) > DRAIN_LIMIT):
            break
    if size > MAX_BODY or (declared.isdigit() and int(declared) > MAX_BODY):
        drained = size <= DRAIN_LIMIT and not (declared.isdigit() and int(declared) > DRAIN_LIMIT)
        return JSONResponse(
            {"detail": f"delivery of {declared or size} bytes refused: at most {MAX_BODY}"},
            status_code=413,
            headers={} if drained else {"Connection": "close"},
        )
    headers = {k.lower(): v for k, v in request.headers.items()}
    outcome = await run_in_threadpool(handle, headers, bytes(body), store())
    extra = {"Retry-After": "10"} if outcome.status == 503 else {}
    return JSONResponse(outcome.body(), status_code=outcome.status, headers=extra)


def handle(headers: dict[str, str], body: bytes, store: ResultsStore) -> Outcome:
    """One delivery's answer (module docstring); ``headers`` lower-cased. The work, if any,
    is queued."""
    try:
        d = decide(headers, body, webhook_secret, suite_triggers)
    except SecretUnavailable as e:
        log.warning("webhook secret not read (%s): delivery answered 503", e)
        return Outcome(
            503,
            "the webhook secret could not be read (the secrets backend or metadata database "
            "did not answer): nothing done; redeliver it",
        )
    if d.delivery_id is None:
        return Outcome(d.status, d.detail)
    try:
        if not store.record_delivery(d.delivery_id, d.event):
            return Outcome(409, f"delivery {d.delivery_id} was handled before: nothing started")
    except ResultsStoreError as e:
        log.warning("delivery %s not recorded (%s): answered 503", d.delivery_id, e)
        return Outcome(503, "the results store did not answer: nothing done; redeliver it")
    if d.status != 202 or d.pull_request is None:
        return Outcome(d.status, d.detail)
    if not WORK.submit(d, store):
        store.forget_delivery(d.delivery_id)
        return Outcome(503, "too many deliveries waiting: nothing done; redeliver it")
    return Outcome(
        202,
        "accepted: checked against the pull request on GitHub and carried out after this answer",
    )


class Work:
    """Deliveries carried out after their answer, at most ``QUEUE_MAX`` waiting (per
    api-server worker process), in two lanes of ``WORKERS`` threads: a fork's deliveries
    (a permission check and a comment each, strangers can send many) never hold up those
    of the repository's own branches."""

    def __init__(self, workers: int = WORKERS, limit: int = QUEUE_MAX):
        self._pools: dict[bool, ThreadPoolExecutor] = {}
        self._workers, self._limit = workers, limit
        self._lock = threading.Lock()
        self._waiting = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, d: Decision, store: ResultsStore) -> bool:
        with self._lock:
            if self._waiting >= self._limit:
                return False
            self._waiting += 1
            lane = d.needs_vouch
            if lane not in self._pools:
                name = "gh-fork" if lane else "gh-delivery"
                self._pools[lane] = ThreadPoolExecutor(self._workers, thread_name_prefix=name)
            self._pools[lane].submit(self._run, d, store)
        return True

    def _run(self, d: Decision, store: ResultsStore) -> None:
        try:
            out = carry_out(d, store)
            log.info(
                "delivery %s (%s #%s): %s", d.delivery_id, d.pull_request.action,
                d.pull_request.number, out.body(),
            )  # fmt: skip
        except Exception:  # noqa: BLE001 - one delivery's failure is logged, never the pool's
            log.exception("delivery %s failed; redeliver it from GitHub", d.delivery_id)
        finally:
            with self._lock:
                self._waiting -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every queued delivery was carried out within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


WORK = Work()


def carry_out(d: Decision, store: ResultsStore) -> Outcome:
    """A delivery's work (module docstring). A GitHub error gives the delivery and the
    action keys it took back (so it can be redelivered) and is raised."""
    assert d.pull_request is not None and d.delivery_id is not None
    taken: list[str] = []
    try:
        return _start(d, d.pull_request, store, taken)
    except Exception:
        # Nothing half done is left for a redelivery to skip: GitHub's "Redeliver" retries.
        for key in taken:
            store.release_action(key)
        store.forget_delivery(d.delivery_id)
        raise


def _start(d: Decision, pr: PullRequest, store: ResultsStore, taken: list[str]) -> Outcome:
    out = Outcome(202, "accepted")
    for t in d.runs:
        hook = PullRequestHook(t.conn_id)
        # The key first: a replay of what was done costs no GitHub call.
        key = action_key(d.event, pr, t.label)
        if not store.claim_action(key):
            out.refused.append(f"{t.dag_id}: done before ({pr.action} of {pr.head_sha[:12]})")
            continue
        taken.append(key)
        why = stale(pr, hook.pull_request(pr.repo, pr.number), t.label)
        if why is not None:
            # Nothing done: the key goes back, for the delivery that is current.
            store.release_action(key)
            taken.remove(key)
            out.refused.append(f"{t.dag_id}: not current: {why}")
            continue
        if pr.action == "closed":  # closed now: its runs still going are cancelled
            out.cancelled += _cancel_older(store, t, pr, keep_sha=None)
            continue
        if d.needs_vouch and not _vouched(hook, t, pr, out):
            continue
        for kind, conf in _runs_of(t, pr):
            run_id = run_id_for(pr.number, pr.head_sha, kind)
            problem = conf_refusal(t.dag_id, conf)  # the trigger guard's own check
            if problem:
                out.refused.append(f"{t.dag_id}: {problem}")
                continue
            created = _trigger(t.dag_id, run_id, conf, pr, kind)
            store.add_pull_request_run(
                PullRequestRun(
                    dag_id=t.dag_id,
                    run_id=run_id,
                    kind=kind,
                    repo=pr.repo,
                    number=pr.number,
                    head_sha=pr.head_sha,
                    base_ref=pr.base_ref,
                    base_sha=pr.base_sha,
                    sender=pr.sender,
                    fork=pr.fork,
                )
            )
            if not created:
                continue  # this commit's run exists: a redelivery or a label added again
            out.started.append(f"{t.dag_id}/{run_id}")
            if kind == "verdict":
                set_status_quietly(
                    hook,
                    pr.repo,
                    pr.head_sha,
                    "pending",
                    context=t.context,
                    description=f"{t.dag_id}: running on {pr.head_sha[:7]}",
                    target_url=matrix_url(t.dag_id, run_id),
                )
        out.cancelled += _cancel_older(store, t, pr, keep_sha=pr.head_sha)
    if not out.started:
        out.status = 200
        out.detail = "nothing started" + (f": {'; '.join(out.refused)}" if out.refused else "")
    return out


def _vouched(hook: PullRequestHook, t: SuiteTrigger, pr: PullRequest, out: Outcome) -> bool:
    """A fork's head runs only on a label just added by someone who may push to the repo."""
    if pr.action == "labeled":
        # A GitHub error is raised: the delivery is given back, so "Redeliver" asks again.
        permission = hook.permission(pr.repo, pr.sender)
        if permission in WRITE_PERMISSIONS:
            return True
        why = (
            f"`{t.label}` was added by @{pr.sender}, who has {permission} access to "
            f"{pr.repo}: a maintainer (write access) must add it to run this fork's code"
        )
    else:
        why = (
            f"new commits ({pr.head_sha[:7]}) from a fork: a maintainer must add the label "
            f"`{t.label}` again to run them"
        )
    out.refused.append(f"{t.dag_id}: {why}")
    try:
        hook.upsert_comment(
            pr.repo, pr.number, marker=refusal_marker(t.dag_id),
            body=refusal_comment(t.dag_id, why),
        )  # fmt: skip
    except GithubError as e:
        log.warning("PR %s#%d: refusal not commented: %s", pr.repo, pr.number, e)
    return False


def _runs_of(t: SuiteTrigger, pr: PullRequest) -> list[tuple[str, dict[str, Any]]]:
    """(kind, conf) of each run the pull request's head gets."""
    conf = {**dict(t.params), t.ref_param: pr.head_sha}
    runs: list[tuple[str, dict[str, Any]]] = [("verdict", conf)]
    if t.compare:
        runs.append(
            (
                "compare",
                {**conf, COMPARE_KEY: {"base": pr.base_sha, "head": pr.head_sha}},
            )
        )
    return runs


def _trigger(dag_id: str, run_id: str, conf: dict[str, Any], pr: PullRequest, kind: str) -> bool:
    """Create the run with Airflow's own ``trigger_dag``; False when it exists already."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagRunAlreadyExists
    from airflow.utils.types import DagRunTriggeredByType

    what = "perf of the head against the base" if kind == "compare" else "the head"
    try:
        trigger_dag(
            dag_id,
            triggered_by=DagRunTriggeredByType.REST_API,
            triggering_user_name=f"github:{pr.sender}"[:250],
            run_id=run_id,
            conf=conf,
            # No logical date, as Airflow's REST trigger defaults to: two pull requests in
            # one second would collide on it (it is unique per DAG, to the second).
            logical_date=None,
            note=f"{pr.repo}#{pr.number}: {what} {pr.head_sha[:12]}, label by {pr.sender}",
        )
    except DagRunAlreadyExists:
        return False
    return True


def older_runs(runs: list[PullRequestRun], keep_sha: str | None) -> list[str]:
    """The run ids of ``runs`` (oldest first) recorded before the first run of ``keep_sha``;
    every run when ``keep_sha`` is None (the pull request closed), none when ``keep_sha``
    has no run (nothing of it was started: nothing to make way for)."""
    if keep_sha is None:
        return [r.run_id for r in runs]
    first = next((i for i, r in enumerate(runs) if r.head_sha == keep_sha), None)
    if first is None:
        return []
    return [r.run_id for r in runs[:first] if r.head_sha != keep_sha]


def _cancel_older(
    store: ResultsStore, t: SuiteTrigger, pr: PullRequest, *, keep_sha: str | None
) -> list[str]:
    """Mark the pull request's still-going runs failed (their teardowns still run: the UI's
    "Mark run as failed"); the run ids. With ``keep_sha``, only runs recorded before that
    head's, so an old head (a delivery overtaken by a newer one) never cancels a newer."""
    older = older_runs(store.pull_request_runs(t.dag_id, pr.repo, pr.number), keep_sha)
    if not older:
        return []
    from airflow.api_fastapi.core_api.datamodels.dag_run import DagRunMutableStates
    from airflow.api_fastapi.core_api.services.public.dag_run import patch_dag_run_state
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import select

    cancelled = []
    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(
                DagRun.dag_id == t.dag_id,
                DagRun.run_id.in_(older),
                DagRun.state.in_([DagRunState.QUEUED, DagRunState.RUNNING]),
            )
        ).all()
        bag = DBDagBag()
        for run in runs:
            dag = bag.get_dag_for_run(run, session=session)
            if dag is None:
                continue
            patch_dag_run_state(
                dag=dag, dag_run=run, state=DagRunMutableStates.FAILED, session=session
            )
            cancelled.append(f"{t.dag_id}/{run.run_id}")
            log.info(
                "PR %s#%d: %s superseded by %s: marked failed (its teardowns still run)",
                pr.repo, pr.number, run.run_id, pr.head_sha[:12],
            )  # fmt: skip
    return cancelled
