"""Where accelmatrix keeps things, from environment variables with sane local defaults.

Plain environment variables (not Airflow's conf API) so the CLI, DAG parsing and task
processes all agree without importing Airflow's configuration machinery.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))


def home() -> Path:
    """Root of accelmatrix's local state (artifacts, work dirs, results DB)."""
    return Path(os.environ.get("ACCELMATRIX_HOME", airflow_home() / "accelmatrix"))


def include_dir() -> Path:
    return Path(os.environ.get("ACCELMATRIX_INCLUDE_DIR", REPO_ROOT / "include"))


def suites_dir() -> Path:
    return Path(os.environ.get("ACCELMATRIX_SUITES_DIR", include_dir() / "suites"))


def artifacts_dir() -> Path:
    """Kept after teardown. Must be shared between workers when they run on several hosts."""
    return Path(os.environ.get("ACCELMATRIX_ARTIFACTS_DIR", home() / "artifacts"))


def keys_dir() -> Path:
    """Private keys of the machines accelmatrix creates (TPU VMs), 0700.

    Read by the provision, run (triggerer) and teardown steps: shared between the workers
    and the triggerer, like the artifacts dir, but never served or published.
    """
    return Path(os.environ.get("ACCELMATRIX_KEYS_DIR", home() / "ssh-keys"))


def work_root() -> Path:
    """Scratch space of local cells; removed at teardown."""
    return Path(os.environ.get("ACCELMATRIX_WORK_DIR", home() / "work"))


def results_url() -> str:
    return os.environ.get("ACCELMATRIX_RESULTS_URL", f"sqlite:///{home() / 'results.db'}")


def safe_name(text: str) -> str:
    """A path component from a run or cell id (`=` and `,` are fine; `/`, `:` and `+` are not)."""
    out = "".join(c if c.isalnum() or c in "=,._-" else "_" for c in text)
    return out.strip(".") or "_"


def cell_artifacts_dir(dag_id: str, run_id: str, cell_id: str) -> Path:
    return artifacts_dir() / safe_name(dag_id) / safe_name(run_id) / safe_name(cell_id)
