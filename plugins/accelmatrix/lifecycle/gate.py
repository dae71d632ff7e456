"""gate, the run's finalisation (after every teardown): cells cut short get their verdict, the
run's leftovers are reaped, the run passes or fails, and history, alerts and notifications
follow (never able to change the verdict)."""

from __future__ import annotations

import json
import logging
from typing import Any

from accelmatrix import settings
from accelmatrix.cell_state import CellState, RunState
from accelmatrix.cleanup import stopped
from accelmatrix.cleanup.janitor import reap_run
from accelmatrix.contracts.run_records import CellRecord, RunRecord
from accelmatrix.evaluation.run_table import validate_run
from accelmatrix.evidence import evidence_url
from accelmatrix.history.changes.change_report import changes_table, confirmation_line
from accelmatrix.history.changes.history_pass import analyse_suite
from accelmatrix.history.retests.build_compare import compare_run, table, write_report
from accelmatrix.history.retests.followup import NOTIFY_STATES, advance
from accelmatrix.lifecycle.plan_step import params_text
from accelmatrix.notifications import dedup as alerts
from accelmatrix.notifications import transport as notify
from accelmatrix.notifications.pull_request import report_run
from accelmatrix.reports.run_page import write_run_index
from accelmatrix.reports.text_table import run_table
from accelmatrix.reports.verdicts import CellVerdicts, lead_run_docs
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.followup_plan import followup_of
from accelmatrix.spec.loader import load_suite
from accelmatrix.steps.common import CellFailed, RunRef, utcnow

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def gate(planned: list[CellSpec], ref: RunRef, suite_path: str | None = None) -> dict[str, Any]:
    """Decide the run: it fails exactly when a non-quarantined cell did not pass.

    With ``suite_path``, the suite's ``notify`` settings are honoured (see accelmatrix.notifications).
    """
    store = results_store()
    stopped_cells = _settle_stopped_run(planned, ref)
    rows = {r.cell_id: r for r in store.get_cells(ref.dag_id, ref.run_id)}
    log.info(
        "results for %s %s:\n%s", ref.dag_id, ref.run_id, run_table(store, ref.dag_id, ref.run_id)
    )

    run_row = store.get_run(ref.dag_id, ref.run_id)
    log.info(
        "params of this run (its conf over the suite's defaults): %s",
        params_text(run_row.params if run_row else None),
    )
    failed, quarantined_failed, passed = [], [], []
    for c in planned:
        state = rows[c.id].state if c.id in rows else "missing"
        if state == CellState.PASSED:
            passed.append(c.id)
        elif c.quarantined:
            quarantined_failed.append((c.id, state))
        else:
            failed.append((c.id, state))
    run_dir = (
        settings.artifacts_dir() / settings.safe_name(ref.dag_id) / settings.safe_name(ref.run_id)
    )
    validation = _validate_run(planned, ref, list(rows.values()), suite_path, run_dir)
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

    index = write_run_index(
        run_dir,
        ref.dag_id,
        ref.run_id,
        list(rows.values()),
        store.get_checks(ref.dag_id, ref.run_id),
    )
    log.info("run report: %s", evidence_url(ref.dag_id, index))
    costs = [r.cost for r in rows.values() if r.cost is not None]
    summary["cost"] = sum(costs) if costs else None
    if costs:
        log.info("run cost: %.6f (sum of %d cell(s))", summary["cost"], len(costs))
    if suite_path:
        # A cell a person stopped says nothing about the code under test: no alert for it.
        judged = [c for c in planned if c.id not in stopped_cells]
        _history_and_alerts(suite_path, judged, ref, rows)
        _notify(suite_path, planned, ref, failed, rows, summary["cost"])
        _report_pull_request(suite_path, ref)
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


