"""Suite 4, tiered_ci: JUnit results, elapsed-time warnings, webhook notification, cost.

Unit tests drive the JUnit parser and source, the ``junit`` and ``elapsed_regression``
checks (through the real ``evaluate_cell``), the notifier (against a real HTTP receiver on
127.0.0.1 that the test starts and stops), pricing and tier selection. The integration test
runs the suite with ``dag.test()`` on a real git repository made from
include/workloads/ci_sample: the broken tag fails with the failed tests named, the elapsed
time warns without failing the cell, the webhook receives the run link and the failed tests,
and the run's cost lands in the results store.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from test_dag_local import run_dag, store

from accelmatrix.evaluation import CellOutputs, evaluate_cell
from accelmatrix.metrics.junit import JunitError, parse_junit
from accelmatrix.metrics.sources import collect_metrics, parse_metric_sources
from accelmatrix.notifications.transport import (
    NotifyError,
    build_payload,
    post_json,
    run_url,
    webhook_target,
)
from accelmatrix.pricing import PricingError, hourly_price
from accelmatrix.reports.text_table import run_table
from accelmatrix.spec.checks import parse_checks
from accelmatrix.spec.loader import SuiteError, load_suite
from accelmatrix.spec.plan import expand

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "include"
SUITE = INCLUDE / "suites" / "tiered_ci.yaml"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
  <testcase classname="tests.test_stats" name="test_mean" time="0.5"/>
  <testcase classname="tests.test_stats" name="test_median" time="0.25">
    <failure message="assert 1.0 == 2&#10;second line">Traceback...</failure>
  </testcase>
  <testcase classname="tests.test_io" name="test_read"><error message="OSError: boom"/></testcase>
  <testcase classname="tests.test_dev" name="test_tpu"><skipped message="no tpu"/></testcase>
  <testcase classname="tests.test_stats" name="test_window"/>
</testsuite></testsuites>
"""


def _files(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "files"
    for rel, text in files.items():
        (d / "out" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "out" / rel).write_text(text)
    d.mkdir(exist_ok=True)
    return d


# -- JUnit --------------------------------------------------------------------------------
def test_parse_junit_counts_and_names(tmp_path):
    r = parse_junit(_files(tmp_path, **{"j.xml": JUNIT}) / "out" / "j.xml")
    assert (r.passed, r.failed, r.errored, r.skipped, r.total) == (2, 1, 1, 1, 5)
    assert r.seconds == 0.75
    assert [str(f) for f in r.failures] == [
        "tests.test_stats::test_median (failure: assert 1.0 == 2)",
        "tests.test_io::test_read (error: OSError: boom)",
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<testsuites><testcase", "malformed XML"),
        ("<html/>", "not JUnit XML"),
        ('<!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites/>', "document type declarations"),
    ],
)
def test_parse_junit_rejects_bad_files(tmp_path, text, error):
    with pytest.raises(JunitError, match=error):
        parse_junit(_files(tmp_path, **{"j.xml": text}) / "out" / "j.xml")


def test_junit_xml_metric_source(tmp_path):
    files = _files(tmp_path, **{"junit-a.xml": JUNIT, "junit-b.xml": JUNIT})
    sources = parse_metric_sources(
        [
            {"type": "junit_xml", "glob": "out/junit-*.xml", "prefix": "unit_"},
            {"type": "junit_xml", "glob": "out/none-*.xml"},
        ]
    )
    got = collect_metrics(sources, files_dir=files, log_path=None)
    values = {r["name"]: r["value"] for r in got.rows}
    assert values == {
        "unit_tests_passed": 4.0,
        "unit_tests_failed": 2.0,
        "unit_tests_errored": 2.0,
        "unit_tests_skipped": 2.0,
        "unit_tests_total": 10.0,
        "unit_tests_seconds": 1.5,
    }
    assert any("no file matches 'out/none-*.xml'" in d for d in got.diagnostics)
    with pytest.raises(ValueError, match="relative to the collected files dir"):
        parse_metric_sources([{"type": "junit_xml", "glob": "../etc/*.xml"}])


def _evaluate(tmp_path, checks, files, metrics=(), include=INCLUDE):
    outputs = CellOutputs(files, tmp_path / "output.log", {"exit_code": 0}, list(metrics))
    return evaluate_cell(parse_checks(checks), outputs, include_dir=include)


def test_junit_check_names_the_failed_tests(tmp_path):
    files = _files(tmp_path, **{"junit-tests.xml": JUNIT})
    report = _evaluate(tmp_path, [{"name": "tests", "type": "junit", "glob": "out/*.xml"}], files)
    (v,) = report.verdicts
    assert not v.passed and not report.passed
    assert v.observed == "2 passed, 1 failed, 1 errored, 1 skipped (1 file(s))"
    assert "tests.test_stats::test_median (failure: assert 1.0 == 2)" in v.message
    assert "tests.test_io::test_read (error: OSError: boom)" in v.message
    assert "second line" not in v.message


