"""A run's cells as a grid: the first axis as rows, the other axes combined as columns.

Rows and columns keep the order values first appear in the plan (the YAML order, since the
plan is the axes' product). Every text that came from the store goes through ``esc`` (HTML)
or ``q`` (URL component): cell ids and axis values are user input from a suite file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from html import escape
from urllib.parse import quote

from accelmatrix.ui.cause import RUN_LEVEL_STEPS
from accelmatrix.ui.model import KINDS, CellView

LABELS = {
    "passed": "passed",
    "failed": "failed",
    "infra": "infrastructure failure",
    "cancelled": "cancelled",
    "quarantined": "quarantined",
    "flaky": "flaky",
    "excluded": "excluded",
    "pending": "in progress",
}


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def q(text: str) -> str:
    return quote(text, safe="")


@dataclass
class Grid:
    row_axis: str | None
    col_axes: list[str]
    rows: list[str]
    cols: list[tuple[str, ...]]
    cells: dict[tuple[str, tuple[str, ...]], CellView]
    # Cells that share a position with another one (only possible with inconsistent axes).
    extra: list[CellView]


def layout(cells: list[CellView], axes: list[str]) -> Grid:
    row_axis = axes[0] if axes else None
    col_axes = axes[1:]
    # Each axis' values in the order they first appear (plan order, excluded cells last);
    # rows and columns are then sorted by those ranks, i.e. the axes' product order, even
    # where a value's first cell was excluded.
    rank: dict[str, dict[str, int]] = {a: {} for a in axes}
    for c in cells:
        for a in axes:
            v = c.axes.get(a, "")
            rank[a].setdefault(v, len(rank[a]))
    placed: dict[tuple[str, tuple[str, ...]], CellView] = {}
    extra: list[CellView] = []
    rows: set[str] = set()
    cols: set[tuple[str, ...]] = set()
    for c in cells:
        r = c.axes.get(row_axis, "") if row_axis else c.cell_id
        col = tuple(c.axes.get(a, "") for a in col_axes)
        rows.add(r)
        cols.add(col)
        if (r, col) in placed:
            extra.append(c)
        else:
            placed[(r, col)] = c
    row_order = (
        sorted(rows, key=lambda v: rank[row_axis][v])
        if row_axis
        else list(dict.fromkeys(c.cell_id for c in cells))
    )
    col_order = sorted(
        cols, key=lambda t: tuple(rank[a][v] for a, v in zip(col_axes, t, strict=True))
    )
    return Grid(row_axis, col_axes, row_order, col_order, placed, extra)


def _header_rows(grid: Grid) -> list[str]:
    """One header row per column axis; equal neighbours under the same parent merge."""
    out = []
    n = len(grid.col_axes)
    corner = (
        f'<th class="corner" rowspan="{max(n, 1)}">{esc(grid.row_axis or "cell")}'
        + (" \\ " + esc(", ".join(grid.col_axes)) if grid.col_axes else "")
        + "</th>"
    )
    if n == 0:
        return [f"<tr>{corner}<th></th></tr>"]
    for level in range(n):
        parts = [corner] if level == 0 else []
        i = 0
        while i < len(grid.cols):
            j = i + 1
            if level < n - 1:
                while j < len(grid.cols) and grid.cols[j][: level + 1] == grid.cols[i][: level + 1]:
                    j += 1
            span = f' colspan="{j - i}"' if j - i > 1 else ""
            value = grid.cols[i][level]
            parts.append(
                f'<th class="col" scope="col"{span} title="{esc(grid.col_axes[level])}">'
                f"{esc(value)}</th>"
            )
            i = j
        out.append("<tr>" + "".join(parts) + "</tr>")
    return out


def log_url(ui_base: str, dag_id: str, run_id: str, cell: CellView) -> str | None:
    """The log of the cell's task that failed (``cell.step``; ``run`` for a cell without a
    failure) in the Airflow 3.3 UI, whose task-instance page opens on its log:
    /dags/{dag}/runs/{run}/tasks/{machine}.{step}/mapped/{index}, or .../tasks/{step} for a
    run-level task (preflight)."""
    step = cell.step or "run"
    run = f"{ui_base}/dags/{q(dag_id)}/runs/{q(run_id)}/tasks"
    if step in RUN_LEVEL_STEPS:
        return f"{run}/{q(step)}"
    if cell.map_index is None or not cell.machine:
        return None
    return f"{run}/{q(cell.machine + '.' + step)}/mapped/{cell.map_index}"


def file_url(app_base: str, dag_id: str, rel: str) -> str:
    """The app's URL of an evidence file (``rel``: relative to the suite's artifacts dir)."""
    path = "/".join(q(part) for part in rel.split("/"))
    return f"{app_base}/suites/{q(dag_id)}/files/{path}"


def docs_url(app_base: str, dag_id: str, cell: CellView) -> str | None:
    docs = cell.data_docs or (cell.evidence.docs if cell.evidence else None)
    return file_url(app_base, dag_id, docs) if docs else None


# The cell's evidence tab on its task instance page in Airflow's UI (ui/tabs.py).
CELL_TAB = "plugin/accelmatrix-cell"


def evidence_tab_url(ui_base: str, dag_id: str, run_id: str, cell: CellView) -> str | None:
    """The cell's evidence as a tab of its ``run`` task instance in Airflow's UI (state and
    why, stdout, metrics, trace, Data Docs, re-runs in one page)."""
    if cell.map_index is None or not cell.machine:
        return None
    url = log_url(ui_base, dag_id, run_id, replace(cell, step="run"))
    return f"{url}/{CELL_TAB}" if url else None


# The evidence files linked on each cell: (CellFiles field, label, title).
FILE_LINKS = (
    ("stdout", "stdout", "the workload's output"),
    ("metrics", "metrics", "the collected metrics table"),
    ("trace", "trace", "the profiler trace"),
)


# A failed cell links the log of each of these steps besides its failing step's: the
# workload's output (run) and the verdict table (evaluate), whichever failed first.
BOTH_LOGS = (("run", "run log", "runlog"), ("evaluate", "evaluate log", "evallog"))


def _step_log_links(cell: CellView, ui_base: str, dag_id: str, run_id: str) -> list[str]:
    """The run and evaluate logs of a failed cell, beside its ``log`` link."""
    if cell.kind not in ("failed", "infra") or (cell.step or "run") in RUN_LEVEL_STEPS:
        return []
    out = []
    for step, label, cls in BOTH_LOGS:
        if step == (cell.step or "run"):
            continue
        url = log_url(ui_base, dag_id, run_id, replace(cell, step=step))
        if url:
            out.append(
                f'<a class="{cls}" href="{esc(url)}" data-step="{step}" '
                f'title="log of the {step} task">{label}</a>'
            )
    return out


def render_cell(cell: CellView, ui_base: str, app_base: str, dag_id: str, run_id: str) -> str:
    title = [cell.cell_id, f"state: {cell.state}"]
    if cell.quarantined:
        title.append("quarantined (never fails the run)")
    if cell.failed_checks:
        title.append("failed checks: " + ", ".join(cell.failed_checks))
    for bench, metric, status in cell.series:
        title.append(f"{bench} {metric}: {status}")
    if cell.message:
        title.append(cell.message[:500])
    links = []
    log = log_url(ui_base, dag_id, run_id, cell)
    if log:
        step = cell.step or "run"
        links.append(
            f'<a class="log" href="{esc(log)}" data-step="{esc(step)}" '
            f'title="log of the {esc(step)} task">log</a>'
        )
    links += _step_log_links(cell, ui_base, dag_id, run_id)
    for kind, label, what in FILE_LINKS:
        rel = getattr(cell.evidence, kind, None) if cell.evidence else None
        if rel:
            links.append(
                f'<a class="{kind}" href="{esc(file_url(app_base, dag_id, rel))}" '
                f'target="_blank" rel="noopener" title="{what}">{label}</a>'
            )
    docs = docs_url(app_base, dag_id, cell)
    if docs:
        links.append(f'<a class="docs" href="{esc(docs)}" target="_blank" rel="noopener">docs</a>')
    tab = evidence_tab_url(ui_base, dag_id, run_id, cell)
    if tab:
        links.append(
            f'<a class="evidence" href="{esc(tab)}" '
            'title="the cell\'s evidence in Airflow: state and why, files, re-runs">evidence</a>'
        )
    marks = (["quarantined"] if cell.quarantined else []) + cell.badges
    badges = "".join(f'<span class="badge b-{b}">{esc(b)}</span>' for b in marks)
    state = cell.state if cell.kind != "infra" else "infra failed"
    if cell.kind == "cancelled" and cell.state != "cancelled":
        state = f"no verdict ({cell.state})"
    cause = "".join(f'<span class="why">{esc(line)}</span>' for line in cell.cause)
    # The history view links here as #c<plan index> (short: it has 30,000 such links).
    anchor = f' id="c{cell.cell_index}"' if cell.cell_index is not None else ""
    attempt = ""
    if cell.attempt > 1:
        when = f" {cell.attempt_at:%m-%d %H:%M}" if cell.attempt_at else ""
        attempt = f'<span class="attempt">attempt {cell.attempt}{esc(when)}</span>'
    return (
        f'<td class="cell k-{cell.kind}"{anchor} '
        f'data-cell-id="{esc(cell.cell_id)}" '
        f'data-kind="{cell.kind}" data-state="{esc(cell.state)}" '
        f'title="{esc(chr(10).join(title))}">'
        f'<span class="st">{esc(state)}</span>{badges}{attempt}{cause}'
        f'<span class="links">{" ".join(links)}</span></td>'
    )


def render_grid(
    cells: list[CellView], axes: list[str], *, ui_base: str, app_base: str, dag_id: str, run_id: str
) -> str:
    grid = layout(cells, axes)
    body = []
    for r in grid.rows:
        parts = [f'<th class="row" scope="row">{esc(r)}</th>']
        for col in grid.cols:
            cell = grid.cells.get((r, col))
            if cell is None:
                parts.append('<td class="cell k-none" data-kind="none"></td>')
            else:
                parts.append(render_cell(cell, ui_base, app_base, dag_id, run_id))
        body.append("<tr>" + "".join(parts) + "</tr>")
    html = (
        '<div class="gridwrap"><table class="grid" id="grid">'
        + "<thead>"
        + "".join(_header_rows(grid))
        + "</thead><tbody>"
        + "".join(body)
        + "</tbody></table></div>"
    )
    if grid.extra:
        items = "".join(
            f"<li><table><tr>{render_cell(c, ui_base, app_base, dag_id, run_id)}</tr></table>"
            f"{esc(c.cell_id)}</li>"
            for c in grid.extra
        )
        html += f'<p>Cells whose axes collide with another cell:</p><ul class="extra">{items}</ul>'
    return html


def render_legend(counts: dict[str, int]) -> str:
    items = "".join(
        f'<li><span class="swatch k-{k}"></span>{esc(LABELS[k])} '
        f'<b data-count="{k}">{counts.get(k, 0)}</b></li>'
        for k in KINDS
    )
    return f'<ul class="legend">{items}</ul>'
