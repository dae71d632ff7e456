"""Where accelmatrix keeps things, from environment variables with sane local defaults.

Plain environment variables (not Airflow's conf API) so the CLI, DAG parsing and task
processes all agree without importing Airflow's configuration machinery.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# A source checkout runs the package from plugins/accelmatrix; an installed one lives in
# site-packages, where REPO_ROOT is no repository and has no include/.
FROM_CHECKOUT = Path(__file__).resolve().parent.parent.name == "plugins"


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))


def home() -> Path:
    """Root of accelmatrix's local state (artifacts, work dirs, results DB)."""
    return Path(os.environ.get("ACCELMATRIX_HOME", airflow_home() / "accelmatrix"))


def include_dir() -> Path:
    """Suites, workloads, bounds and pricing: the checkout's include/ when run from one,
    else ``$AIRFLOW_HOME/include`` (where an Astro project keeps it)."""
    default = REPO_ROOT / "include" if FROM_CHECKOUT else airflow_home() / "include"
    return Path(os.environ.get("ACCELMATRIX_INCLUDE_DIR", default))


def suites_dir() -> Path:
    """The suite files the DAG file turns into DAGs (one DAG per ``*.yaml``)."""
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


MAX_NAME = 120  # path components stay far below the usual 255-byte limit


def safe_name(text: str) -> str:
    """A path component from a dag, run or cell id, one-to-one: two ids never share it.

    `=` , `,` `.` `_` `-` and letters/digits are kept; anything else (`/`, `:`, `+`, ...)
    becomes `_`. Since that alone would map `torch-2.13+cpu` and `torch-2.13_cpu` to one
    directory (two cells sharing a work dir, logs and Data Docs), an id that had to change,
    or is too long, gets `~` and a hash of the exact id appended. `~` never appears in an
    unchanged name, so a changed id cannot collide with an unchanged one either.
    """
    out = "".join(c if c.isalnum() or c in "=,._-" else "_" for c in text).strip(".") or "_"
    if out == text and len(out) <= MAX_NAME:
        return out
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{out[:MAX_NAME]}~{digest}"


def cell_artifacts_dir(dag_id: str, run_id: str, cell_id: str) -> Path:
    return artifacts_dir() / safe_name(dag_id) / safe_name(run_id) / safe_name(cell_id)
