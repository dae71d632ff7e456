"""Browser URLs of a run's evidence: the run report, a cell's logs, metrics, artifacts and
Data Docs, as the matrix page's plugin app serves them (accelmatrix.ui.files says which
files, under Airflow's auth: read access to the DAG's task logs).

Task logs print these instead of filesystem paths: a path on a worker means nothing to
someone reading the log in the Airflow UI. The base is Airflow's ``[api] base_url`` (what
the notify links use too), the app is mounted at ``/accelmatrix``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from accelmatrix import settings

APP_PREFIX = "/accelmatrix"


def base_url() -> str:
    from airflow.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "http://localhost:8080").rstrip("/")


def files_url(dag_id: str, rel: str, base: str | None = None) -> str:
    """The URL serving ``rel`` (posix, relative to the suite's artifacts dir)."""
    return (
        f"{base if base is not None else base_url()}{APP_PREFIX}/suites/"
        f"{quote(dag_id, safe='')}/files/{quote(rel)}"
    )


def evidence_url(dag_id: str, path: Path | str, base: str | None = None) -> str:
    """The URL of ``path``, a file under the suite's artifacts dir; the path itself (as a
    string) when it lies elsewhere, so a log line never loses the location."""
    root = settings.artifacts_dir() / settings.safe_name(dag_id)
    try:
        rel = Path(path).resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return str(path)
    return files_url(dag_id, rel.as_posix(), base)
