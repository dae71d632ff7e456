"""One pass over a suite's perf history, for both callers: a run's gate and the maintenance
DAG. They differ only in scope, so the order of the steps lives here once:

1. change points of every followed series (``changes.update_changes``): the gate looks at
   the newest ``history.window`` points, the maintenance pass at the whole history;
2. re-tests of the new suspect changes (``followup.start_confirmations``), started only
   by a gate (it holds the trigger through Airflow's execution API), before anyone is
   notified: a change is re-tested first, paged after;
3. one notification per new regression group due one (``notifications.dedup``);
4. the series verdicts the page shows (``series.classify_suite``).

``maintenance_history`` is the maintenance DAG's task: the pass over every suite's whole
history.

A suite that follows no metric is skipped by a gate without importing pandas (about a
second at the end of every run of a functional suite); the maintenance pass still
classifies its bounded series.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from accelmatrix import settings
from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.history.change_points.tracking import ChangeUpdate, update_changes
from accelmatrix.history.retests.followup import Trigger, start_confirmations
from accelmatrix.history.series.series import classify_suite, rules_of, tracked_metrics
from accelmatrix.notifications import dedup as alerts
from accelmatrix.results import results_store
from accelmatrix.spec.loader import SuiteError, load_suite, suite_files
from accelmatrix.spec.suite import HistorySpec, RegressionRules

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite import Suite

log = logging.getLogger(__name__)

__all__ = ["HistoryPass", "analyse_suite", "maintenance_history"]


@dataclass(frozen=True)
class HistoryPass:
    """What one pass did: the change points' update (None: no metric followed) and the
    series verdicts (None: skipped)."""

    update: ChangeUpdate | None
    verdicts: pd.DataFrame | None


def analyse_suite(
    store: ResultsStore,
    dag_id: str,
    suite: Suite | None,
    *,
    full: bool,
    now: datetime | None = None,
    retest: Trigger | None = None,
    params: JsonObject | None = None,
) -> HistoryPass:
    """The pass (module docstring). ``suite``: the loaded suite, or None for a suite whose
    file is gone or invalid (default settings, nothing notified). ``full``: the whole
    history (maintenance) rather than the newest window (a gate). ``retest``: the trigger
    that starts re-test sessions (a gate's), with the run's ``params``."""

    tracked = tracked_metrics(suite) if suite is not None else {}
    if not tracked and not full:
        return HistoryPass(None, None)
    update = None
    if tracked:
        spec = suite.history if suite is not None else HistorySpec()
        update = update_changes(store, dag_id, spec, tracked, full=full)
        if retest is not None:
            start_confirmations(store, suite, dag_id, dict(params or {}), retest)
        sinks = suite.notify.alerts if suite is not None and suite.notify else []
        if sinks and update.to_notify:
            alerts.deliver_groups(sinks, store, update.to_notify)
    regression = suite.regression if suite is not None else RegressionRules()
    rules, window = rules_of(regression)
    verdicts, _ = classify_suite(
        store,
        dag_id,
        rules=rules,
        window_days=window,
        now=now,
        open_regressions=update.open_regressions if update else None,
    )
    return HistoryPass(update, verdicts)


def maintenance_history(*, now: datetime | None = None) -> JsonObject:
    """The maintenance DAG's ``analyse_history`` task, for every suite with runs in the
    store: ``analyse_suite`` over each series' whole history (the gate looks
    only at the last ``history.window`` points), with the suite's own settings when its
    suite file still exists (defaults if not)."""

    store = results_store()
    paths = {p.stem: p for p in suite_files(settings.suites_dir())}
    out: JsonObject = {}
    for dag_id in store.suite_dag_ids():
        suite = None
        if dag_id in paths:
            try:
                suite = load_suite(paths[dag_id])
            except SuiteError as e:
                log.warning("%s: default history settings (suite invalid: %s)", dag_id, e)
        done = analyse_suite(store, dag_id, suite, full=True, now=now)
        summary: JsonObject = {}
        if done.update is not None:
            summary["changes"] = done.update.line()
        assert done.verdicts is not None  # a full pass always classifies
        summary["series"] = {k: int(v) for k, v in done.verdicts["status"].value_counts().items()}
        out[dag_id] = summary
    return out
