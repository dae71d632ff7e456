"""Skipping a test group for a missing server, loudly, or failing where it is required.

A skip used to be one line among hundreds ("1 skipped", exit 0): a machine without sshd
ran no SSH test at all and looked green. Every such skip goes through ``missing``, which
tags the reason with its group; tests/conftest.py lists the groups skipped at the end of
the run with the command that fixes them. With ``ACCELMATRIX_REQUIRE_SERVERS=1`` (set by
`make reliability`) a missing server fails the test instead.
"""

from __future__ import annotations

import os
import re

import pytest

# group -> (what it tests, the command that installs what it needs)
GROUPS = {
    "ssh": ("SSH backend and TPU-VM tests (loopback sshd)", "apt-get install -y openssh-server"),
    "browser": (
        "matrix page browser tests (headless Chromium)",
        "apt-get install -y chromium chromium-driver",
    ),
    "celery": (
        "CeleryExecutor tests (PostgreSQL and Redis on loopback)",
        "apt-get install -y postgresql redis-server",
    ),
}
TAG = re.compile(r"^\[needs (\w+)\] ")


def missing(group: str, reason: str) -> None:
    """Skip (or, when servers are required, fail) the current test: ``group`` is missing."""
    assert group in GROUPS, group
    message = f"[needs {group}] {reason}"
    if os.environ.get("ACCELMATRIX_REQUIRE_SERVERS") == "1":
        pytest.fail(f"{message} (required: ACCELMATRIX_REQUIRE_SERVERS=1)", pytrace=False)
    pytest.skip(message)


def group_of(reason: str) -> str | None:
    """The group a skip reason was tagged with by ``missing``, if any."""
    m = TAG.search(reason.removeprefix("Skipped: "))
    return m.group(1) if m else None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    """End a run that skipped a test group for a missing server with a loud block: which
    group, why, and the command that fixes it. (Called from tests/conftest.py; a plugin of
    its own, ``-p needs``, for tests/test_skip_summary.py.)"""
    skipped: dict[str, dict[str, int]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        group = group_of(reason)
        if group:
            reasons = skipped.setdefault(group, {})
            reasons[reason] = reasons.get(reason, 0) + 1
    if not skipped:
        return
    tr = terminalreporter
    tr.write_sep("!", "TEST GROUPS SKIPPED: this run did not test everything", red=True, bold=True)
    for group, reasons in sorted(skipped.items()):
        what, fix = GROUPS[group]
        tr.write_line(f"{group}: {sum(reasons.values())} test(s) skipped - {what}", red=True)
        for reason in reasons:
            tr.write_line(f"    why: {reason.removeprefix('Skipped: ')}")
        tr.write_line(f"    fix: {fix}   (or run .ci/test-deps as root, then make test)")
