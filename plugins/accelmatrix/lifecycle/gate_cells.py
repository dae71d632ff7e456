"""The gate's work on the run's cells: cells cut short settled and the run's leftovers
reaped, the results logged, the run's table validated (Great Expectations) and its report
written (``lifecycle.gate`` decides the verdict from them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.cleanup import stopped
from accelmatrix.cleanup.janitor import reap_run
from accelmatrix.evaluation.run_table import validate_run
from accelmatrix.evidence import evidence_url
from accelmatrix.lifecycle.plan_step import params_text
from accelmatrix.reports.run_page import write_run_index
from accelmatrix.reports.text_table import run_table
from accelmatrix.reports.verdicts import CellVerdicts, lead_run_docs
from accelmatrix.results import results_store
from accelmatrix.spec.loader import load_suite

if TYPE_CHECKING:
    from accelmatrix.contracts.run_records import CellRecord
    from accelmatrix.spec.cell import CellSpec
    from accelmatrix.steps.common import RunRef

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def run_dir_of(ref: RunRef) -> Path:
    """The run's directory of artifacts (its report, Data Docs, a comparison's pages)."""
    return (
        settings.artifacts_dir() / settings.safe_name(ref.dag_id) / settings.safe_name(ref.run_id)
    )


def log_results(ref: RunRef) -> None:
    """The run's table of cells and its params, in the gate's log."""
    store = results_store()
    log.info(
        "results for %s %s:\n%s", ref.dag_id, ref.run_id, run_table(store, ref.dag_id, ref.run_id)
    )
    run_row = store.get_run(ref.dag_id, ref.run_id)
    log.info(
        "params of this run (its conf over the suite's defaults): %s",
        params_text(run_row.params if run_row else None),
    )


def write_report(ref: RunRef, run_dir: Path, rows: list[CellRecord]) -> None:
    """The run's HTML report, beside its artifacts; its address in the log."""
    index = write_run_index(
        run_dir,
        ref.dag_id,
        ref.run_id,
        rows,
        results_store().get_checks(ref.dag_id, ref.run_id),
    )
    log.info("run report: %s", evidence_url(ref.dag_id, index))


def validate_run_table(
    planned: list[CellSpec],
    ref: RunRef,
    rows: list[CellRecord],
    suite_path: str | None,
    run_dir: Any,
) -> Any:
    """Great Expectations over the run's table of cells (``evaluation.run_table``): every
    planned cell reported once, with a verdict, and no passed cell with a failed check,
    plus the suite's ``run_checks``. Its Data Docs go to the run's directory."""

    run_checks = []
    if suite_path:
        run_checks = load_suite(suite_path).run_checks
    validation = validate_run(
        [c.to_json() for c in planned],
        rows,
        results_store().get_checks(ref.dag_id, ref.run_id),
        run_checks=run_checks,
        suite_name=f"{ref.dag_id}.{ref.run_id}",
        data_docs_dir=run_dir / "data_docs",
    )
    for failure in validation.failures:
        log.error("run check failed: %s", failure)
    if validation.data_docs_index is not None:
        # The page leads with the cells' verdicts and says it validates the run's table.

        states = {r.cell_id: r.state for r in rows}
        verdicts = CellVerdicts.of((c.id, states.get(c.id), c.quarantined) for c in planned)
        try:
            lead_run_docs(validation.data_docs_index, verdicts)
        except OSError:
            log.warning("run Data Docs: could not add the cells' verdicts", exc_info=True)
        log.info("run Data Docs: %s", evidence_url(ref.dag_id, validation.data_docs_index))
    log.info(
        "run table validated in %.2f s: %s",
        validation.seconds,
        "passed" if validation.passed else f"{len(validation.failures)} expectation(s) failed",
    )
    return validation


def settle_stopped_run(planned: list[CellSpec], ref: RunRef) -> set[str]:
    """Give cells cut short a verdict and release whatever the run still holds; the ids of
    the cells stopped from outside (state ``cancelled``).

    The gate runs after every cell's teardown, also when a person marked the run failed
    (it is a teardown task). A cell still without a verdict here never got one: its tasks
    were skipped or killed.

    Then every resource of this run that no teardown deleted is torn down through the
    janitor (by the run's labels, on every machine the run used), whatever happened:
    Airflow skips a cell's teardown when its provision task failed, and Airflow 3.3.2 can
    fail a provision task after its machine exists (the defer/resume race). Listing is one
    call per machine kind; in a clean run it finds nothing.
    """

    store = results_store()
    rows = {r.cell_id: r for r in store.get_cells(ref.dag_id, ref.run_id)}
    for c in planned:
        state = rows[c.id].state if c.id in rows else None
        message = (
            f"stopped before it finished (was {state}); nothing of it was left running "
            "(it never got a machine, or its teardown released it)"
        )
        if stopped.settle_cell(store, ref.dag_id, ref.run_id, c.id, message):
            log.warning("cell %s: %s", c.id, message)
    cut = {r.cell_id for r in store.get_cells(ref.dag_id, ref.run_id) if r.state == stopped.STOPPED}
    if cut:
        log.warning(
            "run %s was stopped from outside: %d cell(s) cancelled: %s",
            ref.run_id,
            len(cut),
            ", ".join(sorted(cut)),
        )
        reason = f"run {ref.run_id} was stopped from outside and its teardown left it"
    else:
        reason = f"run {ref.run_id} is over and no teardown deleted it"
    specs = {json.dumps(c.machine_json, sort_keys=True): c.machine_json for c in planned}
    report = reap_run(
        ref.dag_id, ref.run_id, specs.values(), reason=reason, say=log.warning, store=store
    )
    if not report.decisions and not report.unreachable:
        log.info("run cleanup: no resource of this run is left on its %d machine(s)", len(specs))
    for key, err in report.unreachable.items():
        log.error("run cleanup: machine %s not checked: %s", key, err)
    return cut
