"""gate, the run's finalisation (after every teardown): cells cut short get their verdict, the
run's leftovers are reaped, the run passes or fails, and history, alerts and notifications
follow (never able to change the verdict). The work beside the verdict is in its own
modules: ``gate_cells`` (the cells settled, leftovers reaped, the run's table validated, its
report), ``gate_history`` (perf history, re-tests, alerts), ``gate_notify`` (webhook, pull
request)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from accelmatrix.cell_state import CellState, RunState
from accelmatrix.lifecycle.gate_cells import (
    log_results,
    run_dir_of,
    settle_stopped_run,
    validate_run_table,
    write_report,
)
from accelmatrix.lifecycle.gate_history import history_and_alerts
from accelmatrix.lifecycle.gate_notify import notify_webhook, report_pull_request
from accelmatrix.results import results_store
from accelmatrix.steps.common import CellFailed, utcnow

if TYPE_CHECKING:
    from accelmatrix.spec.cell import CellSpec
    from accelmatrix.steps.common import RunRef

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def gate(planned: list[CellSpec], ref: RunRef, suite_path: str | None = None) -> dict[str, Any]:
    """Decide the run: it fails exactly when a non-quarantined cell did not pass.

    With ``suite_path``, the suite's ``notify`` settings are honoured (see accelmatrix.notifications).
    """
    store = results_store()
    stopped_cells = settle_stopped_run(planned, ref)
    rows = {r.cell_id: r for r in store.get_cells(ref.dag_id, ref.run_id)}
    log_results(ref)
    failed, quarantined_failed, passed = [], [], []
    for c in planned:
        state = rows[c.id].state if c.id in rows else "missing"
        if state == CellState.PASSED:
            passed.append(c.id)
        elif c.quarantined:
            quarantined_failed.append((c.id, state))
        else:
            failed.append((c.id, state))
    run_dir = run_dir_of(ref)
    validation = validate_run_table(planned, ref, list(rows.values()), suite_path, run_dir)
    summary = {
        "passed": passed,
        "failed": [f"{i} ({s})" for i, s in failed],
        "quarantined_failed": [f"{i} ({s})" for i, s in quarantined_failed],
        "run_checks_failed": validation.failures,
    }
    store.upsert_run(
        ref.dag_id,
        ref.run_id,
        state=RunState.FAILED if failed or not validation.passed else RunState.PASSED,
        finished_at=utcnow(),
    )

    write_report(ref, run_dir, list(rows.values()))
    costs = [r.cost for r in rows.values() if r.cost is not None]
    summary["cost"] = sum(costs) if costs else None
    if costs:
        log.info("run cost: %.6f (sum of %d cell(s))", summary["cost"], len(costs))
    if suite_path:
        # A cell a person stopped says nothing about the code under test: no alert for it.
        judged = [c for c in planned if c.id not in stopped_cells]
        history_and_alerts(suite_path, judged, ref, rows)
        notify_webhook(suite_path, planned, ref, failed, rows, summary["cost"])
        report_pull_request(suite_path, ref)
    for cid, state in quarantined_failed:
        log.warning("quarantined cell %s did not pass (%s): not failing the run", cid, state)
    if failed or not validation.passed:
        parts = []
        if failed:
            parts.append(
                f"{len(failed)} cell(s) failed: " + ", ".join(f"{i} ({s})" for i, s in failed)
            )
        if not validation.passed:
            parts.append("the run's table failed validation: " + "; ".join(validation.failures))
        raise CellFailed("; ".join(parts))
    log.info("all %d non-quarantined cell(s) passed", len(planned) - len(quarantined_failed))
    return summary
