"""``notify:`` in a suite: who hears about a run, and when.

    notify:
      webhook: {conn_id: ci_webhook, when: failure}
      alerts:                       # per-cell alerts, deduplicated (notifications/dedup.py)
        - {conn_id: slack_perf, format: slack}
        - {conn_id: github_issues, format: github}

The URL (and any token, as the connection's password) lives in an Airflow connection, never
in the suite YAML: suites are committed, secrets are not. Only pydantic here (parse time);
sending is accelmatrix.notifications.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

__all__ = ["AlertSink", "Notify", "WebhookNotify"]


class WebhookNotify(BaseModel):
    """POST a JSON summary (run link, failed cells, failed tests) to an HTTP endpoint.

    The connection gives the target: ``host``, ``port``, ``schema`` (http or https; anything
    else means http), ``extra.endpoint`` (the path, default ``/``); a ``password``, if set,
    is sent as ``Authorization: Bearer <password>``.
    """

    model_config = ConfigDict(extra="forbid")

    conn_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Airflow HTTP connection id")
    when: Literal["failure", "always"] = "failure"
    timeout_seconds: PositiveInt = 10


class AlertSink(BaseModel):
    """Where per-cell alerts go: an HTTP connection (as for ``webhook``) and a payload format.

    ``slack``: ``{"text", "blocks"}`` for a Slack incoming webhook (or anything that speaks
    it). ``github``: ``{"title", "body", "labels"}``, the body of GitHub's "create an issue"
    call (connection host api.github.com, ``extra.endpoint`` /repos/OWNER/REPO/issues, the
    token as the password).
    """

    model_config = ConfigDict(extra="forbid")

    conn_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Airflow HTTP connection id")
    format: Literal["slack", "github"] = "slack"
    # github only: with a repo the alert is ONE issue of OWNER/REPO managed through the
    # github provider (conn_id is then a GitHub connection: token as password, host for
    # GitHub Enterprise); a recurrence comments on it and a resolution closes it. Without,
    # each event is POSTed to the HTTP connection's issues endpoint (a new issue each).
    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    timeout_seconds: PositiveInt = 10
    labels: list[str] = Field(default_factory=lambda: ["accelmatrix"])

    @model_validator(mode="after")
    def _repo_only_for_github(self) -> AlertSink:
        if self.repo and self.format != "github":
            raise ValueError("repo is for format: github only")
        return self


class Notify(BaseModel):
    model_config = ConfigDict(extra="forbid")

    webhook: WebhookNotify | None = None
    alerts: list[AlertSink] = Field(default_factory=list)
