"""Pull requests, without Airflow: a delivery judged (signature, size, replay, event,
repository, label, fork, freshness against the pull request as GitHub has it), the suite's
``github`` block validated, the store's deliveries, action keys and pull request runs, and
the report back (a verdict for every case, the bot's own comment, fork text escaped)
against a fake GitHub API on loopback, outage included. The whole loop on a real Airflow is
tests/test_github_webhook_server.py."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGithub

from accelmatrix.hooks import github as github_hook
from accelmatrix.hooks.github import PullRequestHook, PullRequestState
from accelmatrix.notifications import pull_request as report
from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.ui import github_webhook
from accelmatrix.ui.github_delivery import (
    MAX_BODY,
    SuiteTrigger,
    action_key,
    decide,
    run_id_for,
    signature_ok,
    stale,
)
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
    ("name", "headers", "body", "status"),
    [
        ("unsigned", {"x-github-event": "pull_request", "x-github-delivery": "x"}, b"{}", 401),
        ("not a signature", {"x-hub-signature-256": "sha256=guess", "x-github-delivery": "x"}, b"{}", 401),
        ("too big", {"x-hub-signature-256": "sha256=" + "0" * 64}, b" " * (MAX_BODY + 1), 413),
        ("no delivery id", {"x-hub-signature-256": "sha256=" + "0" * 64}, b"{}", 400),
    ],
)  # fmt: skip
def test_cheap_checks_come_before_any_read_of_the_secret(
    name: str, headers: dict[str, str], body: bytes, status: int
) -> None:
    """Measured on 1a86892: the secret was read from the metadata database first, for every
    anonymous request."""

    def secret_never_read() -> str:
        raise AssertionError(f"{name}: the secret was read before the cheap checks")

    assert decide(headers, body, secret_never_read, TRIGGERS).status == status


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
    assert "loss &lt;= 0\\.5" in r.body and "loss = 3\\.2 \\| nan" in r.body  # a pipe escaped
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


# -- replays: the delivery against the pull request as GitHub has it now ---------------------


def _now(head: str = HEAD, state: str = "open", labels: tuple[str, ...] = ("run-tpu-tests",)):
    return PullRequestState(number=7, state=state, head_sha=head, labels=labels)


def _delivered(action: str = "labeled", **kw: Any):
    body = json.dumps(payload(action, **kw)).encode()
    return judge(body, signed(body)).pull_request


def test_a_replayed_body_acts_only_while_it_describes_the_pull_request() -> None:
    """Measured on 1a86892: a captured signed body resent under a new delivery id was
    accepted whatever the pull request had become since."""
    label = "run-tpu-tests"
    labeled = _delivered()
    assert stale(labeled, _now(), label) is None  # current: acts
    assert "not the head" in stale(labeled, _now(head="c" * 40), label)  # pushed since
    assert "no longer carries" in stale(labeled, _now(labels=("bug",)), label)  # unlabelled
    assert "closed now" in stale(labeled, _now(state="closed"), label)
    old_push = _delivered("synchronize", label=None)
    assert "not the head" in stale(old_push, _now(head="c" * 40), label)
    closed = _delivered("closed", label=None)
    assert stale(closed, _now(state="closed"), label) is None
    assert "open now" in stale(closed, _now(), label)  # a closed replayed after a reopen
    # The same action asked twice is one key; another head, action or label another.
    assert action_key("pull_request", labeled, label) == action_key(
        "pull_request", _delivered(), label
    )
    keys = {
        action_key("pull_request", labeled, label),
        action_key("pull_request", _delivered(head="c" * 40), label),
        action_key("pull_request", old_push, label),
        action_key("pull_request", labeled, "perf"),
    }
    assert len(keys) == 4


def test_an_old_head_never_cancels_a_newer_one() -> None:
    """Measured on 1a86892: ``_cancel_older(keep_sha=<old sha>)`` cancelled every other
    head's runs, the newer head's included."""
    a, b, c = "a" * 40, "b" * 40, "c" * 40
    runs = [_pr_run(head=a), _pr_run("compare", head=a), _pr_run(head=b), _pr_run(head=c)]
    ids = [r.run_id for r in runs]
    assert github_webhook.older_runs(runs, c) == ids[:3]  # the newest head: all before it
    assert github_webhook.older_runs(runs, b) == ids[:2]  # b: never c's run
    assert github_webhook.older_runs(runs, a) == []
    assert github_webhook.older_runs(runs, "d" * 40) == []  # no run of it: nothing
    assert github_webhook.older_runs(runs, None) == ids  # closed: every run


def test_action_keys_are_taken_once_and_deliveries_pruned_after_the_retention(
    store: ResultsStore,
) -> None:
    from datetime import UTC, datetime, timedelta

    from accelmatrix.results.pull_requests import DELIVERY_RETENTION_DAYS

    key = action_key("pull_request", _delivered(), "run-tpu-tests")
    assert store.claim_action(key) and not store.claim_action(key)
    store.release_action(key)  # GitHub failed: may be asked again
    assert store.claim_action(key)
    assert store.record_delivery("d-old", "pull_request")
    now = datetime.now(UTC)
    assert store.prune_deliveries(now + timedelta(days=DELIVERY_RETENTION_DAYS - 1)) == 0
    assert not store.record_delivery("d-old", "pull_request")  # still refused as a replay
    assert store.prune_deliveries(now + timedelta(days=DELIVERY_RETENTION_DAYS + 1)) == 2
    assert store.record_delivery("d-old", "pull_request") and store.claim_action(key)
    with pytest.raises(ValueError, match="at least 1"):
        store.prune_deliveries(now, days=0)


# -- a verdict for every case ------------------------------------------------------------------


def _compare_rows(tmp_path: Path, run_id: str, rows: list[dict[str, Any]], problems=()) -> None:
    d = tmp_path / "artifacts" / "pr_smoke" / run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "compare.json").write_text(json.dumps({"results": rows, "problems": list(problems)}))


def _row(change: float, lo: float, hi: float, v: str, worse: bool | None) -> dict[str, Any]:
    return {
        "cell_id": "model=small", "metric": "step_time", "verdict": v, "worse": worse,
        "comparison": {"median_base": 1.0, "median_head": 1 + change, "change": change,
                       "ci_low": lo, "ci_high": hi, "pairs": 10},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("case", "compare_state", "rows", "problems", "says"),
    [
        ("compare run failed, no rows", "failed", None, None, "failed before it compared"),
        ("+9 % in [-4 %, +25 %], unknown", "passed", [_row(0.09, -0.04, 0.25, "unknown", None)], [], "unknown"),
        ("measured nothing", "passed", [], ["model=small: no pair of samples of step_time"], "no pair"),
        ("one cell not measured", "passed", [_row(0.0, -0.01, 0.01, "same", None)], ["model=large: exit 1"], "model=large"),
        ("no comparison written", "passed", None, None, "wrote no comparison"),
        ("over budget", "over_budget", None, None, "over budget"),
    ],
)  # fmt: skip
def test_no_safe_to_merge_without_a_decided_comparison(
    store: ResultsStore, github: FakeGithub, tmp_path: Path,
    case: str, compare_state: str, rows: Any, problems: Any, says: str,
) -> None:  # fmt: skip
    """Measured on 1a86892: a failed compare run and an undecided +9 % were both "success,
    Safe to merge"."""
    verdict_run, compare = _pr_run(), _pr_run("compare")
    store.add_pull_request_run(verdict_run)
    store.add_pull_request_run(compare)
    _plant_run(store, verdict_run.run_id, "passed", {"model=small": "passed"})
    _plant_run(store, compare.run_id, compare_state, {})
    if rows is not None:
        _compare_rows(tmp_path, compare.run_id, rows, problems)
    runs = [store.pull_request_run("pr_smoke", x.run_id) for x in (verdict_run, compare)]
    r = report.build_report(store, runs[1], runs, compare_asked=True)
    assert r.state == "error", (case, r.state, r.description)
    assert "Safe to merge" not in r.body and "Perf not decided" in r.body, (case, r.body)
    assert r.description.startswith("pr_smoke: perf not decided: "), r.description
    assert report.md_text(says, 200).split("\\")[0] in r.body, (case, r.body)
    assert "--pairs" in r.body  # what to do
    if case.startswith("compare run failed"):  # posted as GitHub's "error" state
        _report(store, compare.run_id)
        (status,) = github.statuses_of(HEAD)
        assert status["state"] == "error" and len(status["description"]) <= 140


