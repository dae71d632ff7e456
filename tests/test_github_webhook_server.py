"""The pull request loop on a real Airflow (scheduler, triggerer, dag-processor, api-server)
and a fake GitHub API on loopback: signed deliveries to ``POST /accelmatrix/github/webhook``
start runs, and the runs' gates report back.

One stack, one suite (``pr_smoke``: two cells, a workload that takes a few seconds and
fails on a head sha starting with ``dead``), the cases in the order a pull request lives
them:

* a bad signature gets 401 and starts nothing;
* a signed ``labeled`` delivery starts the run under ``pr-7-<sha>`` and posts "pending"
  with the matrix page's link before it answers;
* a replay of that delivery gets 409; a new delivery of the same commit starts nothing;
* a fork labelled by a read-only user starts nothing and gets the comment;
* a push to the labelled pull request marks the older run failed (its teardowns still
  run) and starts the new head; at the end: a final status and exactly one comment;
* a head whose cells fail: "failure", and the comment has expected against observed;
* a suite with ``compare: true`` and a head 20 % slower than the base: the cells pass,
  the comparison (both builds on one machine) says slower, so not safe to merge;
* GitHub down while a run ends: the run's verdict stands, the gate logs the command
  that posts the report again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_github import FakeGithub

from accelmatrix_testkit import AirflowStack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "pr_smoke"
REPO = "acme/trainer"
SECRET = "webhook-secret-for-tests"
BASE = "b" * 40
HEAD1, HEAD2, BAD, HEAD4 = "1" * 40, "2" * 40, "dead" + "0" * 36, "4" * 40

SCRIPT = (
    "import sys, time\n"
    "ref = sys.argv[1]\n"
    "for i in range(4):\n"
    "    time.sleep(0.5)\n"
    "    print(f'step {i} step_time: 0.5s', flush=True)\n"
    "if not ref.startswith('dead'):\n"
    "    print('training done', flush=True)\n"
)
SUITE = {
    "description": "pull request smoke: two cells on the head commit",
    "owners": ["ml-infra"],
    "schedule": None,
    "max_active_runs": 4,
    "axes": {"model": ["small", "large"]},
    "machines": {"cpu-small": {"backend": "local", "resources": {"cpu": 1}, "pool_slots": 1}},
    "machine": "cpu-small",
    "params": {
        "git_ref": {
            "type": "string",
            "default": "main",
            "pattern": "^[A-Za-z0-9][A-Za-z0-9._/^~-]{0,199}$",
        }
    },
    "github": {"repo": REPO, "label": "run-tpu-tests", "conn_id": "github_fake"},
    "workload": {"run": ["${python}", "-c", SCRIPT, "${params.git_ref}"], "timeout": 120},
    "checks": [{"type": "log_contains", "pattern": "training done"}],
}

# The same suite with the perf comparison: the head against the base commit, interleaved on
# one machine per cell. The workload reports a step time set by the build (a head starting
# with 5 is 20 % slower), so the verdict is known.
PERF_SCRIPT = (
    "import sys, time\n"
    "build = sys.argv[1]\n"
    "for i in range(3):\n"
    "    time.sleep(0.05)\n"
    "    print(f'step {i} step_time: {0.06 if build.startswith(\"5\") else 0.05}s', flush=True)\n"
    "print('training done', flush=True)\n"
)
PERF_DAG_ID = "pr_perf"
PERF_SUITE = {
    **SUITE,
    "axes": {"model": ["small"]},
    "runtime_version": "${params.git_ref}",
    "github": {**SUITE["github"], "label": "perf", "compare": True},
    "workload": {
        "run": ["${python}", "-c", PERF_SCRIPT, "${run.runtime_version}"],
        "timeout": 120,
        "metrics": [
            {"type": "log_regex", "name": "step_time", "pattern": "step_time: ([0-9.]+)s",
             "unit": "s", "series": True},
        ],
    },
}  # fmt: skip
HEAD5 = "5" * 40


def _payload(action: str, number: int, head: str, *, sender: str = "maintainer",
             fork: bool = False, label: str | None = "run-tpu-tests") -> bytes:  # fmt: skip
    p: dict[str, Any] = {
        "action": action,
        "number": number,
        "repository": {"full_name": REPO},
        "sender": {"login": sender},
        "pull_request": {
            "number": number,
            "head": {"sha": head, "repo": {"full_name": "stranger/trainer" if fork else REPO}},
            "base": {"sha": BASE, "ref": "main"},
            "labels": [{"name": "run-tpu-tests"}],
        },
    }
    if label:
        p["label"] = {"name": label}
    return json.dumps(p).encode()


def _deliver(stack: AirflowStack, body: bytes, delivery: str, *, secret: str = SECRET) -> Any:
    sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # GitHub holds no Airflow token: a client without one.
    with httpx.Client(base_url=stack.client.base_url, timeout=30) as anonymous:
        return anonymous.post(
            "/accelmatrix/github/webhook",
            content=body,
            headers={
                "X-Hub-Signature-256": sig,
                "X-GitHub-Event": "pull_request",
                "X-GitHub-Delivery": delivery,
                "Content-Type": "application/json",
            },
        )


def _runs(stack: AirflowStack) -> dict[str, str]:
    runs = stack.api("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 100})["dag_runs"]
    return {r["dag_run_id"]: r["state"] for r in runs}


def _wait_task_running(stack: AirflowStack, run_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tis = stack.task_instances(DAG_ID, run_id)
        if any(
            ti["task_id"].endswith("run") and ti["state"] in ("running", "deferred") for ti in tis
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no run task of {run_id} started in {timeout} s")


@pytest.mark.slow(150)
def test_a_label_runs_the_suite_and_the_verdict_comes_back_to_the_pull_request(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(json.dumps(SUITE))
    (suites / f"{PERF_DAG_ID}.yaml").write_text(json.dumps(PERF_SUITE))
    with FakeGithub(permissions={"maintainer": "write", "stranger": "read"}) as github:
        with AirflowStack(
            home=tmp_path / "airflow",
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            parallelism=8,
            env_extra={
                "AIRFLOW_CONN_GITHUB_FAKE": github.conn_uri_json(),
                "AIRFLOW_CONN_ACCELMATRIX_GITHUB_WEBHOOK": json.dumps(
                    {"conn_type": "generic", "password": SECRET}
                ),
            },
        ) as stack:
            stack.create_pool("accelmatrix_cpu_small", 4, include_deferred=True)
            stack.wait_for_dag(DAG_ID)
            stack.wait_for_dag(PERF_DAG_ID)

            body = _payload("labeled", 7, HEAD1)
            bad = _deliver(stack, body, "d-bad", secret="a guess")
            assert bad.status_code == 401, bad.text
            assert _runs(stack) == {}

            t0 = time.monotonic()
            first = _deliver(stack, body, "d-1")
            to_pending = time.monotonic() - t0
            run1 = f"pr-7-{HEAD1}"
            assert first.status_code == 202, first.text
            assert first.json()["started"] == [f"{DAG_ID}/{run1}"]
            (pending,) = github.statuses_of(HEAD1)
            assert pending["state"] == "pending" and pending["context"] == f"accelmatrix/{DAG_ID}"
            assert f"/accelmatrix/suites/{DAG_ID}?run_id=" in pending["target_url"]
            assert to_pending <= 5.0, to_pending  # the goal, delivery to pending

            assert _deliver(stack, body, "d-1").status_code == 409  # replayed
            again = _deliver(stack, body, "d-2")  # the label added again, same commit
            assert again.status_code == 200 and "started" not in again.json(), again.text
            assert list(_runs(stack)) == [run1]

            fork = _deliver(
                stack, _payload("labeled", 8, HEAD4, sender="stranger", fork=True), "d-3"
            )
            assert fork.status_code == 200 and "maintainer" in fork.text, fork.text
            (refusal,) = github.comments_on(8)
            assert "@stranger" in refusal and "read access" in refusal
            assert list(_runs(stack)) == [run1]

            # A push while the first head's cells run: that run is marked failed, its
            # teardowns still run, and the new head starts.
            _wait_task_running(stack, run1)
            push = _deliver(stack, _payload("synchronize", 7, HEAD2, label=None), "d-4")
            run2 = f"pr-7-{HEAD2}"
            assert push.status_code == 202, push.text
            assert push.json()["cancelled"] == [f"{DAG_ID}/{run1}"]
            assert push.json()["started"] == [f"{DAG_ID}/{run2}"]

            failing = _deliver(stack, _payload("labeled", 9, BAD), "d-5")
            assert failing.status_code == 202, failing.text
            run_bad = f"pr-9-{BAD}"

            assert stack.wait_for_run(DAG_ID, run1, timeout=300) == "failed"
            teardowns = [
                ti
                for ti in stack.task_instances(DAG_ID, run1)
                if ti["task_id"].endswith("teardown")
            ]
            assert teardowns and all(ti["state"] == "success" for ti in teardowns), teardowns
            assert stack.wait_for_run(DAG_ID, run2, timeout=300) == "success"
            assert stack.wait_for_run(DAG_ID, run_bad, timeout=300) == "failed"

            # PR 7: one comment, about the newest head, safe to merge; its statuses.
            (comment,) = github.comments_on(7)
            assert HEAD2[:12] in comment and "Safe to merge" in comment, comment
            assert [s["state"] for s in github.statuses_of(HEAD2)] == ["pending", "success"]
            # PR 9: the failing check, expected against observed.
            (comment9,) = github.comments_on(9)
            assert "Not safe to merge" in comment9 and "training done" in comment9, comment9
            assert github.statuses_of(BAD)[-1]["state"] == "failure"

            # The perf label: the cells pass, but the head is 20 % slower than the base on
            # one machine, builds interleaved: not safe to merge.
            perf = _deliver(stack, _payload("labeled", 11, HEAD5, label="perf"), "d-7")
            assert perf.status_code == 202, perf.text
            assert sorted(perf.json()["started"]) == [
                f"{PERF_DAG_ID}/pr-11-{HEAD5}",
                f"{PERF_DAG_ID}/pr-11-{HEAD5}-compare",
            ]
            for run_id in (f"pr-11-{HEAD5}", f"pr-11-{HEAD5}-compare"):
                assert stack.wait_for_run(PERF_DAG_ID, run_id, timeout=300) == "success"
            (comment11,) = github.comments_on(11)
            assert "Not safe to merge" in comment11 and "**slower**" in comment11, comment11
            assert "+20.00%" in comment11 and "pairs" in comment11, comment11
            assert github.statuses_of(HEAD5)[-1]["state"] == "failure"

            # GitHub down while a run ends: the verdict stands; the log says how to re-post.
            ok = _deliver(stack, _payload("labeled", 10, HEAD4), "d-6")
            assert ok.status_code == 202, ok.text
            run4 = f"pr-10-{HEAD4}"
            github.down = True
            assert stack.wait_for_run(DAG_ID, run4, timeout=300) == "success"
            gate_log = stack.task_log(DAG_ID, run4, "gate")
            assert f"pr-report --dag-id {DAG_ID} --run-id {run4}" in gate_log, gate_log[-3000:]
            github.down = False
            assert github.comments_on(10) == []
    assert stack.leftovers == []
