"""The gate's perf history: the suite's change points and re-tests (``history.change_points``'s
pass, ``history.retests.followup`` for a re-test's own runs, a compare run's report) and its
per-cell alerts. After the verdict, never able to change it: a problem here is logged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from accelmatrix.contracts.run_records import RunRecord
from accelmatrix.evidence import evidence_url
from accelmatrix.history.change_points.history_pass import analyse_suite
from accelmatrix.history.change_points.report import changes_table, confirmation_line
from accelmatrix.history.retests.build_compare import compare_run, table, write_report
from accelmatrix.history.retests.followup import NOTIFY_STATES, advance
from accelmatrix.lifecycle.gate_cells import run_dir_of
from accelmatrix.notifications import dedup as alerts
from accelmatrix.notifications import transport as notify
from accelmatrix.reports.run_page import write_run_index
from accelmatrix.results import results_store
from accelmatrix.spec.followup_plan import followup_of
from accelmatrix.spec.loader import load_suite

if TYPE_CHECKING:
    from accelmatrix.contracts.run_records import CellRecord
    from accelmatrix.spec.cell import CellSpec
    from accelmatrix.steps.common import RunRef

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def history_and_alerts(
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
        run_dir = run_dir_of(ref)
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
