"""collect: copy the cell's artifacts and turn its metric sources into metric rows; a failure
is recorded so evaluate cannot judge whatever happened to be on disk."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix.backends.base import get_backend
from accelmatrix.cell_state import CellState
from accelmatrix.lifecycle.common import RunRef, _record_step_failure
from accelmatrix.spec.templating import render_tree
from accelmatrix.store_access import results_store

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


class CollectFailed(AirflowFailException):
    """Metrics were read but could not all be kept (reserved name, duplicate): the suite or
    the workload must change, so Airflow must not retry."""


def collect(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> dict[str, Any]:
    """Copy artifacts and turn the declared metric sources into long-form metric rows.

    A crash here must not leave the cell looking healthy: evaluate still runs after it (its
    trigger rule) and would judge whatever happened to be on disk. So any failure records
    the cell as ``collect_failed`` with the error, which record_evaluation keeps.
    """
    try:
        result, errors = _collect(cell, resource, ref)
    except Exception as e:
        record_collect_failure(cell, ref, f"{type(e).__name__}: {e}")
        raise
    if errors:
        message = "; ".join(errors)
        record_collect_failure(cell, ref, message)
        raise CollectFailed(f"cell {cell['id']}: collect failed: {message}"[:4000])
    prior = results_store().get_cell(ref.dag_id, ref.run_id, cell["id"]) or {}
    if (
        prior.get("state") == CellState.COLLECT_FAILED
    ):  # an earlier attempt crashed, this one worked
        results_store().upsert_cell(
            ref.dag_id, ref.run_id, cell["id"], state=CellState.COLLECTED, message=""
        )
    return result


def record_collect_failure(cell: dict[str, Any], ref: RunRef, error: str) -> None:
    """State ``collect_failed``, message "collect failed: <error>"; a more specific earlier
    failure (a timeout, a failed setup) keeps its state and gets the error appended."""
    _record_step_failure(cell, ref, CellState.COLLECT_FAILED, f"collect failed: {error}")


def _collect(
    cell: dict[str, Any], resource: dict[str, Any], ref: RunRef
) -> tuple[dict[str, Any], list[str]]:
    from pydantic import TypeAdapter

    from accelmatrix.metrics.sources import MetricSource, collect_metrics, write_train_metrics

    backend = get_backend(cell["machine_spec"])
    resource = backend.refresh(resource)  # a retried run may have replaced the machine
    art = ref.artifacts(cell["id"])
    files_dir = art / "files"
    variables = backend.variables(resource)
    globs = []
    for g in render_tree(cell["workload"]["artifacts"], variables):
        # A param or axis value may have turned a safe glob into one that escapes the work
        # dir: the suite model only saw the template.
        if g.startswith("/") or ".." in re.split(r"[/\\]", g):
            log.warning("artifact glob %r escapes the work dir: not collected", g)
            continue
        globs.append(g)
    copied = backend.collect(resource, globs, files_dir)
    log.info("collected %d artifact(s) into %s", len(copied), files_dir)
    for rel in copied[:50]:
        log.info("  %s", rel)

    adapter = TypeAdapter(MetricSource)
    sources = [adapter.validate_python(s) for s in cell["workload"]["metrics"]]
    from accelmatrix.metrics.resources import FILE, resource_rows

    # The runner's samples (namespace runner.) go through the same duplicate check.
    collected = collect_metrics(
        sources,
        files_dir=files_dir,
        log_path=art / "output.log",
        extra_rows=resource_rows(art / FILE),
    )
    for d in collected.diagnostics:
        log.warning("metrics: %s", d)
    (art / "metrics.json").write_text(json.dumps(collected.rows, default=_json_default))
    write_train_metrics(
        collected.rows, art / "train_metrics.json", extra={"cell": cell["id"], **cell["axes"]}
    )
    store = results_store()
    store.replace_metrics(ref.dag_id, ref.run_id, cell["id"], collected.rows)
    log.info("stored %d metric value(s)", len(collected.rows))
    return {
        "artifacts": len(copied),
        "metrics": len(collected.rows),
        "diagnostics": collected.diagnostics,
        "errors": collected.errors,
    }, collected.errors


def _json_default(o: Any) -> Any:
    return str(o)
