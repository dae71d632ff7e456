"""Airflow notifiers that deliver accelmatrix's notifications, with retries.

* :class:`HttpJsonNotifier`: POST a JSON document to an Airflow HTTP connection through the
  http provider's ``HttpHook`` (``run_with_advanced_retry``, tenacity): a webhook that is
  briefly down or answers 5xx / 429 is tried again with backoff instead of losing the
  notification. The connection gives ``host``/``port``/``schema``, ``extra.endpoint`` (the
  path) and, as its ``password``, a bearer token.
* :class:`GithubIssueNotifier`: one GitHub issue per alert through the github provider's
  ``GithubHook`` (PyGithub, which retries 5xx and rate limits itself): open it, comment on
  an escalation, comment and close it when the alert resolves.

They are ``BaseNotifier`` subclasses so a DAG can also use them as callbacks; the gate calls
``notify()`` directly with what it decided to say (see transport.py, dedup.py).
"""

from __future__ import annotations

import logging
from typing import Any

import requests
import tenacity
from airflow.providers.http.hooks.http import HttpHook
from airflow.sdk import BaseNotifier

from accelmatrix.masking import mask_connection

log = logging.getLogger(__name__)

__all__ = ["GithubIssueNotifier", "HttpJsonNotifier", "NotifyError"]

ATTEMPTS = 3
WAIT_MIN_S = 0.5
WAIT_MAX_S = 10.0


class NotifyError(RuntimeError):
    """The webhook could not be reached or refused the notification."""


class _RetryableStatus(Exception):
    """A status worth another try: 5xx (the server's trouble) or 429 (slow down)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason = status, reason


class _StatusJudgingHttpHook(HttpHook):
    """HttpHook whose status check says which failures are worth a retry.

    HttpHook's own check raises one ``AirflowException("500:reason")`` for every non-2xx;
    a retry policy would have to parse its message to tell 503 (retry) from 404 (do not).
    """

    def check_response(self, response: requests.Response) -> None:
        code = response.status_code
        if code >= 500 or code == 429:
            raise _RetryableStatus(code, response.reason)
        if code >= 300:
            raise NotifyError(f"webhook answered {code} {response.reason}")


class HttpJsonNotifier(BaseNotifier):
    """POST ``payload`` as JSON to the HTTP connection ``http_conn_id``."""

    template_fields = ("payload",)

    def __init__(
        self,
        *,
        http_conn_id: str,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
        attempts: int = ATTEMPTS,
    ) -> None:
        super().__init__()
        self.http_conn_id = http_conn_id
        self.payload = payload
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.attempts = attempts
        self.status: int | None = None  # the accepted answer's status, after notify()
        self.response_json: Any = None

    def notify(self, context: Any) -> None:

        hook = _StatusJudgingHttpHook(method="POST", http_conn_id=self.http_conn_id)
        conn = hook.get_connection(self.http_conn_id)
        mask_connection(self.http_conn_id)
        if not conn.host:
            raise NotifyError(f"connection {self.http_conn_id!r} has no host")
        headers = {"Content-Type": "application/json", **self.headers}
        if conn.password and not conn.login:
            headers.setdefault("Authorization", f"Bearer {conn.password}")
        endpoint = str(conn.extra_dejson.get("endpoint") or "/")
        retry = {
            "stop": tenacity.stop_after_attempt(self.attempts),
            "wait": tenacity.wait_exponential(multiplier=WAIT_MIN_S, max=WAIT_MAX_S),
            "retry": tenacity.retry_if_exception_type(
                (requests.ConnectionError, requests.Timeout, _RetryableStatus)
            ),
            "reraise": True,
            "before_sleep": lambda state: log.warning(
                "%s: attempt %d failed (%s); retrying",
                self.http_conn_id,
                state.attempt_number,
                state.outcome.exception() if state.outcome else "?",
            ),
        }
        try:
            response = hook.run_with_advanced_retry(
                retry,
                endpoint=endpoint,
                json=self.payload,
                headers=headers,
                extra_options={"timeout": self.timeout},
            )
        except _RetryableStatus as e:
            raise NotifyError(f"webhook answered {e.status} {e.reason}") from None
        except requests.RequestException as e:
            raise NotifyError(f"webhook unreachable: {e}") from None
        self.status = response.status_code
        try:
            self.response_json = response.json() if response.content else None
        except ValueError:
            self.response_json = None


class GithubIssueNotifier(BaseNotifier):
    """Open, comment on or close the GitHub issue of one alert.

    ``issue_number`` None with ``close=False`` opens a new issue (``self.issue_number``
    holds its number afterwards); with a number, ``body`` becomes a comment and ``close``
    closes the issue.
    """

    template_fields = ("title", "body")

    def __init__(
        self,
        *,
        github_conn_id: str,
        repo: str,
        title: str,
        body: str,
        labels: list[str] | None = None,
        issue_number: int | None = None,
        close: bool = False,
    ) -> None:
        super().__init__()
        self.github_conn_id = github_conn_id
        self.repo = repo
        self.title, self.body = title, body
        self.labels = list(labels or [])
        self.issue_number = issue_number
        self.close = close

    def notify(self, context: Any) -> None:
        from airflow.providers.github.hooks.github import GithubHook

        mask_connection(self.github_conn_id)
        client = GithubHook(github_conn_id=self.github_conn_id).get_conn()
        # Lazy: no GET of the repository itself, only the issue calls.
        repo = client.withLazy(True).get_repo(self.repo)
        if self.issue_number is None:
            if self.close:
                return  # nothing was opened, so nothing to close
            issue = repo.create_issue(title=self.title, body=self.body, labels=self.labels)
            self.issue_number = issue.number
            return
        issue = repo.get_issue(self.issue_number)
        issue.create_comment(self.body)
        if self.close:
            issue.edit(state="closed", state_reason="completed")
