"""``notify:`` in a suite: who hears about a run, and when.

    notify:
      webhook: {conn_id: ci_webhook, when: failure}
      alerts:                       # per-cell alerts, deduplicated (accelmatrix/alerts.py)
        - {conn_id: slack_perf, format: slack}
        - {conn_id: github_issues, format: github}

The URL (and any token, as the connection's password) lives in an Airflow connection, never
in the suite YAML: suites are committed, secrets are not. Only pydantic here (parse time).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

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
    timeout_seconds: PositiveInt = 10
    labels: list[str] = Field(default_factory=lambda: ["accelmatrix"])


class Notify(BaseModel):
    model_config = ConfigDict(extra="forbid")

    webhook: WebhookNotify | None = None
    alerts: list[AlertSink] = Field(default_factory=list)
