"""``POST /accelmatrix/github/webhook``: a label on a pull request runs a suite on its head.

GitHub cannot hold an Airflow token, so this one route of the plugin app is not behind
Airflow's login: a delivery proves itself by its HMAC signature under the secret kept in
the Airflow connection ``accelmatrix_github_webhook`` (its password). What a delivery
asks for is judged by ``ui.github_delivery.decide`` (pure); this module carries it out,
inside the api-server, which holds Airflow's metadata database:

* a replayed delivery id is refused (409), remembered in the results store so a
  redelivery to another api-server worker, or after a restart, is refused too;
* a fork's head runs only when the label was just added by someone with write access to
  the repository (GitHub's permission API, through the suite's GitHub connection);
  otherwise the pull request gets a comment saying a maintainer must add the label;
* the suite's run is created with Airflow's own ``trigger_dag`` (what ``airflow dags
  trigger`` calls) under ``pr-<number>-<sha>``: a second delivery for the same commit
  finds the run and starts nothing more. Its conf is ``{<ref_param>: <head sha>}``,
  checked like any trigger's (``spec.params.check_run_conf``);
* the pull request's older runs of the suite that are still going are marked failed, as
  the UI's "Mark run as failed" does: their teardowns still run (cleanup.stopped);
* the head commit gets a "pending" status linking the run's matrix page. The gate sets
  the final status and writes the comment (``notifications.pull_request``).

A GitHub outage while posting the pending status never stops the run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from accelmatrix import settings
from accelmatrix.hooks.github import WRITE_PERMISSIONS, GithubError, PullRequestHook
from accelmatrix.notifications.pull_request import (
    matrix_url,
    refusal_comment,
    set_status_quietly,
)
from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import COMPARE_KEY
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.spec.suite_files import suite_files, suite_id
from accelmatrix.ui.github_delivery import (
    Decision,
    PullRequest,
    SuiteTrigger,
    decide,
    run_id_for,
)
from accelmatrix.ui.trigger_guard import conf_refusal

log = logging.getLogger(__name__)

SECRET_CONN_ID = "accelmatrix_github_webhook"
# The suites' github blocks are read again at most this often (a request may be one of a
# flood; the suites change when a DAG bundle does).
SUITES_TTL_S = 5.0


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


def webhook_secret() -> str | None:
    """The webhook secret (the connection's password), or None when none is configured."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.models.connection import Connection

    try:
        conn = Connection.get_connection_from_secrets(SECRET_CONN_ID)
    except AirflowNotFoundException:
        return None
    return conn.password or None


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


def handle(headers: dict[str, str], body: bytes, store: ResultsStore) -> Outcome:
    """One delivery, start to end (module docstring). ``headers`` lower-cased."""
    d = decide(headers, body, webhook_secret(), suite_triggers)
    if d.delivery_id is None:
        return Outcome(d.status, d.detail)
    if not store.record_delivery(d.delivery_id, d.event):
        return Outcome(409, f"delivery {d.delivery_id} was handled before: nothing started")
    if d.status != 202 or d.pull_request is None:
        return Outcome(d.status, d.detail)
    try:
        return _start(d, d.pull_request, store)
    except Exception:
        # Nothing half done is left for a redelivery to skip: GitHub's "Redeliver" retries.
        store.forget_delivery(d.delivery_id)
        raise


def _start(d: Decision, pr: PullRequest, store: ResultsStore) -> Outcome:
    out = Outcome(202, "accepted")
    if pr.action == "closed":
        for t in d.runs:
            out.cancelled += _cancel_older(store, t, pr, keep_sha=None)
        out.status, out.detail = 200, f"pull request closed: {len(out.cancelled)} run(s) cancelled"
        return out
    for t in d.runs:
        hook = PullRequestHook(t.conn_id)
        if d.needs_vouch and not _vouched(hook, t, pr, out):
            continue
        out.cancelled += _cancel_older(store, t, pr, keep_sha=pr.head_sha)
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
    if not out.started:
        out.status = 200
        out.detail = "nothing started" + (f": {'; '.join(out.refused)}" if out.refused else "")
    return out


def _vouched(hook: PullRequestHook, t: SuiteTrigger, pr: PullRequest, out: Outcome) -> bool:
    """A fork's head runs only on a label just added by someone who may push to the repo."""
    if pr.action == "labeled":
        try:
            permission = hook.permission(pr.repo, pr.sender)
        except GithubError as e:
            out.refused.append(f"{t.dag_id}: {pr.sender}'s permission unknown ({e})")
            return False
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
            pr.repo, pr.number, marker=f"<!-- accelmatrix:needs-maintainer {t.dag_id} -->",
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


def _cancel_older(
    store: ResultsStore, t: SuiteTrigger, pr: PullRequest, *, keep_sha: str | None
) -> list[str]:
    """Mark the pull request's still-going runs failed, but those of ``keep_sha`` (their
    teardowns still run: the UI's "Mark run as failed"); the run ids."""
    older = [
        r.run_id for r in store.pull_request_runs(t.dag_id, pr.repo, pr.number)
        if r.head_sha != keep_sha
    ]  # fmt: skip
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
