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