def test_a_suite_asking_for_a_comparison_is_not_green_without_one(
    store: ResultsStore, tmp_path: Path
) -> None:
    run = _pr_run()
    store.add_pull_request_run(run)
    _plant_run(store, run.run_id, "passed", {"model=small": "passed"})
    pr = store.pull_request_run("pr_smoke", run.run_id)
    asked = report.build_report(store, pr, [pr], compare_asked=True)
    assert asked.state == "error" and "no comparison was started" in asked.body
    assert report.build_report(store, pr, [pr]).state == "success"


def test_slower_wins_over_undecided_and_decided_rows_are_green(
    store: ResultsStore, github: FakeGithub, tmp_path: Path
) -> None:
    verdict_run, compare = _pr_run(), _pr_run("compare")
    for r in (verdict_run, compare):
        store.add_pull_request_run(r)
    _plant_run(store, verdict_run.run_id, "passed", {"model=small": "passed"})
    _plant_run(store, compare.run_id, "passed", {})
    runs = [store.pull_request_run("pr_smoke", x.run_id) for x in (verdict_run, compare)]
    faster = _row(-0.1, -0.12, -0.08, "different", False)
    _compare_rows(tmp_path, compare.run_id, [faster, _row(0.0, -0.01, 0.01, "same", None)])
    assert report.build_report(store, runs[0], runs).state == "success"
    slower = _row(0.2, 0.18, 0.22, "different", True)
    _compare_rows(tmp_path, compare.run_id, [slower, _row(0.09, -0.04, 0.25, "unknown", None)])
    assert report.build_report(store, runs[0], runs).state == "failure"