def _validate_run(
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


def _settle_stopped_run(planned: list[CellSpec], ref: RunRef) -> set[str]:
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


def _history_and_alerts(
    suite_path: str, planned: list[CellSpec], ref: RunRef, rows: dict[str, CellRecord]
) -> None:
    """Update the suite's perf history (change points, groups, one notification per new
    regression group) and its per-cell failure alerts.

    After the verdict is known and never able to change it: a problem here is logged.
    """

    suite = load_suite(suite_path)
    store = results_store()
    sinks = suite.notify.alerts if suite.notify else []
    run = store.get_run(ref.dag_id, ref.run_id) or RunRecord(dag_id=ref.dag_id, run_id=ref.run_id)
    followup = followup_of(run.params)
    if followup is not None:
        # A re-test of named builds: its samples decide a confirmation or a bisect step;
        # they are no point of the nightly series, and its cells open no per-cell alert.
        _advance_followup(suite, ref, run, followup, sinks)
        return
    try:
        # The newest window of every followed series; re-tests started before any page.
        done = analyse_suite(
            store, ref.dag_id, suite, full=False, retest=_trigger(ref.dag_id),
            params=dict(run.params),
        )  # fmt: skip
        if done.update is None:
            log.info("no perf series in %s: nothing to analyse", ref.dag_id)
        elif table := changes_table(store, ref.dag_id):
            log.warning("perf changes of %s not yet triaged or fixed:\n%s", ref.dag_id, table)
    except Exception:  # noqa: BLE001 - the perf history must never flip the run's verdict
        log.exception("perf history of %s not updated", ref.dag_id)
    latest = store.latest_logical_date(ref.dag_id)
    if run.logical_date and latest and run.logical_date < latest:
        # A re-test of an older build (a backfill) says nothing about the current one: it
        # must not resolve, or open, the alert of newer runs.
        log.info("alerts unchanged: %s is older than the latest run", run.logical_date)
        return
    try:
        events = alerts.update_alerts(
            store,
            ref.dag_id,
            ref.run_id,
            [{"id": c.id, "quarantined": c.quarantined} for c in planned],
            rows,
            run_url=notify.run_url(ref.dag_id, ref.run_id),
        )
        for ev in events:
            log.info(
                "alert %s: %s (%s x%d)", ev["event"], ev["cell_id"], ev["kind"], ev["recurrences"]
            )
        if sinks and events:
            alerts.deliver(sinks, events, store)
    except Exception:  # noqa: BLE001 - same: alerts are advisory
        log.exception("alerts of %s not updated", ref.dag_id)


def _advance_followup(
    suite: Any, ref: RunRef, run: RunRecord, followup: Any, sinks: list[Any]
) -> None:
    """A follow-up run's gate: move its re-test on (``history.retests.followup.advance``); when it
    ended in a state that notifies, its group is notified now, with the verdict."""

    store = results_store()
    if followup.kind == "compare":
        _compare_builds(suite, ref, followup)
        return
    try:
        row = advance(
            store,
            suite,
            ref.dag_id,
            ref.run_id,
            followup,
            dict(run.params),
            _trigger(ref.dag_id),
        )
        if row is None:
            return
        log.info("%s", confirmation_line(row))
        group = store.get_change_group(row.group_id)
        if sinks and group is not None and row.state in NOTIFY_STATES:
            alerts.deliver_groups(sinks, store, [group])
    except Exception:  # noqa: BLE001 - like the perf history: never flips the verdict
        log.exception("re-test of %s not advanced", ref.dag_id)


def _compare_builds(suite: Any, ref: RunRef, followup: Any) -> None:
    """A compare run's gate: the two builds compared per cell and metric, logged as a table
    and written beside the run's report (``compare.json``, ``compare.html``)."""

    try:
        bc = compare_run(results_store(), suite, ref.dag_id, ref.run_id, followup)
        run_dir = (
            settings.artifacts_dir()
            / settings.safe_name(ref.dag_id)
            / settings.safe_name(ref.run_id)
        )
        _js, page = write_report(bc, run_dir)
        store = results_store()
        # The run's report (written before the comparison) now links to it.
        write_run_index(
            run_dir,
            ref.dag_id,
            ref.run_id,
            store.get_cells(ref.dag_id, ref.run_id),
            store.get_checks(ref.dag_id, ref.run_id),
        )
        log.info("build comparison:\n%s", table(bc))
        log.info("comparison report: %s", evidence_url(ref.dag_id, page))
    except Exception:  # noqa: BLE001 - like the perf history: never flips the verdict
        log.exception("builds of %s not compared", ref.dag_id)


def _trigger(dag_id: str) -> Any:
    """Start a run of ``dag_id`` through Airflow's execution API, as TriggerDagRunOperator
    does (the task keeps running): True if created, False if the run id already exists."""

    def trigger(run_id: str, conf: dict[str, Any]) -> bool:
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

        comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
        if comms is None:
            raise RuntimeError("not inside an Airflow task: cannot trigger a run")
        msg = comms.send(TriggerDagRun(dag_id=dag_id, run_id=run_id, conf=conf))
        if isinstance(msg, ErrorResponse):
            if msg.error == ErrorType.DAGRUN_ALREADY_EXISTS:
                return False
            raise RuntimeError(f"Airflow refused to trigger {dag_id} {run_id}: {msg.detail}")
        return True

    return trigger


def _report_pull_request(suite_path: str, ref: RunRef) -> None:
    """A run started for a pull request: its status and comment on GitHub
    (``notifications.pull_request``); never changes the verdict."""

    try:
        gh = load_suite(suite_path).github
        if gh is None:
            return
        report_run(
            results_store(),
            ref.dag_id,
            ref.run_id,
            context=gh.context or f"accelmatrix/{ref.dag_id}",
            conn_id=gh.conn_id,
        )
    except Exception:  # noqa: BLE001 - the verdict stands whatever GitHub does
        log.exception("pull request of %s %s not reported", ref.dag_id, ref.run_id)


def _notify(
    suite_path: str,
    planned: list[CellSpec],
    ref: RunRef,
    failed: list[tuple[str, str]],
    rows: dict[str, CellRecord],
    cost: float | None,
) -> None:
    """Send the suite's webhook; a notification problem is logged, never flips the verdict."""

    spec = load_suite(suite_path).notify
    hook = spec.webhook if spec else None
    if hook is None or (hook.when == "failure" and not failed):
        return
    by_id = {c.id: c for c in planned}
    checks = results_store().get_checks(ref.dag_id, ref.run_id)
    failed_cells = []
    for cid, state in failed:
        failed_cells.append(
            {
                "cell": cid,
                "state": state,
                "message": rows[cid].message if cid in rows else "",
                "failed_checks": [
                    c.check_name for c in checks if c.cell_id == cid and not c.passed
                ],
                "failed_tests": notify.failed_tests(
                    [c.glob for c in by_id[cid].checks if c.type == "junit"],
                    ref.artifacts(cid) / "files",
                ),
            }
        )
    run = results_store().get_run(ref.dag_id, ref.run_id)
    payload = notify.build_payload(
        dag_id=ref.dag_id,
        run_id=ref.run_id,
        state=RunState.FAILED if failed else RunState.PASSED,
        failed_cells=failed_cells,
        git_ref=run.git_ref if run else None,
        cost=cost,
    )
    try:
        notify.send_webhook(hook, payload)
    except Exception as e:  # noqa: BLE001 - the run's verdict stands whatever the webhook does
        log.error("webhook %s not notified: %s", hook.conn_id, e)
