"""One cell's evidence on one page: the "Cell evidence" tab of its task instances in Airflow.

On-call used to find a cell's metrics and profiler trace through the ``collect`` task's log
(about five clicks from the DAG page). Every task of a cell (``<machine>.run``,
``.collect``, ``.evaluate``, ...) is mapped over the machine's cells in plan order, so a task
instance ``(task_id, map_index)`` names exactly one cell of its run; this page shows that
cell's state and why (failed checks: expected against observed), the links to its stdout,
metrics table, trace, Data Docs and its tasks' logs, the metrics table itself, the last
lines of its output, and its re-runs. A task that is not a cell's (plan, gate) has no cell:
the app shows the run's matrix for it instead.

Values are raw text from the store and the workload's files: everything goes through
``esc``/``q`` (ui/grid.py) here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.cell_state import CellState
from accelmatrix.contracts.run_records import RunRecord
from accelmatrix.ui import files
from accelmatrix.ui.cause import FailedCheck, check_rows
from accelmatrix.ui.grid import LABELS, esc, file_url, log_url, q
from accelmatrix.ui.model import CellView, _cell_views, run_finished
from accelmatrix.ui.oncall import RerunNote
from accelmatrix.ui.render import page

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

__all__ = ["CellEvidence", "MetricRow", "cell_of_task", "load_cell", "render_cell_page"]

MAX_METRICS = 200  # rows of the metrics table shown (the file link has all)
TAIL_LINES = 20  # last lines of the workload's output shown
TAIL_BYTES = 64 * 1024  # read at most this much from the end of the output


@dataclass(frozen=True)
class MetricRow:
    """One metric of the cell: how many values and the last one (by step)."""

    name: str
    values: int
    last_step: Any
    last_value: Any
    unit: str
    source: str


@dataclass
class CellEvidence:
    dag_id: str
    run: RunRecord
    task_id: str
    cell: CellView
    checks: list[FailedCheck] = field(default_factory=list)
    metrics: list[MetricRow] = field(default_factory=list)
    metrics_total: int = 0
    tail: list[str] | None = None  # None: not readable by this user, or no output
    reruns: list[RerunNote] = field(default_factory=list)


def cell_of_task(cells: list[CellView], task_id: str, map_index: int) -> CellView | None:
    """The cell whose task group ``task_id`` belongs to (``<machine>.<step>``) at
    ``map_index``; None for a run-level task or an index no cell has."""
    if map_index < 0 or "." not in task_id:
        return None
    machine = task_id.rsplit(".", 1)[0]
    return next((c for c in cells if c.machine == machine and c.map_index == map_index), None)


def load_cell(
    store: ResultsStore,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    *,
    log_tails: bool = False,
    tries: dict[tuple[str, int], tuple[int, Any]] | None = None,
    reruns: list[RerunNote] | None = None,
) -> CellEvidence | None:
    """The evidence of the cell task ``task_id[map_index]`` of the run; None when the run
    has no results or no such cell. ``log_tails``: read the last lines of its output (only
    for users who may read task logs)."""
    run = store.get_run(dag_id, run_id)
    if run is None:
        return None
    failed = check_rows(store.get_checks(dag_id, run_id))
    cells = _cell_views(
        dag_id,
        store.get_cells(dag_id, run_id),
        failed,
        {},
        run_id=run_id,
        finished=run_finished(run),
        log_tails=log_tails,
        tries=tries,
    )
    cell = cell_of_task(cells, task_id, map_index)
    if cell is None:
        return None
    art = settings.cell_artifacts_dir(dag_id, run_id, cell.cell_id)
    metrics, total = _metrics(art / "metrics.json")
    return CellEvidence(
        dag_id=dag_id,
        run=run,
        task_id=task_id,
        cell=cell,
        checks=failed.get(cell.cell_id, []),
        metrics=metrics,
        metrics_total=total,
        tail=_tail(art / "output.log") if log_tails else None,
        reruns=[r for r in reruns or [] if cell.cell_id in r.cells],
    )


def _metrics(path: Path) -> tuple[list[MetricRow], int]:
    """The collected metrics table (collect_step writes one row per name and step) as one
    row per metric, capped at MAX_METRICS; and how many metrics there are."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], 0
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get("name") is not None:
            by_name.setdefault(str(r["name"]), []).append(r)
    out = []
    for name in sorted(by_name)[:MAX_METRICS]:
        rs = by_name[name]
        last = max(rs, key=lambda r: (r.get("step") is not None, r.get("step") or 0))
        out.append(
            MetricRow(
                name=name,
                values=len(rs),
                last_step=last.get("step"),
                last_value=last.get("value"),
                unit=str(last.get("unit") or ""),
                source=str(last.get("source") or ""),
            )
        )
    return out, len(by_name)


