"""Backfills that run what was asked (issue 40): the trigger guard in front of
``POST /api/v2/backfills`` and ``.../backfills/dry_run`` refuses a conf the suite's plan
would refuse, with the message a refused trigger gets, before any backfill run exists."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from accelmatrix.ui.trigger_guard import BACKFILL_CONF, backfill_dag_id, refusal

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "include" / "suites"
DAG = "nightly_perf"  # a suite with a schedule: backfills need one
TYPO = "model=smal"


def test_the_backfill_body_names_the_suite_and_its_conf(monkeypatch) -> None:
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(SUITES))
    body = json.dumps(
        {"dag_id": DAG, "from_date": "2026-11-01T00:00:00Z", "dag_run_conf": {"cells": [TYPO]}}
    ).encode()
    assert backfill_dag_id(body) == DAG
    assert backfill_dag_id(b"not json") is None and backfill_dag_id(b'{"dag_id": 3}') is None
    why = refusal(DAG, body, BACKFILL_CONF)
    assert why is not None and f"cells: {TYPO!r} matches no cell id of {DAG}" in why
    # The same body read as a trigger's has no "conf": nothing to refuse there.
    assert refusal(DAG, body) is None
    ok = json.dumps({"dag_id": DAG, "dag_run_conf": None}).encode()
    assert refusal(DAG, ok, BACKFILL_CONF) is None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from accelmatrix_testkit import AirflowStack

    root = tmp_path_factory.mktemp("backfill-guard")
    with AirflowStack(
        home=root / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=SUITES,
        components=("dag-processor", "api-server"),
    ) as s:
        yield s


def _post(stack, path: str, conf: dict | None) -> httpx.Response:
    body = {
        "dag_id": DAG,
        "from_date": "2026-11-01T00:00:00Z",
        "to_date": "2026-11-03T00:00:00Z",
        "dag_run_conf": conf,
    }
    return stack.client.post(f"/api/v2/{path}", json=body, timeout=60)


@pytest.mark.integration
@pytest.mark.slow(40)
def test_rest_backfill_refuses_a_glob_selecting_nothing_and_a_param_out_of_range(stack):
    stack.wait_for_dag(DAG, timeout=180)
    for path in ("backfills/dry_run", "backfills"):
        bad = _post(stack, path, {"cells": [TYPO]})
        assert bad.status_code == 400, (path, bad.status_code, bad.text)
        assert f"cells: {TYPO!r} matches no cell id of {DAG}" in bad.json()["detail"]
        assert "model=small" in bad.json()["detail"]  # the valid cell ids
        low = _post(stack, path, {"budget_usd": -1})
        assert low.status_code == 400, (path, low.text)
        assert "budget_usd: -1 is less than the minimum of 0" in low.json()["detail"]
    # Refused: no backfill exists.
    listed = stack.api("GET", "backfills", params={"dag_id": DAG})
    assert listed["total_entries"] == 0, listed
    # What the suite accepts goes to Airflow as it came.
    ok = _post(stack, "backfills/dry_run", {"cells": ["model=small"]})
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["backfills"]) == 3
