"""Pull requests, without Airflow: a delivery judged (signature, size, replay, event,
repository, label, fork), the suite's ``github`` block validated, the store's deliveries and
pull request runs, and the report back (status and one comment) against a fake GitHub API
on loopback, outage included. The whole loop on a real Airflow is
tests/test_github_webhook_server.py."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGithub

from accelmatrix.hooks.github import PullRequestHook
from accelmatrix.notifications import pull_request as report
from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.ui.github_delivery import MAX_BODY, SuiteTrigger, decide, run_id_for, signature_ok
from accelmatrix_testkit.records import verdict

SECRET = "s3cret-webhook"
REPO = "acme/trainer"
HEAD = "a" * 40
BASE = "b" * 40
TRIGGERS = [
    SuiteTrigger(
        "pr_smoke", REPO, "run-tpu-tests", "git_ref", "github_fake", "accelmatrix/pr_smoke"
    ),
    SuiteTrigger("other", "acme/other", "perf", "git_ref", "github_fake", "accelmatrix/other"),
]


def payload(
    action: str = "labeled",
    *,
    label: str | None = "run-tpu-tests",
    labels: tuple[str, ...] = ("run-tpu-tests",),
    repo: str = REPO,
    head_repo: str | None = None,
    number: int = 7,
    head: str = HEAD,
    sender: str = "maintainer",
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": action,
        "number": number,
        "repository": {"full_name": repo},
        "sender": {"login": sender},
        "pull_request": {
            "number": number,
            "head": {"sha": head, "ref": "feature", "repo": {"full_name": head_repo or repo}},
            "base": {"sha": BASE, "ref": "main", "repo": {"full_name": repo}},
            "labels": [{"name": x} for x in labels],
        },
    }
    if label is not None:
        out["label"] = {"name": label}
    return out


def signed(
    body: bytes, *, event: str = "pull_request", delivery: str = "d-1", secret: str = SECRET
) -> dict[str, str]:
    sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"x-hub-signature-256": sig, "x-github-event": event, "x-github-delivery": delivery}


def judge(body: bytes, headers: dict[str, str], secret: str | None = SECRET):
    return decide(headers, body, secret, TRIGGERS)


# -- the delivery judged -------------------------------------------------------------------


def test_signature_is_the_hmac_of_the_raw_bytes() -> None:
    body = json.dumps(payload()).encode()
    good = signed(body)["x-hub-signature-256"]
    assert signature_ok(SECRET, body, good)
    assert not signature_ok(SECRET, body + b" ", good)  # same JSON, other bytes
    assert not signature_ok("other", body, good)
    assert not signature_ok(SECRET, body, None)
    assert not signature_ok(SECRET, body, good.replace("sha256=", "sha1="))
    assert not signature_ok("", body, good)


def test_a_labeled_delivery_runs_the_suite_that_declares_repo_and_label() -> None:
    body = json.dumps(payload()).encode()
    d = judge(body, signed(body))
    assert d.status == 202 and [t.dag_id for t in d.runs] == ["pr_smoke"]
    assert d.pull_request.head_sha == HEAD and d.pull_request.number == 7
    assert not d.needs_vouch and d.delivery_id == "d-1"
    assert run_id_for(7, HEAD) == f"pr-7-{HEAD}"
    assert run_id_for(7, HEAD, "compare") == f"pr-7-{HEAD}-compare"


@pytest.mark.parametrize(
    ("name", "make", "status", "says"),
    [
        ("no secret", lambda b: (b, signed(b), None), 403, "no webhook secret"),
        ("unsigned", lambda b: (b, {"x-github-event": "pull_request", "x-github-delivery": "x"}, SECRET), 401, "Signature"),
        ("bad signature", lambda b: (b, signed(b, secret="guess"), SECRET), 401, "Signature"),
        ("too big", lambda b: (b + b" " * MAX_BODY, signed(b + b" " * MAX_BODY), SECRET), 413, "at most"),
        ("no delivery id", lambda b: (b, {**signed(b), "x-github-delivery": ""}, SECRET), 400, "X-GitHub-Delivery"),
        ("not JSON", lambda b: (b"{nope", signed(b"{nope"), SECRET), 400, "not JSON"),
        ("JSON list", lambda b: (b"[1]", signed(b"[1]"), SECRET), 400, "JSON object"),
        ("other event", lambda b: (b, signed(b, event="issues"), SECRET), 422, "pull_request"),
    ],
)  # fmt: skip
def test_refusals_start_nothing(name: str, make: Any, status: int, says: str) -> None:
    body, headers, secret = make(json.dumps(payload()).encode())

    def suites_never_read() -> list[SuiteTrigger]:
        raise AssertionError("a refused delivery must not cost a read of the suites")

    d = decide(headers, body, secret, suites_never_read)
    assert (d.status, d.runs) == (status, ()), (name, d)
    assert says in d.detail, (name, d.detail)


@pytest.mark.parametrize(
    ("p", "status", "says"),
    [
        (payload(repo="evil/repo"), 422, "no suite declares it"),
        (payload(label="lgtm"), 422, "labels: run-tpu-tests"),
        (payload("synchronize", label=None, labels=("bug",)), 200, "no suite's label"),
        (payload("opened", label=None), 200, "nothing to run"),
        (payload("closed", label=None, labels=()), 200, "no suite's label"),
        (payload(head="not-a-sha"), 400, "without number"),
        (payload(number=0), 400, "without number"),
    ],
)
def test_what_no_suite_declares_starts_nothing(p: dict[str, Any], status: int, says: str) -> None:
    body = json.dumps(p).encode()
    d = judge(body, signed(body))
    assert d.status == status and d.runs == () and says in d.detail, d


def test_a_push_to_a_labelled_pull_request_runs_and_a_fork_needs_a_vouch() -> None:
    body = json.dumps(payload("synchronize", label=None)).encode()
    d = judge(body, signed(body))
    assert d.status == 202 and [t.dag_id for t in d.runs] == ["pr_smoke"] and not d.needs_vouch
    fork = json.dumps(payload(head_repo="stranger/trainer", sender="stranger")).encode()
    d = judge(fork, signed(fork))
    assert d.status == 202 and d.needs_vouch and d.pull_request.fork
    assert judge(b"{}", signed(b"{}", event="ping")).status == 200
    closed = json.dumps(payload("closed", label=None)).encode()
    d = judge(closed, signed(closed))  # its runs still going are cancelled
    assert (d.status, d.detail, [t.dag_id for t in d.runs]) == (202, "closed", ["pr_smoke"])


# -- the suite's github block ------------------------------------------------------------------

SUITE = """
description: d
owners: [a]
schedule: null
runtime_version: RV
axes: {model: [small]}
machines: {cpu: {backend: local}}
machine: cpu
params:
  git_ref: {type: string, default: main}
  n: {type: integer, default: 1}