def _tail(path: Path) -> list[str] | None:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first line read may be cut
    return lines[-TAIL_LINES:]


def _value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def render_cell_page(ev: CellEvidence, *, ui_base: str, app_base: str, page_base: str) -> str:
    """The page. It leads with the verdict and why: a failed cell's first line says it
    failed and which check, never a green summary above a red detail."""

    c = ev.cell
    run_id = ev.run.run_id
    dag = q(ev.dag_id)
    kind = LABELS.get(c.kind, c.kind)
    verdict = f"{kind}" + (f" (state {c.state})" if c.state not in (kind, "passed") else "")
    why = c.cause or ([c.message] if c.message and c.state != CellState.PASSED else [])
    lead = (
        f'<p class="verdict k-{esc(c.kind)}" id="verdict" data-kind="{esc(c.kind)}">'
        f"<b>{esc(verdict)}</b>"
        + "".join(f'<span class="why"> &middot; {esc(line)}</span>' for line in why)
        + "</p>"
    )
    checks = ""
    if ev.checks:
        items = "".join(f"<li>{esc(fc.line())}</li>" for fc in ev.checks)
        checks = f'<h2>Failed checks</h2><ul id="failed-checks">{items}</ul>'

    links = []
    labels = {
        "stdout": "stdout (the workload's output)",
        "metrics": "metrics table (metrics.json)",
        "trace": "profiler trace",
        "docs": "Data Docs (every check, expected against observed)",
    }
    for kind_, rel in (c.evidence or files.CellFiles(docs=c.data_docs)).links():
        links.append(
            f'<li><a class="{kind_}" href="{esc(file_url(app_base, ev.dag_id, rel))}" '
            f'target="_blank" rel="noopener">{esc(labels[kind_])}</a></li>'
        )
    for step in ("run", "collect", "evaluate"):
        url = log_url(ui_base, ev.dag_id, run_id, dc_replace(c, step=step))
        if url:
            links.append(
                f'<li><a class="log-{step}" href="{esc(url)}">log of the {step} task in '
                "Airflow</a></li>"
            )
    evidence = f'<h2>Evidence</h2><ul id="evidence">{"".join(links)}</ul>'

    metrics = ""
    if ev.metrics:
        rows = "".join(
            f'<tr data-metric="{esc(m.name)}"><td>{esc(m.name)}</td><td>{esc(_value(m.last_value))}'
            f"</td><td>{esc(m.unit)}</td><td>{esc(m.last_step)}</td><td>{m.values}</td>"
            f"<td>{esc(m.source)}</td></tr>"
            for m in ev.metrics
        )
        more = (
            f'<p class="meta">{ev.metrics_total - len(ev.metrics)} more in the metrics table.</p>'
            if ev.metrics_total > len(ev.metrics)
            else ""
        )
        metrics = (
            '<h2>Metrics</h2><table class="suites" id="metrics"><tr><th>metric</th>'
            "<th>last value</th><th>unit</th><th>at step</th><th>values</th><th>source</th>"
            f"</tr>{rows}</table>{more}"
        )
    tail = ""
    if ev.tail:
        tail = (
            f"<h2>Last {len(ev.tail)} lines of its output</h2>"
            f'<pre id="tail">{esc(chr(10).join(ev.tail))}</pre>'
        )
    attempts = []
    if c.attempt > 1:
        when = f" ({c.attempt_at:%Y-%m-%d %H:%M} UTC)" if c.attempt_at else ""
        attempts.append(f"<li>this is attempt {c.attempt}{esc(when)}</li>")
    attempts += [f"<li>{esc(r.line())}</li>" for r in ev.reruns]
    reruns = f'<h2>Re-runs</h2><ul id="reruns">{"".join(attempts)}</ul>' if attempts else ""
    anchor = f"#c{c.cell_index}" if c.cell_index is not None else ""
    matrix = f"{page_base}/suites/{dag}?run_id={q(run_id)}{anchor}"
    body = (
        f'<nav class="crumbs"><a href="{esc(page_base)}/suites/{esc(dag)}">{esc(ev.dag_id)}</a>'
        f' / <a class="matrix" href="{esc(matrix)}">run {esc(run_id)}</a> / '
        f"{esc(c.cell_id)}</nav>"
        f'<h1 id="cell" data-cell-id="{esc(c.cell_id)}">cell {esc(c.cell_id)}</h1>'
        f"{lead}"
        f'<p class="meta">task {esc(ev.task_id)} [{esc(c.map_index)}] on machine '
        f"{esc(c.machine or '-')} &middot; axes "
        + esc(", ".join(f"{k}={v}" for k, v in c.axes.items()))
        + "</p>"
        + checks
        + evidence
        + metrics
        + tail
        + reruns
    )
    return page(f"{ev.dag_id} {c.cell_id}", body)