def test_junit_check_fails_without_a_report_and_passes_a_clean_one(tmp_path):
    empty = _evaluate(tmp_path, [{"type": "junit", "glob": "out/*.xml"}], _files(tmp_path))
    assert not empty.passed and "no readable JUnit report" in empty.verdicts[0].message
    clean = JUNIT.split('<testcase classname="tests.test_stats" name="test_median"')[0]
    files = _files(tmp_path / "c", **{"j.xml": clean + "</testsuite></testsuites>"})
    ok = _evaluate(tmp_path, [{"type": "junit", "glob": "out/*.xml", "min_passed": 1}], files)
    assert ok.passed, ok.format_table()
    strict = _evaluate(tmp_path, [{"type": "junit", "glob": "out/*.xml", "min_passed": 5}], files)
    assert "only 1 passed, need at least 5" in strict.verdicts[0].message


def _baseline(tmp_path: Path, seconds: float) -> Path:
    inc = tmp_path / "include"
    (inc / "baselines").mkdir(parents=True)
    (inc / "baselines" / "b.yaml").write_text(
        yaml.safe_dump({"baselines": {"cpu": {"elapsed_seconds": seconds}}})
    )
    return inc


def test_elapsed_regression_warns_without_failing_the_cell(tmp_path):
    check = {
        "name": "elapsed",
        "type": "elapsed_regression",
        "severity": "warning",
        "baseline_file": "baselines/b.yaml",
        "baseline_key": "cpu",
    }
    slow = [{"name": "elapsed_seconds", "value": 130.0, "step": None}]
    report = _evaluate(tmp_path, [check], _files(tmp_path), slow, _baseline(tmp_path, 100.0))
    (v,) = report.verdicts
    assert report.passed and v.passed and v.warning
    assert v.message.startswith("WARNING: elapsed-time regression: elapsed_seconds 130.0 s")
    assert "1.3 x the baseline 100.0 s" in v.message
    table = report.format_table()
    assert "WARN    elapsed" in table and "WARN elapsed: WARNING" in table

    fast = [{"name": "elapsed_seconds", "value": 110.0, "step": None}]
    ok = _evaluate(tmp_path, [check], _files(tmp_path), fast, tmp_path / "include")
    assert ok.passed and not ok.verdicts[0].warning
    # As an error (the default severity) the same regression fails the cell.
    err = {**check, "severity": "error"}
    failed = _evaluate(tmp_path, [err], _files(tmp_path), slow, tmp_path / "include")
    assert not failed.passed
    missing = {**check, "baseline_key": "gpu"}
    v = _evaluate(tmp_path, [missing], _files(tmp_path), slow, tmp_path / "include").verdicts[0]
    assert "baseline 'gpu' not found" in v.message and "available: cpu" in v.message


# -- notifier -------------------------------------------------------------------------------
class Receiver:
    """A real HTTP endpoint on 127.0.0.1 recording every POST; stopped by the test."""

    def __init__(self, status: int = 200) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _conn(port: int, **extra: object) -> str:
    return json.dumps(
        {"conn_type": "http", "host": "127.0.0.1", "port": port, "schema": "http", **extra}
    )


def test_webhook_posts_json_with_a_bearer_token_from_the_connection(monkeypatch):
    with Receiver() as rx:
        monkeypatch.setenv(
            "AIRFLOW_CONN_CI_HOOK",
            _conn(rx.port, password="s3cret", extra={"endpoint": "/hooks/ci"}),
        )
        url, headers = webhook_target("ci_hook")
        assert url == f"http://127.0.0.1:{rx.port}/hooks/ci"
        payload = build_payload(
            dag_id="tiered_ci",
            run_id="manual__1",
            state="failed",
            failed_cells=[{"cell": "tier=cpu", "state": "failed", "failed_tests": ["a::b"]}],
            base_url="http://airflow.example:8080/",
        )
        assert post_json(url, payload, headers, 5) == 200
    (path, got_headers, body) = rx.received[0]
    assert path == "/hooks/ci" and got_headers["Authorization"] == "Bearer s3cret"
    assert body["run_url"] == "http://airflow.example:8080/dags/tiered_ci/runs/manual__1"
    assert "  - test a::b" in body["text"]