# -- the bot's own comment ---------------------------------------------------------------------


def test_a_marker_in_someone_elses_comment_is_ignored(
    store: ResultsStore, github: FakeGithub
) -> None:
    """Measured on 1a86892: the bot PATCHed the first comment holding its marker, whoever
    wrote it (GitHub refused: the report was never posted again)."""
    github_hook._logins.clear()
    fake = github.add_comment(7, "lgtm " + report.comment_marker("pr_smoke"), user="stranger")
    refusal = github.add_comment(7, report.refusal_marker("pr_smoke"), user="stranger")
    run = _pr_run()
    store.add_pull_request_run(run)
    _plant_run(store, run.run_id, "passed", {"model=small": "passed"})
    r = _report(store, run.run_id)
    assert r.state == "success"
    (mine,) = github.comments_on(7)
    assert "Safe to merge" in mine
    assert github.comments[fake]["body"].startswith("lgtm")  # untouched
    hook = PullRequestHook("github_fake")
    hook.upsert_comment(REPO, 7, marker=report.refusal_marker("pr_smoke"), body="refused")
    assert github.comments[refusal]["body"] == report.refusal_marker("pr_smoke")
    assert len(github.comments_on(7)) == 2  # the report and the bot's own refusal
    # The second report edits the bot's comment; the login was read once.
    _report(store, run.run_id)
    assert len(github.comments_on(7)) == 2
    assert github.calls_to("PATCH", rf"/repos/acme/trainer/issues/comments/{fake}") == 0
    assert github.calls_to("GET", r"/user") == 1


# -- fork text as text -------------------------------------------------------------------------

HOSTILE = (
    "[win](https://evil.example/x) ![px](https://evil.example/p.png) <img src=x onerror=alert(1)>"
    " <a href='https://evil.example'>hi</a> @octocat @acme/admins #1 acme/trainer#2 "
    "www.evil.example https://evil.example `code` | *bold* &lt;b&gt;" + " pad" * 500
)


def test_fork_text_reaches_the_comment_as_text(store: ResultsStore, github: FakeGithub) -> None:
    """Measured on 1a86892: only ``|`` was escaped: a fork's output made links, images and
    @mentions in the bot's comment; the base ref sat unescaped in backticks."""
    markdown_it = pytest.importorskip("markdown_it")
    run = _pr_run()
    store.add_pull_request_run(run)
    _plant_run(store, run.run_id, "failed", {"model=small": "failed"})
    store.upsert_cell("pr_smoke", run.run_id, "model=small", state="failed", message=HOSTILE)
    store.replace_checks("pr_smoke", run.run_id, "model=small", [
        verdict("loss_below", False, type="metric_threshold", expected=HOSTILE, observed=HOSTILE),
    ])  # fmt: skip
    r = _report(store, run.run_id)
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(r.body)
    # No tag of the fork's: the only links are the report's own two, the only code span and
    # emphasis the report's.
    assert not re.search(r"<[^>]*evil", html), html[:3000]
    assert html.count("<a ") == 2 and html.count("<code>") == 1, html[:3000]
    # (the header, "Cells" and "Failed checks")
    assert html.count("<strong>") == 3 and "<em>" not in html and "<img" not in html
    assert "&lt;img src=x onerror" in html  # shown as text
    # GitHub's own autolinks and mentions: broken by a zero-width space after the trigger.
    fork_lines = [line for line in r.body.splitlines() if "evil" in line]
    assert len(fork_lines) == 2  # the cell's message and the failed check
    for trigger in ("@octocat", "@acme", "#1", "#2", "www.", "://"):
        assert not any(trigger in line for line in fork_lines), trigger
    assert "@\u200boctocat" in r.body and "evil\\.example" in r.body
    # Capped: each cell, and the comment.
    assert max(len(line) for line in r.body.splitlines()) < 2500
    assert len(r.body) < 20_000
    # The base ref is the pull request's: escaped too.
    pr = store.pull_request_run("pr_smoke", run.run_id)
    from dataclasses import replace

    section = report._perf_section(
        replace(pr, base_ref="x`](https://evil)"), [], report.PerfVerdict(False)
    )
    assert "`" not in section[0].replace("\\`", "") and "](" not in section[0].replace("\\]\\(", "")


