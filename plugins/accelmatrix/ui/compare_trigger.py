"""The api-server side of "compare two builds" from the history page: the form's values as
an ``accelmatrix_compare`` conf block, and the run triggered through Airflow's REST API.

The run is triggered with ``POST /api/v2/dags/{dag}/dagRuns`` on the api-server the page
runs in, with a short-lived token of the user who clicked (the auth manager's
``generate_jwt``): Airflow checks that user's access again and records the run as theirs,
and the plugin's trigger guard (``ui/trigger_guard.py``) checks the block as it checks any
conf, so a wrong build or glob is the same 400 the CLI's and REST's users get. The run
itself is the suite's own (``history.build_compare`` writes its report).
"""

from __future__ import annotations

from typing import Any

from accelmatrix.spec.followup_plan import COMPARE_KEY
from accelmatrix.ui.rerun import Refused, post_as

__all__ = ["request_of", "trigger"]

TRIGGER_TIMEOUT = 60.0


def request_of(form: dict[str, str]) -> dict[str, Any]:
    """The conf block of the form's fields; Refused (400) when one is missing or no
    number. The block's own rules (builds, globs, pairs) are the trigger guard's."""
    base, head = form.get("base", "").strip(), form.get("head", "").strip()
    if not base or not head:
        raise Refused(400, "compare: both base and head builds are needed")
    cells = [c.strip() for c in form.get("cells", "*").split(",") if c.strip()] or ["*"]
    try:
        pairs = int(form.get("pairs") or 10)
    except ValueError:
        raise Refused(
            400, f"compare: pairs must be a whole number, got {form['pairs']!r}"
        ) from None
    return {"base": base, "head": head, "cells": cells, "pairs": pairs}


def trigger(*, server: str, ui_base: str, dag_id: str, block: dict[str, Any], user: Any) -> str:
    """Trigger the suite's DAG with the block as ``user``; the new run's id. Raises Refused
    with Airflow's (or the trigger guard's) answer."""
    url = f"{server}{ui_base}/api/v2/dags/{dag_id}/dagRuns"
    body = {"logical_date": None, "conf": {COMPARE_KEY: block}}
    answer = post_as(
        user,
        url,
        body,
        silent="Airflow's trigger API did not answer",
        refused="the comparison was refused",
        timeout=TRIGGER_TIMEOUT,
    )
    return str(answer["dag_run_id"])