def test_webhook_errors_are_reported():
    with Receiver(status=500) as rx, pytest.raises(NotifyError, match="answered 500"):
        post_json(f"http://127.0.0.1:{rx.port}/", {}, {}, 5)
    with pytest.raises(NotifyError, match="must be http"):
        post_json("file:///etc/passwd", {}, {}, 5)
    assert run_url("d", "manual__2026-01-01T00:00:00+00:00", "http://h").endswith(
        "/dags/d/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    )


# -- pricing, tiers, params ---------------------------------------------------------------
def test_pricing_by_price_key_and_inline(tmp_path, monkeypatch):
    assert hourly_price({"price_key": "tpu-v6e-1-spot"}) == 0.64
    assert hourly_price({"hourly_cost": 1.5}) == 1.5
    with pytest.raises(PricingError, match="price_key 'tpu-v9' is not in .*pricing.yaml"):
        hourly_price({"price_key": "tpu-v9"})
    bad = tmp_path / "pricing.yaml"
    bad.write_text("hourly: {a: cheap}\n")
    monkeypatch.setenv("ACCELMATRIX_PRICING_FILE", str(bad))
    with pytest.raises(PricingError, match="hourly.a"):
        hourly_price({"price_key": "a"})


def test_tier_param_selects_cells_and_git_ref_is_validated(tmp_path):
    suite = load_suite(SUITE)
    cpu = expand(suite, "tiered_ci", params={"tier": "cpu"})
    assert [c.id for c in cpu.cells] == ["tier=cpu,machine=cpu-small"]
    nightly = expand(suite, "tiered_ci")  # what the cron schedule runs
    assert [c.id for c in nightly.cells] == ["tier=nightly,machine=accel-local"]
    assert suite.schedule == "0 2 * * *" and suite.params["tier"].enum == [
        "cpu",
        "nightly",
        "on-demand",
    ]
    assert "tpu-v6e-1" in suite.machines  # the production accelerator machine validates
    text = SUITE.read_text()
    for broken, error in [
        ("enum: [cpu, nightly, on-demand]", "enum: [cpu, gpu]"),
        ("price_key: local-cpu", "price_key: local-cpu\n    hourly_cost: 1.0"),
        ("default: main", "default: -main"),
    ]:
        f = tmp_path / "tiered_ci.yaml"
        f.write_text(text.replace(broken, error, 1))
        with pytest.raises(SuiteError):
            load_suite(f)


# -- end to end --------------------------------------------------------------------------
def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "ci_sample.git"
    subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, str(INCLUDE / "workloads" / "ci" / "sample_repo.py"), str(repo)],
        check=True,
        capture_output=True,
    )
    return repo


@pytest.mark.integration
@pytest.mark.slow(70)
def test_tiered_ci_broken_ref_end_to_end(airflow_db, accel_home, tmp_path, monkeypatch):
    """The cpu tier at the broken tag: JUnit failure named, elapsed warning, webhook, cost."""
    inc = tmp_path / "include"
    inc.mkdir()
    for name in ("workloads", "suites", "pricing.yaml"):
        (inc / name).symlink_to(INCLUDE / name)
    (inc / "baselines").mkdir()
    (inc / "baselines" / "ci_elapsed.yaml").write_text(  # so small every run is a regression
        yaml.safe_dump({"baselines": {"cpu": {"elapsed_seconds": 0.01}}})
    )
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(inc))
    repo = _repo(tmp_path)
    with Receiver() as rx:
        monkeypatch.setenv("AIRFLOW_CONN_CI_WEBHOOK", _conn(rx.port))
        conf = {"tier": "cpu", "git_ref": "v2-broken", "repo_url": str(repo)}
        state, run_id, tis = run_dag("tiered_ci", conf=conf)
    cid = "tier=cpu,machine=cpu-small"
    s = store()
    assert state == "failed"
    assert tis[("cpu-small.run", cid)] == "success"  # the tools ran: the tests failed
    checks = {c.check_name: c for c in s.get_checks("tiered_ci", run_id, cid)}
    junit = checks["lint and tests"]
    assert not junit.passed
    assert "tests.test_stats::test_median_odd_and_even (failure: assert 1.0 == 2)" in (
        junit.message
    )
    assert "ci_sample/stats::org.ruff.F401" in junit.message  # the lint finding
    elapsed = checks["elapsed vs baseline"]
    assert elapsed.passed and elapsed.message.startswith("WARNING: elapsed-time regression")

    metrics = {m.name: m.value for m in s.get_metrics("tiered_ci", run_id, cid)}
    assert metrics["tests_failed"] == 1 and metrics["tests_passed"] == 4
    assert metrics["lint_tests_failed"] == 1 and metrics["elapsed_seconds"] > 0

    cell = s.get_cell("tiered_ci", run_id, cid)
    assert cell.cost > 0  # resource-held time x the local-cpu price
    assert s.get_run("tiered_ci", run_id).git_ref == "v2-broken"
    assert re.search(r"; cost [0-9.]+ USD", run_table(s, "tiered_ci", run_id))

    (path, _, body) = rx.received[0]
    assert len(rx.received) == 1 and body["state"] == "failed"
    assert body["run_url"].endswith("/dags/tiered_ci/runs/" + quote(run_id, safe=""))
    (failed,) = body["failed_cells"]
    assert failed["cell"] == cid and "lint and tests" in failed["failed_checks"]
    assert (
        "tests.test_stats::test_median_odd_and_even (failure: assert 1.0 == 2)"
        in (failed["failed_tests"])
    )
    assert body["git_ref"] == "v2-broken" and body["cost"] > 0
