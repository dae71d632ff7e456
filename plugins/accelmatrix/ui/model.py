"""What the matrix page shows, read from the results store: plain dataclasses, no HTML.

Kept apart from rendering so the HTML can be tested on planted rows and the reads can be
timed on their own (bench/bench_page.py). The perf trends (points, verdicts, charts) are
built in ``accelmatrix.ui.trend_model`` and importable from here as before. Every value here
is raw (unescaped) text from the store; escaping is the renderer's job, done once, at the
last moment.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix import cell_state, settings
from accelmatrix.cell_state import CellState, RunState
from accelmatrix.contracts.run_records import CellRecord, RunRecord
from accelmatrix.ui import files
from accelmatrix.ui.cause import (
    WORKLOAD_STATES,
    FailedCheck,
    cause_lines,
    check_rows,
    failing_step,
    last_log_line,
)
from accelmatrix.ui.trend_model import (
    STATUS_PRIORITY,
    History,
    Point,
    Series,
    Trend,
    _history,
    _trends,
    _verdicts,
    attach_changes,
    current_bounds,
    tracked_trends,
)

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

log = logging.getLogger(__name__)

# What a cell's colour says, in the order the legend lists them.
KINDS = ("passed", "failed", "infra", "cancelled", "quarantined", "flaky", "excluded", "pending")
# States of a cell still on its way (not a verdict yet).
PENDING_STATES = cell_state.PENDING
# A step of the cell's life crashed (lifecycle.collect, record_evaluation_error): shown as
# failed like any other non-passed state, with the step in the state and the error in the
# message.
STEP_FAILED_STATES = cell_state.STEP_FAILED
DEFAULT_WINDOW_DAYS = 30
DEFAULT_MAX_SERIES = 8
RUN_PICKER_LIMIT = 100


# Run states after which nothing of the run is in progress any more.
# ("success" and "cancelled": values older accelmatrix versions wrote.)
FINISHED_RUN_STATES = frozenset(
    {RunState.PASSED, RunState.FAILED, RunState.OVER_BUDGET, "success", "cancelled"}
)


def run_finished(run: RunRecord) -> bool:
    return run.finished_at is not None or (run.state in FINISHED_RUN_STATES)


def cell_kind(state: str, quarantined: bool, flaky: bool, *, finished: bool = False) -> str:
    """The colour class of a cell: excluded and quarantined first (they never fail a run),
    then infrastructure failure, cancelled (stopped from outside: not a test verdict, its
    own colour), any other failure, and flaky only for a cell that passed (a failure in
    this run says more than the history does). In a finished run nothing is in progress: a
    cell still in an in-flight state never got its verdict and is shown as cancelled.
    Any other state (one this page does not know yet) is a failure."""
    if state == CellState.EXCLUDED:
        return "excluded"
    if quarantined:
        return "quarantined"
    if state == CellState.INFRA_FAILED:
        return "infra"
    if state == CellState.CANCELLED:
        return "cancelled"
    if state in PENDING_STATES:
        return "cancelled" if finished else "pending"
    if state == CellState.PASSED:
        return "flaky" if flaky else "passed"
    return "failed"


@dataclass
class CellView:
    cell_id: str
    axes: dict[str, str]
    state: str
    kind: str
    quarantined: bool
    message: str
    machine: str | None
    map_index: int | None  # index of the cell in its machine's mapped task group
    data_docs: str | None  # posix path relative to the suite's artifacts dir
    failed_checks: list[str] = field(default_factory=list)
    cell_index: int | None = None  # index in the run's plan (None: excluded)
    cause: list[str] = field(default_factory=list)  # why it did not pass, <= 2 lines
    step: str | None = None  # the task whose log shows the cause (log link target)
    attempt: int = 1  # > 1: the cell was cleared and re-ran
    attempt_at: datetime | None = None  # when that attempt ran (or last wrote the cell)
    # (benchmark, metric, status) of every perf series of the cell.
    series: list[tuple[str, str, str]] = field(default_factory=list)
    # The cell's stdout, metrics table, trace and Data Docs (files.cell_files): linked from
    # the cell, so the evidence is one click away.
    evidence: files.CellFiles | None = None

    @property
    def badges(self) -> list[str]:
        """Series verdicts worth a mark on the cell (flaky, regression, suspicious)."""
        found = {s for _, _, s in self.series}
        return [s for s in ("regression", "flaky", "suspicious") if s in found]


@dataclass
class SuiteSummary:
    dag_id: str
    runs: int
    latest: RunRecord | None


@dataclass
class RunView:
    dag_id: str
    run: RunRecord
    runs: list[RunRecord]  # the run picker, newest first
    is_latest: bool
    axes: list[str]
    cells: list[CellView]
    trends: list[Trend]
    verdict_source: str  # "series_status" (stored by the gate) or "computed" (here)
    window_days: int
    run_docs: str | None = None  # the run table's Data Docs, relative to the suite's files

    @property
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.cells:
            out[c.kind] += 1
        return out


# -- suites and runs -----------------------------------------------------------------------
def list_suites(store: ResultsStore) -> list[SuiteSummary]:
    """Every DAG with a run in the store, with its latest run (never a follow-up run:
    ``suite_runs``)."""
    out = []
    for dag_id in store.suite_dag_ids():
        runs = suite_runs(store, dag_id)
        out.append(SuiteSummary(dag_id=dag_id, runs=len(runs), latest=runs[0] if runs else None))
    return out


def suite_runs(store: ResultsStore, dag_id: str, limit: int = RUN_PICKER_LIMIT) -> list[RunRecord]:
    """The suite's runs, newest build first: scheduled, manual and backfill runs, never a
    follow-up run (a confirm, bisect or compare re-test of older builds, listed on the
    history page); all runs when the suite has only follow-ups."""
    return store.get_runs(dag_id, limit=limit, which="suite") or store.get_runs(dag_id, limit=limit)


def run_time(run: RunRecord) -> datetime | None:
    """Where a run sits in history: its logical date, else its start (a manual run)."""
    return run.logical_date or run.started_at or run.created_at


def load_run_view(
    store: ResultsStore,
    dag_id: str,
    run_id: str | None = None,
    *,
    window_days: int = DEFAULT_WINDOW_DAYS,
    max_series: int = DEFAULT_MAX_SERIES,
    log_tails: bool = False,
    tries: dict[tuple[str, int], tuple[int, datetime | None]] | None = None,
    stopped_by: str | None = None,
) -> RunView | None:
    """The page of one run (the latest when ``run_id`` is None); None if there is none.

    ``log_tails``: read each failed workload's last log line (only for users who may read
    task logs). ``tries``: (task_id, map_index) -> (try_number, start) of the run's task
    instances from Airflow's database, so a cleared and re-run cell shows its attempt.
    ``stopped_by``: who stopped the run and when (Airflow's audit log), for cancelled cells.

    The latest run and the run picker are the suite's own runs (``suite_runs``): a
    follow-up run opens only by its id (the history page's re-tests link to it)."""
    runs = suite_runs(store, dag_id)
    if not runs:
        return None
    latest = runs[0].run_id
    if run_id is None:
        run = runs[0]
    else:
        run = next((r for r in runs if r.run_id == run_id), None) or store.get_run(dag_id, run_id)
        if run is None:
            return None
        if all(r.run_id != run_id for r in runs):
            runs = [run, *runs]
    is_latest = run.run_id == latest

    until = run_time(run) or datetime.now(UTC)
    hist = _history(store, dag_id, until - timedelta(days=window_days), until)
    verdicts, source = _verdicts(store, dag_id, hist, use_stored=is_latest)
    by_cell: dict[str, list[tuple[str, str, str]]] = {}
    for (bench, cell_id, metric), status in verdicts.items():
        by_cell.setdefault(cell_id, []).append((bench, metric, status))

    rows = store.get_cells(dag_id, run.run_id)
    failed = check_rows(store.get_checks(dag_id, run.run_id))
    cells = _cell_views(
        dag_id,
        rows,
        failed,
        by_cell,
        run_id=run.run_id,
        finished=run_finished(run),
        log_tails=log_tails,
        tries=tries,
        stopped_by=stopped_by,
    )
    trends = _trends(dag_id, hist, verdicts, max_series, store)
    since = until - timedelta(days=window_days)
    trends += tracked_trends(store, dag_id, since, until, max_series, {t.metric for t in trends})
    attach_changes(store, dag_id, trends, since=since)
    return RunView(
        dag_id=dag_id,
        run=run,
        runs=runs,
        is_latest=is_latest,
        axes=axis_order(cells),
        cells=cells,
        trends=trends,
        verdict_source=source,
        window_days=window_days,
        run_docs=files.run_docs(dag_id, run.run_id),
    )


# -- cells ---------------------------------------------------------------------------------
def _cell_views(
    dag_id: str,
    rows: list[CellRecord],
    failed: dict[str, list[FailedCheck]],
    series: dict[str, list[tuple[str, str, str]]],
    *,
    run_id: str = "",
    finished: bool = False,
    log_tails: bool = False,
    tries: dict[tuple[str, int], tuple[int, datetime | None]] | None = None,
    stopped_by: str | None = None,
) -> list[CellView]:
    # The run task of a cell is `<machine>.run` mapped over the machine's cells in plan
    # order (dag_factory): its map index is the cell's rank among them.
    rank: dict[str, int] = {}
    next_index: dict[str, int] = {}
    planned = [r for r in rows if r.cell_index is not None]
    for r in sorted(planned, key=lambda r: r.cell_index):
        m = r.machine or ""
        rank[r.cell_id] = next_index.get(m, 0)
        next_index[m] = rank[r.cell_id] + 1
    docs_root = os.path.normpath(settings.artifacts_dir() / settings.safe_name(dag_id))
    out = []
    for r in rows:
        cid = r.cell_id
        state = r.state or CellState.PLANNED
        cell_series = series.get(cid, [])
        flaky = any(s == "flaky" for _, _, s in cell_series)
        kind = cell_kind(state, bool(r.quarantined), flaky, finished=finished)
        message = r.message or r.excluded_reason or ""
        checks = failed.get(cid, [])
        view = CellView(
            cell_id=cid,
            axes={str(k): str(v) for k, v in (r.axes or {}).items()},
            state=state,
            kind=kind,
            quarantined=bool(r.quarantined),
            message=message,
            machine=r.machine,
            map_index=rank.get(cid) if state != CellState.EXCLUDED else None,
            cell_index=r.cell_index,
            data_docs=_relative_to(r.data_docs, docs_root),
            failed_checks=[c.name for c in checks],
            series=sorted(cell_series),
            attempt=max(1, int(r.attempt or 1)),
            attempt_at=r.run_started_at or r.updated_at,
        )
        if state not in (CellState.PASSED, CellState.EXCLUDED) and (kind != "pending"):
            if state in PENDING_STATES:  # a finished run: it never got a verdict
                view.cause = [f"no verdict: the run ended while this cell was {state}"]
                view.step = "run"
            else:
                line = None
                if log_tails and state in WORKLOAD_STATES:
                    log = settings.cell_artifacts_dir(dag_id, run_id, cid) / "output.log"
                    line = last_log_line(log)
                view.cause = cause_lines(state, message, checks, r.exit_code, line)
                view.step = failing_step(state, message)
            if kind == "cancelled" and stopped_by:
                view.cause = [stopped_by, *view.cause][:2]
        if state != CellState.EXCLUDED and run_id:
            view.evidence = files.cell_files(dag_id, run_id, cid, view.data_docs)
        if tries and view.machine and view.map_index is not None:
            got = tries.get((f"{view.machine}.run", view.map_index))
            if got and got[0] > view.attempt:
                view.attempt, view.attempt_at = got[0], got[1] or view.attempt_at
        out.append(view)
    return out


def _relative_to(path: str | None, root: str) -> str | None:
    """``path`` relative to ``root`` (posix), or None when it is elsewhere or absent."""
    if not path:
        return None
    p = os.path.normpath(path)
    if not p.startswith(root + os.sep):
        return None
    return Path(os.path.relpath(p, root)).as_posix()


def axis_order(cells: list[CellView]) -> list[str]:
    """The suite's axis order, recovered from cell ids (``a=x,b=y`` in YAML order): the
    stored ``axes`` JSON has sorted keys. Falls back to sorted names if no id parses."""
    names = sorted({k for c in cells for k in c.axes})
    for c in cells:
        if set(c.axes) == set(names):
            order = _order_from_id(c.cell_id, c.axes)
            if order is not None:
                return order
    return names


def _order_from_id(cell_id: str, axes: dict[str, str]) -> list[str] | None:
    def walk(pos: int, left: list[str]) -> list[str] | None:
        if not left:
            return [] if pos == len(cell_id) else None
        for k in left:
            part = f"{k}={axes[k]}"
            end = pos + len(part)
            if cell_id.startswith(part, pos) and (
                (end == len(cell_id) and len(left) == 1) or cell_id.startswith(",", end)
            ):
                rest = walk(end + 1 if len(left) > 1 else end, [x for x in left if x != k])
                if rest is not None:
                    return [k, *rest]
        return None

    return walk(0, list(axes))


# The trend types and reads moved to trend_model.py; importable from here as before.
__all__ = [
    "DEFAULT_MAX_SERIES",
    "DEFAULT_WINDOW_DAYS",
    "FINISHED_RUN_STATES",
    "KINDS",
    "PENDING_STATES",
    "RUN_PICKER_LIMIT",
    "STATUS_PRIORITY",
    "STEP_FAILED_STATES",
    "CellView",
    "History",
    "Point",
    "RunView",
    "Series",
    "SuiteSummary",
    "Trend",
    "axis_order",
    "cell_kind",
    "current_bounds",
    "list_suites",
    "load_run_view",
    "run_finished",
    "run_time",
]
