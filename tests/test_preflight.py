"""Preflight checks (run for real on this host), the preflight task's place in the DAG,
and the workers_started check."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from accelmatrix.evaluation import CellOutputs
from accelmatrix.evaluation.observe import plan_checks
from accelmatrix.preflight import run_preflight
from accelmatrix.spec.checks import parse_checks
from accelmatrix.spec.preflight_checks import PreflightCheck

ROOT = Path(__file__).resolve().parents[1]


def checks(*raw: dict) -> list:
    return [TypeAdapter(PreflightCheck).validate_python(r) for r in raw]


@pytest.fixture
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_every_check_runs_and_every_failure_says_expected_and_found(http_server, tmp_path):
    report = run_preflight(
        checks(
            {
                "type": "command",
                "argv": ["${python}", "-c", "print('gloo True')"],
                "stdout_contains": "gloo True",
            },
            {
                "type": "command",
                "name": "nodes",
                "argv": [sys.executable, "-c", "print('n1')"],
                "min_lines": 2,
            },
            {"type": "command", "name": "missing cli", "argv": ["no-such-cli-xyz"]},
            {"type": "command", "name": "slow", "argv": ["sleep", "5"], "timeout": 1},
            {"type": "http", "name": "api", "url": f"{http_server}/healthz"},
            {"type": "http", "name": "api down", "url": f"{http_server}/broken"},
            {"type": "http", "name": "nobody", "url": "http://127.0.0.1:9/", "timeout": 2},
            {
                "type": "disk_free",
                "name": "disk",
                "path": str(tmp_path / "not" / "yet"),
                "min_gb": 0.001,
            },
            {"type": "disk_free", "name": "huge", "path": "${params.where}", "min_gb": 1e9},
            {"type": "cpu_count", "name": "cpus", "min": 1},
            {"type": "cpu_count", "name": "many cpus", "min": 4096},
        ),
        {"where": str(tmp_path)},
    )
    by = {r.name: r for r in report.results}
    assert by["command[0]"].passed and by["command[0]"].found.startswith("exit 0, 1 line(s)")
    assert not by["nodes"].passed and by["nodes"].expected.endswith(">= 2 output line(s)")
    assert by["missing cli"].found == "'no-such-cli-xyz' not found"
    assert by["slow"].found == "no answer within 1 s"
    assert by["api"].passed and by["api"].found == "HTTP 200"
    assert not by["api down"].passed and by["api down"].found == "HTTP 503"
    assert by["nobody"].found.startswith("unreachable:")
    assert by["disk"].passed and f"file system of {tmp_path}" in by["disk"].found
    assert not by["huge"].passed and by["huge"].expected == f">= 1e+09 GB free at {tmp_path}"
    assert by["cpus"].passed and not by["many cpus"].passed
    assert not report.passed
    assert [r.name for r in report.failures] == [
        "nodes",
        "missing cli",
        "slow",
        "api down",
        "nobody",
        "huge",
        "many cpus",
    ]
    table = report.table()
    assert table.startswith("Preflight FAILED: 7 of 11 check(s) failed; nothing was provisioned")
    assert "many cpus: expected >= 4096 CPU(s), found" in report.summary()


def test_unknown_placeholder_is_a_failed_check_not_a_crash():
    report = run_preflight(checks({"type": "disk_free", "path": "${params.nope}", "min_gb": 1}), {})
    assert not report.passed and "params.nope" in report.results[0].found


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "http", "url": "file:///etc/passwd"}, "must start with http:// or https://"),
        ({"type": "cpu_count", "min": 0}, "greater than 0"),
        ({"type": "disk_free", "path": "/", "min_gb": 1, "size": 2}, "Extra inputs"),
        ({"type": "kubectl"}, "does not match any of the expected tags"),
        ({"type": "connection", "conn_id": "a b"}, "should match pattern"),
    ],
)
def test_bad_preflight_entries_are_rejected(raw, message):
    with pytest.raises(ValidationError, match=message):
        checks(raw)


def test_preflight_task_sits_between_plan_and_provision():
    from accelmatrix.dag_factory import build_dag

    dag = build_dag(ROOT / "include" / "suites" / "cluster_validation.yaml")
    pre = dag.get_task("preflight")
    assert pre.upstream_task_ids == {"plan"}
    assert "local-node.provision" in pre.downstream_task_ids
    assert "preflight" not in build_dag(ROOT / "include" / "suites" / "local_smoke.yaml").task_ids


LOG = """job: 2 worker(s)
worker 0 started at 1000.500 pid 1
worker 1 started at {t1} pid 2
step 10 loss: 1.0 samples/s/worker: 10
"""


@pytest.mark.parametrize(
    ("t1", "within", "workers", "passed", "failure"),
    [
        ("1001.000", 30, 2, True, None),
        (
            "1045.250",
            30,
            2,
            False,
            "worker 1 started 45.25 s after the job start; the cutoff is 30.0 s",
        ),
        ("1001.000", 30, 3, False, "only 2 of 3 worker(s) logged a start (0, 1)"),
    ],
)
def test_workers_started(tmp_path, t1, within, workers, passed, failure):
    (tmp_path / "output.log").write_text(LOG.format(t1=t1))
    (plan,) = plan_checks(
        parse_checks([{"type": "workers_started", "workers": workers, "within": within}]),
        CellOutputs(
            files_dir=tmp_path,
            log_path=tmp_path / "output.log",
            status={"started_at": 1000.0},
            metrics=[],
        ),
        include_dir=ROOT / "include",
    )
    n = plan.columns["c00_workers_started__workers_started"]
    last = plan.columns["c00_workers_started__last_start_s"]
    ok = n >= workers and last <= within
    assert ok is passed
    if failure:
        assert plan.failure == failure


def test_workers_started_pattern_needs_named_groups():
    with pytest.raises(ValidationError, match=r"named groups \(\?P<worker>"):
        parse_checks(
            [{"type": "workers_started", "workers": 2, "within": 5, "pattern": "w (\\d+)"}]
        )
