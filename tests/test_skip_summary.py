"""A run that skips a test group for a missing server says so at the end, and a run that
requires the servers (`make reliability`) fails instead of skipping.

Found: on a machine without sshd, chromium, postgresql or redis-server, `make test` skipped
every test of those groups in one "N skipped" line and `make reliability` printed "1
skipped" and exited 0. Real pytest runs in a subprocess, with tests/needs.py as a plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CASES = """
from needs import missing

def test_remote():
    missing("ssh", "/usr/sbin/sshd is missing: install the OpenSSH server")

def test_queue():
    missing("celery", "redis-server not found")

def test_plain():
    assert True
"""


def _pytest(tmp_path: Path, cases: str = CASES, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(cases)
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-q", "-p", "needs", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "PYTHONPATH": str(TESTS), **env},
    )


def _env() -> dict[str, str]:
    """This run's environment without CI or ACCELMATRIX_REQUIRE_SERVERS: each case sets its own."""
    return {k: v for k, v in os.environ.items() if k not in ("CI", "ACCELMATRIX_REQUIRE_SERVERS")}


def test_skipped_groups_are_listed_with_why_and_the_fix(tmp_path):
    proc = _pytest(tmp_path, ACCELMATRIX_REQUIRE_SERVERS="0")
    assert proc.returncode == 0, proc.stdout
    out = proc.stdout
    assert "TEST GROUPS SKIPPED: this run did not test everything" in out
    assert "celery: 1 test(s) skipped - CeleryExecutor tests" in out
    assert "ssh: 1 test(s) skipped - SSH backend and TPU-VM tests" in out
    assert "why: [needs ssh] /usr/sbin/sshd is missing" in out
    assert "fix: apt-get install -y openssh-server" in out
    assert "fix: apt-get install -y postgresql redis-server" in out
    # At the end: after every test's output, just before the final count.
    assert out.index("[100%]") < out.index("TEST GROUPS SKIPPED") < out.index("1 passed, 2 skipped")


def test_required_servers_fail_instead_of_skipping(tmp_path):
    proc = _pytest(tmp_path, ACCELMATRIX_REQUIRE_SERVERS="1")
    assert proc.returncode == 1
    assert "2 failed, 1 passed" in proc.stdout
    assert "TEST GROUPS SKIPPED" not in proc.stdout
    assert "[needs ssh] /usr/sbin/sshd is missing" in proc.stdout


def test_a_full_run_with_everything_installed_prints_no_block(tmp_path):
    (tmp_path / "test_cases.py").write_text("def test_ok():\n    assert True\n")
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-q", "-p", "needs", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "PYTHONPATH": str(TESTS), "CI": "true"},
    )
    assert proc.returncode == 0 and "TEST GROUPS SKIPPED" not in proc.stdout


def test_under_ci_a_skipped_group_fails_the_run_with_the_fix(tmp_path):
    """CI=true: the tests still skip (the block groups them with their fix), then exit 1."""
    proc = _pytest(tmp_path, CI="true")
    assert proc.returncode == 1, proc.stdout
    out = proc.stdout
    assert "1 passed, 2 skipped" in out
    assert "fix: apt-get install -y openssh-server" in out
    assert "CI=true: a skipped test fails the run (exit 1)" in out


def test_a_skip_outside_any_group_is_listed_and_fails_ci(tmp_path):
    """A bare pytest.skip (or skipif) names no group: listed as untagged, with its test."""
    cases = (
        "import pytest\n\n"
        "def test_bare():\n    pytest.skip('no frobnicator here')\n\n"
        "@pytest.mark.skipif(True, reason='never on this host')\n"
        "def test_marked():\n    pass\n"
    )
    out = _pytest(tmp_path, cases, CI="false").stdout
    assert "untagged: 2 test(s) skipped - skipped outside any group of tests/needs.py" in out
    assert "test_cases.py::test_bare: Skipped: no frobnicator here" in out
    assert "never on this host" in out
    assert "fix: make the test run, or skip it through needs.missing(group)" in out
    assert _pytest(tmp_path, cases, CI="true").returncode == 1