def test_a_delivery_whose_work_failed_on_github_can_be_redelivered(
    store: ResultsStore, github: FakeGithub
) -> None:
    """Measured on 1a86892: a fork refused because GitHub answered the permission check
    with an error stayed recorded; GitHub's "Redeliver" got 409."""
    from accelmatrix.hooks.github import GithubError

    github.permissions["maintainer"] = "write"
    github.set_pull(7, HEAD, labels=("run-tpu-tests",))
    github.failing = r".*/collaborators/.*"
    body = json.dumps(payload(head_repo="stranger/trainer")).encode()
    d = judge(body, signed(body, delivery="d-9"))
    assert d.needs_vouch and store.record_delivery("d-9", "pull_request")
    with pytest.raises(GithubError):
        github_webhook.carry_out(d, store)
    assert store.record_delivery("d-9", "pull_request")  # forgotten: "Redeliver" acts
    assert store.claim_action(action_key("pull_request", d.pull_request, "run-tpu-tests"))
    assert github.comments_on(7) == []  # no refusal for what was not refused


# -- the webhook's secret under a metadata database outage --------------------------------------


def test_a_secret_lookup_error_is_a_503_not_a_403(
    monkeypatch: pytest.MonkeyPatch, store: ResultsStore
) -> None:
    """Measured on 1a86892: Airflow's connection lookup swallows a backend's error and says
    "not defined": a legitimate delivery got 403 "no webhook secret configured" while the
    metadata database restarted."""
    import airflow.configuration
    from airflow.secrets import BaseSecretsBackend
    from sqlalchemy.exc import OperationalError

    class RestartingDatabase(BaseSecretsBackend):
        """The metastore backend while the database restarts: its query fails."""

        def get_conn_value(self, conn_id: str, team_name: str | None = None) -> str | None:
            raise OperationalError("SELECT connection", {}, Exception("connection refused"))

        def get_connection(self, conn_id: str, team_name: str | None = None):
            return self.get_conn_value(conn_id)

    backends = [RestartingDatabase()]
    monkeypatch.setattr(airflow.configuration, "ensure_secrets_loaded", lambda *a, **k: backends)
    monkeypatch.setattr(github_webhook, "_secret_cache", None)
    monkeypatch.delenv("AIRFLOW_CONN_ACCELMATRIX_WEBHOOK", raising=False)
    body = json.dumps(payload()).encode()
    out = github_webhook.handle(signed(body), body, store)
    assert out.status == 503 and "redeliver" in out.detail, out
    assert store.record_delivery("d-1", "pull_request")  # nothing recorded: redeliverable
    # No backend has it and none failed: 403. Then the secret, cached.
    backends[:] = []
    assert github_webhook.handle(signed(body), body, store).status == 403
    from airflow.secrets.environment_variables import EnvironmentVariablesBackend

    monkeypatch.setenv(
        "AIRFLOW_CONN_ACCELMATRIX_GITHUB_WEBHOOK",
        json.dumps({"conn_type": "generic", "password": SECRET}),
    )
    backends[:] = [EnvironmentVariablesBackend()]
    monkeypatch.setattr(github_webhook, "_secret_cache", None)
    assert github_webhook.webhook_secret() == SECRET
    backends[:] = [RestartingDatabase()]
    assert github_webhook.webhook_secret() == SECRET  # cached: the outage is not even seen