github: GITHUB
workload: {run: [echo, hi]}
checks: [{type: log_contains, pattern: hi}]
"""


def _suite(tmp_path: Path, github: str, rv: str = "${params.git_ref}") -> Any:
    p = tmp_path / "s.yaml"
    p.write_text(SUITE.replace("GITHUB", github).replace("RV", rv))
    return load_suite(p)


def test_the_github_block_is_validated_with_file_field_and_allowed_values(tmp_path: Path) -> None:
    s = _suite(tmp_path, "{repo: acme/trainer, label: run-tpu-tests, compare: true}")
    assert s.github.ref_param == "git_ref" and s.github.conn_id == "github_default"
    for block, says in [
        ("{repo: not a repo, label: x}", "github.repo"),
        ("{repo: acme/trainer}", "github.label"),
        ("{repo: acme/trainer, label: x, ref_param: n}", "string params: git_ref"),
        ("{repo: acme/trainer, label: x, ref_param: nope}", "github.ref_param"),
        ("{repo: acme/trainer, label: x, when: always}", "when"),
        ("{repo: acme/trainer, label: x, params: {tier: cpu}}", "not params of the suite"),
        ("{repo: acme/trainer, label: x, params: {git_ref: v1}}", "gets the head sha"),
    ]:
        with pytest.raises(SuiteError) as e:
            _suite(tmp_path, block)
        assert says in str(e.value) and "s.yaml" in str(e.value), (block, str(e.value))
    with pytest.raises(SuiteError, match=r"runtime_version must be '\$\{params.git_ref\}'"):
        _suite(tmp_path, "{repo: acme/trainer, label: x, compare: true}", rv="nightly")


# -- the store ---------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    s.ensure_schema()
    yield s
    s.close()


def _pr_run(kind: str = "verdict", run_id: str | None = None, head: str = HEAD) -> PullRequestRun:
    return PullRequestRun(
        dag_id="pr_smoke", run_id=run_id or run_id_for(7, head, kind), kind=kind, repo=REPO,
        number=7, head_sha=head, base_ref="main", base_sha=BASE, sender="maintainer", fork=False,
    )  # fmt: skip


def test_deliveries_and_pull_request_runs_are_remembered_once(store: ResultsStore) -> None:
    assert store.record_delivery("d-1", "pull_request")
    assert not store.record_delivery("d-1", "pull_request")  # a replay
    store.forget_delivery("d-1")
    assert store.record_delivery("d-1", "pull_request")  # forgotten: may be redelivered
    assert store.add_pull_request_run(_pr_run())
    assert not store.add_pull_request_run(_pr_run())
    assert store.pull_request_run("pr_smoke", run_id_for(7, HEAD)).head_sha == HEAD
    assert store.pull_request_run("pr_smoke", "manual__x") is None
    with pytest.raises(ValueError, match="allowed verdict, compare"):
        store.add_pull_request_run(_pr_run("bisect", run_id="x"))


# -- the report back -------------------------------------------------------------------------


def _plant_run(store: ResultsStore, run_id: str, state: str, cells: dict[str, str]) -> None:
    store.upsert_run("pr_smoke", run_id, suite="pr_smoke", state=state)
    for cid, cstate in cells.items():
        store.upsert_cell("pr_smoke", run_id, cid, state=cstate, message=f"{cid} {cstate}")


def _compare_json(tmp_path: Path, run_id: str, change: float, worse: bool | None) -> None:
    d = tmp_path / "artifacts" / "pr_smoke" / run_id
    d.mkdir(parents=True, exist_ok=True)
    c = {"median_base": 1.0, "median_head": 1 + change, "change": change,
         "ci_low": change - 0.01, "ci_high": change + 0.01, "pairs": 10}  # fmt: skip
    verdict = "different" if worse is not None else "same"
    (d / "compare.json").write_text(
        json.dumps(
            {
                "results": [
                    {
                        "cell_id": "model=small",
                        "metric": "step_time",
                        "verdict": verdict,
                        "worse": worse,
                        "comparison": c,
                    }
                ],
                "problems": [],
            }
        )  # fmt: skip
    )


@pytest.fixture
def github(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeGithub:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setattr(report, "BACKOFF_S", 0.01)
    with FakeGithub() as fake:
        monkeypatch.setenv("AIRFLOW_CONN_GITHUB_FAKE", fake.conn_uri_json())
        yield fake


def _report(store: ResultsStore, run_id: str) -> report.Report:
    return report.report_run(
        store, "pr_smoke", run_id, context="accelmatrix/pr_smoke", conn_id="github_fake"
    )


def test_the_report_says_safe_to_merge_only_when_cells_passed_and_nothing_is_slower(
    store: ResultsStore, github: FakeGithub, tmp_path: Path
) -> None:
    verdict, compare = _pr_run(), _pr_run("compare")
    store.add_pull_request_run(verdict)
    store.add_pull_request_run(compare)
    _plant_run(store, verdict.run_id, "passed", {"model=small": "passed"})
    # The compare run still going: pending, and the comment says what is awaited.
    r = _report(store, verdict.run_id)
    assert r.state == "pending" and "perf comparison" in r.description
    _compare_json(tmp_path, compare.run_id, 0.004, None)
    _plant_run(store, compare.run_id, "passed", {})
    r = _report(store, compare.run_id)
    assert r.state == "success" and "Safe to merge" in r.body and "+0.40%" in r.body
    # A slower head: not safe, whatever the cells say.
    _compare_json(tmp_path, compare.run_id, 0.06, True)
    r = _report(store, compare.run_id)
    assert r.state == "failure" and "**slower**" in r.body and "Safe to merge" not in r.body
    # One comment, edited in place; the statuses in order.
    assert len(github.comments_on(7)) == 1 and "**slower**" in github.comments_on(7)[0]
    assert [s["state"] for s in github.statuses_of(HEAD)] == ["pending", "success", "failure"]
    assert {s["context"] for s in github.statuses_of(HEAD)} == {"accelmatrix/pr_smoke"}


def test_a_failed_check_is_reported_with_expected_and_observed(
    store: ResultsStore, github: FakeGithub
) -> None:
    run = _pr_run()
    store.add_pull_request_run(run)
    _plant_run(store, run.run_id, "failed", {"model=small": "failed", "model=large": "passed"})
    store.replace_checks("pr_smoke", run.run_id, "model=small", [
        verdict("loss_below", False, type="metric_threshold",
                expected="loss <= 0.5", observed="loss = 3.2 | nan"),
    ])  # fmt: skip
    r = _report(store, run.run_id)
    assert r.state == "failure" and "Not safe to merge" in r.body
    assert "loss <= 0.5" in r.body and "loss = 3.2 \\| nan" in r.body  # a pipe escaped
    assert r.body.index("model=small") < r.body.index("model=large")  # the failure first


def test_a_github_outage_is_logged_once_with_the_command_and_never_raises(
    store: ResultsStore, github: FakeGithub, caplog: pytest.LogCaptureFixture
) -> None:
    run = _pr_run()
    store.add_pull_request_run(run)
    _plant_run(store, run.run_id, "passed", {"model=small": "passed"})
    github.down = True
    with caplog.at_level(logging.ERROR, logger="accelmatrix.lifecycle"):
        r = _report(store, run.run_id)
    assert r.state == "success"
    errors = [m for m in caplog.messages if "not updated" in m]
    assert len(errors) == 1 and report.repost_command("pr_smoke", run.run_id) in errors[0]
    github.down = False
    _report(store, run.run_id)  # the command's effect: posted once GitHub is back
    assert len(github.comments_on(7)) == 1
    assert PullRequestHook("github_fake").permission(REPO, "nobody") == "none"
