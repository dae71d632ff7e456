"""``notify:`` in a suite: who hears about a run, and when.

    notify:
      webhook: {conn_id: ci_webhook, when: failure}

The URL (and any token, as the connection's password) lives in an Airflow connection, never
in the suite YAML: suites are committed, secrets are not. Only pydantic here (parse time).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

__all__ = ["Notify", "WebhookNotify"]


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


class Notify(BaseModel):
    model_config = ConfigDict(extra="forbid")

    webhook: WebhookNotify | None = None
