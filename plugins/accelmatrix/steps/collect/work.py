"""collect: copy the cell's artifacts (unless run already did) and turn its metric sources
into metric rows; a failure is recorded so evaluate cannot judge whatever happened to be on
disk."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from accelmatrix.cell_state import CellState
from accelmatrix.contracts.machine_records import MachineResource
from accelmatrix.evidence import evidence_url
from accelmatrix.metrics.resource_samples import FILE, resource_rows
from accelmatrix.metrics.sources import collect_metrics, write_train_metrics
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.artifacts import ArtifactsDiskFull, fetch_artifacts, fetched_artifacts
from accelmatrix.steps.common import RunRef, _record_step_failure

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


class CollectFailed(AirflowFailException):
    """Metrics were read but could not all be kept (reserved name, duplicate): the suite or
    the workload must change, so Airflow must not retry."""


def collect(cell: CellSpec, resource: MachineResource, ref: RunRef) -> dict[str, Any]:
    """Copy artifacts and turn the declared metric sources into long-form metric rows.

    A crash here must not leave the cell looking healthy: evaluate still runs after it (its
    trigger rule) and would judge whatever happened to be on disk. So any failure records
    the cell as ``collect_failed`` with the error, which record_evaluation keeps.
    """
    try:
        result, errors = _collect(cell, resource, ref)
    except ArtifactsDiskFull as e:  # this host's disk, not the suite: infrastructure
        _record_step_failure(cell, ref, CellState.INFRA_FAILED, f"collect failed: {e}")
        raise
    except Exception as e:
        record_collect_failure(cell, ref, f"{type(e).__name__}: {e}")
        raise
    if errors:
        message = "; ".join(errors)
        record_collect_failure(cell, ref, message)
        raise CollectFailed(f"cell {cell.id}: collect failed: {message}"[:4000])
    prior = results_store().get_cell(ref.dag_id, ref.run_id, cell.id)
    if (
        prior is not None and prior.state == CellState.COLLECT_FAILED
    ):  # an earlier attempt crashed, this one worked
        results_store().upsert_cell(
            ref.dag_id, ref.run_id, cell.id, fence=ref.fence, state=CellState.COLLECTED, message=""
        )
    return result


def record_collect_failure(cell: CellSpec, ref: RunRef, error: str) -> None:
    """State ``collect_failed``, message "collect failed: <error>"; a more specific earlier
    failure (a timeout, a failed setup) keeps its state and gets the error appended."""
    _record_step_failure(cell, ref, CellState.COLLECT_FAILED, f"collect failed: {error}")


def _collect(
    cell: CellSpec, resource: MachineResource, ref: RunRef
) -> tuple[dict[str, Any], list[str]]:

    art = ref.artifacts(cell.id)
    files_dir = art / "files"
    copied = fetched_artifacts(cell, resource, ref)
    disk_full = None
    if copied is not None:
        log.info(
            "run already collected %d artifact(s) (before it released the machine)", len(copied)
        )
    else:
        try:
            copied = fetch_artifacts(cell, resource, ref)
        except ArtifactsDiskFull as e:  # the log is here: keep its metric rows, then fail
            disk_full, copied = e, []

    # The runner's samples (namespace runner.) go through the same duplicate check.
    collected = collect_metrics(
        cell.workload.metrics,
        files_dir=files_dir,
        log_path=art / "output.log",
        extra_rows=resource_rows(art / FILE),
    )
    for d in collected.diagnostics:
        log.warning("metrics: %s", d)
    for name, steps in collected.collapsed.items():
        log.warning(
            "metrics: %s: %d step(s) logged more than once (first %s): kept the last value of each",
            name,
            len(steps),
            steps[0],
        )
    (art / "metrics.json").write_text(json.dumps(collected.rows, default=_json_default))
    write_train_metrics(
        collected.rows, art / "train_metrics.json", extra={"cell": cell.id, **cell.axes}
    )
    store = results_store()
    store.replace_metrics(ref.dag_id, ref.run_id, cell.id, collected.store_rows())
    log.info(
        "stored %d metric value(s)%s",
        len(collected.rows),
        f" ({collected.collapsed_rows} repeated row(s) collapsed)" if collected.collapsed else "",
    )
    if disk_full is not None:
        raise disk_full
    _log_file_urls(ref, art, [files_dir / rel for rel in copied])
    return {
        "artifacts": len(copied),
        "metrics": len(collected.rows),
        "collapsed": collected.collapsed_rows,
        "diagnostics": collected.diagnostics,
        "errors": collected.errors,
    }, collected.errors


# At most this many collected artifacts are linked in the log (the rest: the run report).
LINKED_ARTIFACTS = 50


def _log_file_urls(ref: RunRef, art: Path, artifacts: list[Path]) -> None:
    """The cell's files as the matrix page serves them: links, not worker paths."""

    found = [p for p in (art / "output.log", art / "metrics.json") if p.is_file()]
    found += [p for p in artifacts[:LINKED_ARTIFACTS] if p.is_file()]
    if not found:
        return
    log.info("the cell's files in the browser (log, metrics, artifacts):")
    for p in found:
        log.info("  %s", evidence_url(ref.dag_id, p))
    if len(artifacts) > LINKED_ARTIFACTS:
        log.info("  ... and %d more artifact(s)", len(artifacts) - LINKED_ARTIFACTS)


def _json_default(o: Any) -> Any:
    return str(o)
