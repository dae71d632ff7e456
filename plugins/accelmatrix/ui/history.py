"""A suite's history at a glance: cells x the last N runs, like the PyTorch HUD's commits x
jobs, so a flaky or newly broken cell stands out without opening run after run.

Each square is a cell in one run, coloured like the grid (same kinds) and linking to that
run's page at the cell. Rows are marked from the verdict sequence over the runs shown:
``new`` (failing now, passed the run before), ``broken`` (failing for 2+ runs after
passing earlier in the window), ``flaky`` (2+ flips between pass and fail); perf series
the gate classified as a regression are marked ``regression``. Marked rows come first.

Read in one query over the cells table (30,720 rows for 1,024 cells x 30 runs) and
rendered as one string join: bench/bench_page.py times it against the <= 1 s goal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import select

from accelmatrix.results import schema
from accelmatrix.ui.grid import LABELS, esc, q
from accelmatrix.ui.model import cell_kind, run_finished, run_time

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

DEFAULT_RUNS = 30
MAX_RUNS = 100
MARKS = ("new", "broken", "regression", "flaky")
MARK_TEXT = {
    "new": "newly failing",
    "broken": "broken since",
    "regression": "perf regression",
    "flaky": "flaky",
}
# Kinds that are a test verdict (what flips, what "failing" means); infrastructure
# failures, cancellations, exclusions and unfinished cells say nothing about the code.
VERDICT = {"passed": "pass", "flaky": "pass", "quarantined": None, "failed": "fail"}


@dataclass
class Row:
    cell_id: str
    order: tuple[int, str]
    # per run, oldest first: (kind, state, plan index in that run) or None (not in it)
    squares: list[tuple[str, str, int | None] | None]
    marks: list[str] = field(default_factory=list)
    since: str | None = None  # run id where a "broken" streak began
    order_run: int = -1  # the run whose plan index ``order`` comes from


@dataclass
class HistoryView:
    dag_id: str
    runs: list[dict[str, Any]]  # oldest first
    rows: list[Row]

    @property
    def counts(self) -> dict[str, int]:
        return {m: sum(m in r.marks for r in self.rows) for m in MARKS}


def load_history(
    store: ResultsStore, dag_id: str, n_runs: int = DEFAULT_RUNS
) -> HistoryView | None:
    runs = list(reversed(store.get_runs(dag_id, limit=max(1, min(n_runs, MAX_RUNS)))))
    if not runs:
        return None
    pos = {r["run_id"]: i for i, r in enumerate(runs)}
    finished = [run_finished(r) for r in runs]
    c = schema.cells.c
    stmt = select(c.run_id, c.cell_id, c.cell_index, c.state, c.quarantined).where(
        c.dag_id == dag_id, c.run_id.in_(list(pos))
    )
    rows: dict[str, Row] = {}
    with store._reading() as conn:  # noqa: SLF001 - one read-only query, no store API for it
        for run_id, cid, index, state, quarantined in conn.execute(stmt):
            i = pos[run_id]
            row = rows.get(cid)
            if row is None:
                row = rows[cid] = Row(cid, (1 << 30, cid), [None] * len(runs))
            state = state or "planned"
            kind = cell_kind(state, bool(quarantined), False, finished=finished[i])
            row.squares[i] = (kind, state, index)
            if index is not None and i >= row.order_run:  # the latest plan's order wins
                row.order, row.order_run = (index, cid), i
    regressions = {
        r["cell_id"] for r in store.get_series_status(dag_id) if r["status"] == "regression"
    }
    for row in rows.values():
        _mark(row, runs, row.cell_id in regressions)
    rank = {m: i for i, m in enumerate(MARKS)}
    ordered = sorted(
        rows.values(),
        key=lambda r: (min((rank[m] for m in r.marks), default=len(rank)), r.order),
    )
    return HistoryView(dag_id, runs, ordered)


def _mark(row: Row, runs: list[dict[str, Any]], perf_regression: bool) -> None:
    seq = [(i, VERDICT.get(s[0])) for i, s in enumerate(row.squares) if s is not None]
    seq = [(i, v) for i, v in seq if v is not None]
    verdicts = [v for _, v in seq]
    flips = sum(a != b for a, b in zip(verdicts, verdicts[1:], strict=False))
    if verdicts and verdicts[-1] == "fail":
        streak = 0
        while streak < len(verdicts) and verdicts[-1 - streak] == "fail":
            streak += 1
        passed_before = streak < len(verdicts)
        if streak == 1 and passed_before:
            row.marks.append("new")
        elif streak >= 2 and passed_before:
            row.marks.append("broken")
            row.since = runs[seq[-streak][0]]["run_id"]
    if perf_regression:
        row.marks.append("regression")
    if flips >= 2:
        row.marks.append("flaky")


def render_history(view: HistoryView, *, page_base: str, n_runs: int) -> str:
    """Compact on purpose: 30,720 squares at 1,024 x 30, so a square is one <a> (no table
    cell around it), its link names the run without needless escapes and the cell by its
    plan index (``#c<index>``, the anchor the run page gives each cell)."""
    suite = f"{page_base}/suites/{q(view.dag_id)}"
    run_links = [f"{suite}?run_id={quote(r['run_id'], safe=':')}" for r in view.runs]
    heads = "".join(
        f'<a class="run" href="{esc(link)}" title="{esc(r["run_id"])} '
        f'({esc(r.get("state") or "-")})">{esc(_short(r))}</a>'
        for r, link in zip(view.runs, run_links, strict=True)
    )
    body = []
    for row in view.rows:
        marks = "".join(
            f'<span class="badge b-{m}" title="{esc(MARK_TEXT[m])}'
            + (f" {esc(row.since)}" if m == "broken" and row.since else "")
            + f'">{esc(m)}</span>'
            for m in row.marks
        )
        squares = []
        for sq, link in zip(row.squares, run_links, strict=True):
            if sq is None:
                squares.append("<i></i>")
                continue
            kind, state, index = sq
            tip = "" if kind == "passed" else f' title="{esc(state)}"'
            frag = f"#c{index}" if index is not None else ""
            squares.append(f'<a class="k-{kind}"{tip} href="{esc(link)}{frag}"></a>')
        body.append(
            f'<tr data-cell-id="{esc(row.cell_id)}" data-marks="{" ".join(row.marks)}">'
            f'<th class="row" scope="row">{esc(row.cell_id)}</th><td class="marks">{marks}</td>'
            f'<td class="sq">{"".join(squares)}</td></tr>'
        )
    counts = ", ".join(f"{n} {MARK_TEXT[m].replace(' since', '')}" for m, n in view.counts.items())
    legend = "".join(
        f'<li><span class="swatch k-{k}"></span>{esc(v)}</li>' for k, v in LABELS.items()
    )
    others = "".join(
        f' <a href="{esc(suite)}/history?runs={n}">{n}</a>' for n in (10, 30, 100) if n != n_runs
    )
    return (
        f'<nav class="crumbs"><a href="{esc(page_base)}/">suites</a> / '
        f'<a href="{esc(suite)}">{esc(view.dag_id)}</a> / history</nav>'
        f"<h1>{esc(view.dag_id)}: last {len(view.runs)} runs</h1>"
        f'<p class="meta" id="history-meta">{len(view.rows)} cells; {esc(counts)}. '
        f"Oldest run left, newest right; each square links to that run's cell. "
        f"Show the last{others} runs.</p>"
        f'<ul class="legend">{legend}</ul>'
        f'<div class="gridwrap"><table class="history" id="history"><thead><tr>'
        f'<th class="corner">cell</th><th>marks</th><th class="sq">{heads}</th></tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _short(run: dict[str, Any]) -> str:
    when = run_time(run)
    return f"{when:%m-%d}" if when else run["run_id"][:8]


CSS = """
table.history{border-collapse:collapse;font-size:11px}
table.history th{background:#edf2f7;padding:2px 4px;border:1px solid #cbd5e0;white-space:nowrap}
table.history th.row{text-align:left;position:sticky;left:0;z-index:1}
table.history .sq{display:flex;padding:0 2px;border:0}
table.history .sq>*{flex:0 0 14px;width:14px;height:14px;margin:1px;display:block}
table.history a.run{writing-mode:vertical-rl;transform:rotate(180deg);height:auto;font-weight:400}
table.history td.marks{white-space:nowrap}
.b-new{background:#c53030}.b-broken{background:#9b2c2c}
""".strip()
