"""Test environment: a private AIRFLOW_HOME and accelmatrix home per test session.

Set before anything imports Airflow, so no test touches a developer's ~/airflow or the
demo's airflow_home/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="accelmatrix-tests-"))

os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "ACCELMATRIX_HOME": str(_HOME / "accelmatrix"),
        "ACCELMATRIX_SUITES_DIR": str(ROOT / "include" / "suites"),
        "GX_ANALYTICS_ENABLED": "false",
    }
)
os.environ.pop("ACCELMATRIX_RESULTS_URL", None)
(_HOME / "airflow").mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Airflow's metadata DB (SQLite), migrated once per session."""
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run(  # noqa: S603
        [str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=300
    )
    return _HOME / "airflow"


@pytest.fixture
def accel_home(tmp_path, monkeypatch) -> Path:
    """A fresh accelmatrix home (work dirs, artifacts, results DB) for one test."""
    home = tmp_path / "accelmatrix"
    monkeypatch.setenv("ACCELMATRIX_HOME", str(home))
    return home


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The loud end-of-run block of test groups skipped for a missing server (needs.py)."""
    from needs import pytest_terminal_summary as summary

    summary(terminalreporter, exitstatus, config)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Under CI=true a run that skipped a test fails (needs.py)."""
    from needs import pytest_sessionfinish as finish

    finish(session, exitstatus)


@pytest.fixture(scope="session")
def needs_gcloud() -> str:
    """The real gcloud CLI (the TPU tests drive it against the Cloud TPU emulator)."""
    from needs import tool

    return tool("gcloud", "gcloud")


@pytest.fixture(scope="session")
def needs_kubectl() -> str:
    """The real kubectl (pointed at the Kubernetes emulator)."""
    from needs import tool

    return tool("kubectl", "kubectl")


# -- marked by what they need --------------------------------------------------------------
# `server`: the test needs a server or a real Airflow: the loopback sshd, PostgreSQL/Redis,
# headless Chromium, the Cloud TPU or Kubernetes emulator, the real gcloud or kubectl, an
# Airflow metadata DB (airflow_db, dag.test) or scheduler (AirflowStack). `make check` runs
# the others (`-m "not server"`, about a minute here); `make test` runs them all. A test
# gets the mark from its own `server` or `integration` mark (pyproject), or from using one
# of these fixtures (tests/conftest.py, sshd.py, tpu_env.py, celery_services.py and the
# modules' own server fixtures), so a new test that takes one is marked without a word.
SERVER_FIXTURES = frozenset(
    {
        "airflow_db",  # Airflow's metadata DB, migrated
        "sshd_server",  # tests/sshd.py: the loopback OpenSSH server
        "server",  # tpu_env.py, test_ssh_backend.py, test_security.py: that sshd
        "emulator",  # the Cloud TPU emulator (tpu_env.py, test_tpu_hook.py)
        "emu",
        "gcloud_env",
        "cluster",  # the Kubernetes emulator with its kubelet (k8s tests)
        "postgres",  # celery_services.py
        "redis",
        "results_postgres",
        "needs_gcloud",
        "needs_kubectl",
    }
)


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_mark_by_need(session, config, items) -> None:  # noqa: ARG001
    """Add the `server` mark before `-m` selects (tryfirst: before pytest's own deselection)."""
    for item in items:
        if item.get_closest_marker("server"):
            continue
        if item.get_closest_marker("integration") or SERVER_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.server)


# -- long files first ----------------------------------------------------------------------
# `make test` runs `pytest -n 3 --dist loadfile --no-loadscope-reorder`: xdist hands out
# whole files in the order the workers collected them, and a worker takes its next file
# when its current one has at most 2 tests left. Without --no-loadscope-reorder xdist puts
# the files with the most tests first, so the longest files (one to six tests each:
# test_nightly_perf.py, test_standalone_shutdown.py, ...) came last, and one worker sat idle
# for ~10 minutes while the other finished them. So files run longest first (the
# longest-processing-time rule): every file is weighed by the sum of its tests'
# `slow(seconds)` marks, heaviest first; unmarked files keep their collection order after
# the marked ones, and every test keeps its place inside its file. The reorder is the same
# on every worker, which xdist requires (it checks that all workers collected the same list).
# A `slow(N)` mark says a test takes about N s on the 2-core CI machine, its setup included
# (a module fixture counts with the first test that uses it, as `--durations` reports it);
# tests of 30 s and more carry one. It only orders; it skips and selects nothing.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first.setdefault(path, i)
        mark = item.get_closest_marker("slow")
        seconds = (mark.args[0] if mark.args else mark.kwargs.get("seconds", 0)) if mark else 0
        weight[path] = weight.get(path, 0.0) + float(seconds)
    items.sort(key=lambda it: (-weight[p := it.nodeid.split("::", 1)[0]], first[p]))
