"""Tests are marked by what they need: `make check` (-m "not server") selects none that
needs a server, and every one that does not (tests/conftest.py, pytest_mark_by_need)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _selected(*files: str) -> list[str]:
    proc = subprocess.run(  # noqa: S603 - fixed interpreter and arguments
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", "not server and not reliability and not loop", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
    )
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_check_selects_the_pure_tests_and_none_that_needs_a_server():
    got = _selected(
        "tests/test_tpu_backend.py",  # gcloud and sshd, every test (a module mark)
        "tests/test_tpu_vm_model.py",  # pure
        "tests/test_ssh_backend.py",  # sshd through a fixture, except its spec tests
        "tests/test_celery.py",  # integration (Airflow), except a pure helper test
        "tests/test_k8s_api_semantics.py",  # the Kubernetes emulator's cluster fixture
    )
    files = {line.split("::", 1)[0] for line in got}
    assert files == {
        "tests/test_tpu_vm_model.py",
        "tests/test_ssh_backend.py",
        "tests/test_celery.py",
    }, got
    assert len([x for x in got if x.startswith("tests/test_tpu_vm_model.py")]) == 2, got
    # The SSH tests that take the sshd are not selected; the ones that do not are.
    ssh = [x for x in got if x.startswith("tests/test_ssh_backend.py")]
    assert 0 < len(ssh) < 21, ssh
