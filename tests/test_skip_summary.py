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


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(CASES)
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-q", "-p", "needs", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
    )


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
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    assert proc.returncode == 0 and "TEST GROUPS SKIPPED" not in proc.stdout
