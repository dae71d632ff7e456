"""The per-change trigger of the tiered_ci CPU tier: ``POST /api/v2/dags/tiered_ci/dagRuns``.

Against a real api-server and dag-processor (the smallest real Airflow that serves the REST
API for a parsed DAG): starting the scheduler and triggerer too and running the cell would
take well over 90 s on this 2-core machine, and what the run does with the conf is proven by
the dag.test() test in test_tiered_ci.py (same DAG, same conf). This test proves the API
half: a CI system posts ``{"tier": "cpu", "git_ref": ...}`` and gets a queued run carrying
it; the suite's param schema rejects a ref that could pass for a git option.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from accelmatrix_testkit import AirflowStack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "tiered_ci"


def test_cpu_tier_triggered_through_the_rest_api_with_a_git_ref(tmp_path):
    with AirflowStack(
        home=tmp_path / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=ROOT / "include" / "suites",
        components=("dag-processor", "api-server"),
    ) as stack:
        stack.wait_for_dag(DAG_ID, timeout=120)
        dag = stack.api("GET", f"dags/{DAG_ID}")
        assert dag["timetable_summary"] == "0 2 * * *"  # the nightly tier's cron
        conf = {"tier": "cpu", "git_ref": "v2-broken", "repo_url": "/srv/git/ci_sample.git"}
        run_id = stack.trigger(DAG_ID, conf=conf)
        run = stack.get_run(DAG_ID, run_id)
        assert run["conf"] == conf and run["state"] == "queued"
        assert run["run_type"] == "manual"

        bad = stack.client.post(
            f"/api/v2/dags/{quote(DAG_ID)}/dagRuns",
            json={"logical_date": None, "conf": {"tier": "cpu", "git_ref": "--upload-pack=x"}},
        )
        assert bad.status_code == 400, bad.text
        assert "git_ref" in bad.text
        wrong_tier = stack.client.post(
            f"/api/v2/dags/{quote(DAG_ID)}/dagRuns",
            json={"logical_date": None, "conf": {"tier": "gpu"}},
        )
        assert wrong_tier.status_code == 400, wrong_tier.text
    assert stack.leftovers == []
