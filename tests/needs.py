"""Skipping a test group for a missing tool or server, loudly, or failing where it is required.

A skip used to be one line among hundreds ("1 skipped", exit 0): a machine without sshd
ran no SSH test at all and looked green. Every such skip goes through ``missing``, which
tags the reason with its group; tests/conftest.py lists the groups skipped at the end of
the run with the command that fixes them. A skip that names no group (a bare
``pytest.skip``) is listed too, as ``untagged``: every skip condition belongs to a group.

With ``ACCELMATRIX_REQUIRE_SERVERS=1`` (set by `make reliability`) a missing server fails
the test instead. With ``CI=true`` (set by .ci/run) the tests still skip, so the block
still groups them with their fix, and then the run fails: a CI run that did not test
everything is not green.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

GCLOUD_FIX = (
    "add Google Cloud's apt repository (https://cloud.google.com/sdk/docs/install#deb), "
    "then apt-get install -y google-cloud-cli kubectl"
)
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
    "gcloud": (
        "TPU backend, hook, credentials and janitor tests (the real gcloud CLI against the "
        "Cloud TPU emulator)",
        GCLOUD_FIX,
    ),
    "kubectl": ("kubectl against the Kubernetes emulator", GCLOUD_FIX),
    "tmpfs": (
        "artifacts-disk-full test (a 256 KiB tmpfs over the cell's artifacts dir)",
        "run the tests as root (mount -t tmpfs needs CAP_SYS_ADMIN)",
    ),
    "node": (
        "the matrix view's JS sanitiser judged by Node's WHATWG URL parser (a browser's)",
        "apt-get install -y nodejs",
    ),
    "venv": (
        "tests of what `make venv` installs (the wheel build, the system python beside it)",
        "make venv  (python3.11 -m venv brings setuptools; apt-get install -y python3)",
    ),
}
UNTAGGED = "untagged"
TAG = re.compile(r"^\[needs (\w+)\] ")


def missing(group: str, reason: str) -> None:
    """Skip (or, when servers are required, fail) the current test: ``group`` is missing."""
    assert group in GROUPS, group
    message = f"[needs {group}] {reason}"
    if os.environ.get("ACCELMATRIX_REQUIRE_SERVERS") == "1":
        pytest.fail(f"{message} (required: ACCELMATRIX_REQUIRE_SERVERS=1)", pytrace=False)
    pytest.skip(message)


def tool(group: str, name: str) -> str:
    """The path of the command ``name`` on PATH; ``missing(group)`` when there is none."""
    path = shutil.which(name)
    if path is None:
        missing(group, f"{name} is not on PATH")
    return path


def group_of(reason: str) -> str | None:
    """The group a skip reason was tagged with by ``missing``, if any."""
    m = TAG.search(reason.removeprefix("Skipped: "))
    return m.group(1) if m else None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def skipped_groups(stats: dict) -> dict[str, dict[str, int]]:
    """group (or ``untagged``) -> {reason: tests}, from a terminal reporter's stats."""
    skipped: dict[str, dict[str, int]] = {}
    for report in stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        where = report.nodeid or (report.longrepr[0] if isinstance(report.longrepr, tuple) else "")
        group = group_of(reason)
        if group is None:
            group, reason = UNTAGGED, f"{where}: {reason}"
        reasons = skipped.setdefault(group, {})
        reasons[reason] = reasons.get(reason, 0) + 1
    return skipped


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001
    """Under CI=true a run that skipped any test fails (the block below says what to install).

    On the xdist controller (or a plain run): it has every worker's reports."""
    if not in_ci() or hasattr(session.config, "workerinput"):
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and tr.stats.get("skipped") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    """End a run that skipped a test group with a loud block: which group, why, and the
    command that fixes it. (Called from tests/conftest.py; a plugin of its own, ``-p needs``,
    for tests/test_skip_summary.py.)"""
    skipped = skipped_groups(terminalreporter.stats)
    if not skipped:
        return
    tr = terminalreporter
    tr.write_sep("!", "TEST GROUPS SKIPPED: this run did not test everything", red=True, bold=True)
    for group, reasons in sorted(skipped.items()):
        what, fix = GROUPS.get(group, ("skipped outside any group of tests/needs.py", ""))
        tr.write_line(f"{group}: {sum(reasons.values())} test(s) skipped - {what}", red=True)
        for reason in reasons:
            tr.write_line(f"    why: {reason.removeprefix('Skipped: ')}")
        if group == UNTAGGED:
            tr.write_line("    fix: make the test run, or skip it through needs.missing(group)")
        else:
            tr.write_line(f"    fix: {fix}   (or run .ci/test-deps as root, then make test)")
    if in_ci():
        tr.write_line(
            "CI=true: a skipped test fails the run (exit 1); install what is missing above",
            red=True,
            bold=True,
        )
