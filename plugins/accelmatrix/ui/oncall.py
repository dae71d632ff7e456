"""On-call's tools on a run's page: filters, "re-run failed cells", the run's cost and owners.

Plain data and HTML, no Airflow: the api-server side (the clear itself, the audit log, the
DAG's owners) is ``accelmatrix.ui.rerun``. Everything is a link or a form (no script: the
page's CSP forbids them):

* filters are query parameters of the run page: ``failed=1`` (only cells that failed,
  infrastructure failures included) and ``axis=NAME=VALUE``, repeatable (one per axis), as
  the filter form sends them;
* the re-run form posts the failed cells shown to ``<app>/suites/<dag>/rerun``;
* which task of a failed cell is cleared: its first failing step, and ``run`` for failed
  checks (evaluating the same data again changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from accelmatrix.cell_state import PENDING, CellState
from accelmatrix.contracts.run_records import CellRecord
from accelmatrix.ui.cause import RUN_LEVEL_STEPS, failing_step
from accelmatrix.ui.grid import esc, q
from accelmatrix.ui.model import CellView

CSS = """
form.filters,form.rerun{margin:8px 0;font-size:13px;display:flex;gap:10px;flex-wrap:wrap;
align-items:center}
form.filters select{max-width:220px}.filters .shown{color:#4a5568}
p.oncall{font-size:13px;margin:4px 0}p.rerun-note{font-size:13px;margin:4px 0;padding:4px 8px;
border-left:3px solid #3182ce;background:#ebf8ff}
form.rerun button{font-weight:600}.rerun .none,.rerun .denied{color:#4a5568}
""".strip()

# The states a "re-run failed cells" never touches: nothing failed (passed, excluded), still
# on its way, or stopped from outside (cancelled: not a test verdict).
NOT_FAILED = frozenset({CellState.PASSED, CellState.EXCLUDED, CellState.CANCELLED, *PENDING})
# A failure whose cause is the checks: re-evaluating the same data changes nothing, so the
# workload runs again (``run`` with its downstream: collect, evaluate, teardown, gate).
RERUN_FROM_RUN = frozenset({CellState.FAILED})
MAX_CELLS = 1000  # one form, one clear request
NAMED = 8  # cells named beside the re-run button


@dataclass(frozen=True)
class Filters:
    failed: bool = False
    axes: dict[str, str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.failed or bool(self.axes)

    def query(self) -> list[tuple[str, str]]:
        out = [("failed", "1")] if self.failed else []
        return out + [("axis", f"{k}={v}") for k, v in self.axes.items()]


def parse_filters(params: Iterable[tuple[str, str]]) -> Filters:
    """``failed=1`` and ``axis=NAME=VALUE`` from a query string (anything else ignored; an
    empty ``axis=`` is the form's "any" choice)."""
    failed = False
    axes: dict[str, str] = {}
    for key, value in params:
        if key == "failed":
            failed = value not in ("", "0", "false")
        elif key == "axis" and "=" in value:
            name, _, val = value.partition("=")
            if name:
                axes[name] = val
    return Filters(failed, axes)


def is_failed(cell: CellView) -> bool:
    """A cell that failed in this run: red or orange, or a quarantined cell that failed."""
    if cell.kind in ("failed", "infra"):
        return True
    return cell.kind == "quarantined" and cell.state not in NOT_FAILED


def apply(cells: list[CellView], f: Filters) -> list[CellView]:
    return [
        c
        for c in cells
        if (not f.failed or is_failed(c)) and all(c.axes.get(k) == v for k, v in f.axes.items())
    ]


@dataclass(frozen=True)
class Target:
    """What re-running one failed cell clears: ``task_id`` at ``map_index``, downstream
    included."""

    cell_id: str
    task_id: str
    map_index: int
    step: str


def rerun_step(cell: CellView) -> str | None:
    """The step to clear for a failed cell; None when the page cannot re-run it (a run-level
    failure such as preflight, or a cell without a task of its own)."""
    if not is_failed(cell):
        return None
    step = "run" if cell.state in RERUN_FROM_RUN else (cell.step or failing_step(cell.state, ""))
    if step in RUN_LEVEL_STEPS:
        return None
    return step


def targets(cells: Iterable[CellView]) -> tuple[list[Target], list[CellView]]:
    """(what to clear, failed cells that cannot be re-run from the page)."""
    out: list[Target] = []
    skipped: list[CellView] = []
    for c in cells:
        if not is_failed(c):
            continue
        step = rerun_step(c)
        if step is None or c.machine is None or c.map_index is None:
            skipped.append(c)
            continue
        out.append(Target(c.cell_id, f"{c.machine}.{step}", c.map_index, step))
    return out, skipped


def run_cost(rows: Iterable[CellRecord]) -> tuple[float | None, int, int]:
    """(summed cost in USD or None, cells priced, cells that held a machine)."""
    total = 0.0
    priced = held = 0
    for r in rows:
        if r.resource_held_seconds is not None or r.cost is not None:
            held += 1
        if r.cost is not None:
            priced += 1
            total += float(r.cost)
    return (total if priced else None), priced, held


@dataclass
class RerunNote:
    """One "re-run failed cells" recorded in Airflow's audit log."""

    who: str
    when: Any  # datetime | None
    cells: list[str]

    def line(self) -> str:
        when = f" at {self.when:%Y-%m-%d %H:%M} UTC" if self.when else ""
        names = ", ".join(self.cells[:6]) + (
            f" (+{len(self.cells) - 6} more)" if len(self.cells) > 6 else ""
        )
        n = len(self.cells)
        return f"re-run of {n} failed cell{'s' if n != 1 else ''} by {self.who}{when}: {names}"


def _utc(t: Any) -> Any:
    """An aware UTC datetime (SQLite gives the store's times back naive, in UTC)."""
    from datetime import UTC, datetime

    if isinstance(t, datetime) and t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    return t


def mark_rerunning(cells: list[CellView], reruns: list[RerunNote]) -> list[CellView]:
    """Show the cells a re-run cleared as in progress until they write again.

    Right after "re-run N failed cells" the store still says failed (nothing has run yet),
    so the page showed the same red cells and offered the same button again. A failed cell
    named by a re-run recorded after the cell's last write (``attempt_at``) is shown
    pending ("in progress" in the legend, no re-run button for it), with who re-ran it;
    once its tasks write the cell again, the store's state shows. Returns those cells."""
    out = []
    for c in cells:
        if not is_failed(c):
            continue
        last = _utc(c.attempt_at)
        note = next(
            (
                n
                for n in reruns  # newest first
                if c.cell_id in n.cells
                and n.when is not None
                and (last is None or _utc(n.when) > last)
            ),
            None,
        )
        if note is None:
            continue
        c.kind = "pending"
        c.cause = [f"re-running: cleared by {note.who} at {_utc(note.when):%Y-%m-%d %H:%M} UTC"]
        out.append(c)
    return out


def render_panel(
    *,
    cells: list[CellView],
    shown: list[CellView],
    axes: list[str],
    filters: Filters,
    dag_id: str,
    run_id: str,
    page_base: str,
    app_base: str,
    embedded: bool,
    can_rerun: bool,
    cost: tuple[float | None, int, int],
    owners: list[str] | None,
    reruns: list[RerunNote],
) -> str:
    """The block above the grid: owners and cost, earlier re-runs, filters, re-run form."""
    return (
        _facts(owners, cost)
        + "".join(f'<p class="rerun-note">{esc(n.line())}</p>' for n in reruns[:3])
        + _filter_form(cells, shown, axes, filters, dag_id, run_id, page_base)
        + _rerun_form(shown, filters, dag_id, run_id, app_base, embedded, can_rerun)
    )


def _facts(owners: list[str] | None, cost: tuple[float | None, int, int]) -> str:
    total, priced, held = cost
    who = ", ".join(owners) if owners else "unknown"
    if total is not None:
        money = f"${total:,.4f}" if total < 1 else f"${total:,.2f}"
        what = f"cost <b>{esc(money)}</b>"
        if priced < held:
            what += f" ({priced} of {held} cells priced)"
    else:
        what = "cost: not priced (no machine of this run has a price_key)"
    return f'<p class="oncall" id="run-facts">owners <b>{esc(who)}</b> &middot; {what}</p>'


def _filter_form(
    cells: list[CellView],
    shown: list[CellView],
    axes: list[str],
    f: Filters,
    dag_id: str,
    run_id: str,
    page_base: str,
) -> str:
    action = f"{page_base}/suites/{q(dag_id)}"
    selects = []
    for a in axes:
        values = list(dict.fromkeys(c.axes.get(a, "") for c in cells))
        opts = ['<option value="">any</option>'] + [
            f'<option value="{esc(a)}={esc(v)}"{" selected" if f.axes.get(a) == v else ""}>'
            f"{esc(v)}</option>"
            for v in values
        ]
        selects.append(
            f'<label>{esc(a)} <select name="axis" data-axis="{esc(a)}">{"".join(opts)}</select>'
            "</label>"
        )
    n_failed = sum(1 for c in cells if is_failed(c))
    base = f"{action}?run_id={q(run_id)}"
    failed_link = (
        f'<a class="only-failed" href="{esc(base)}&amp;failed=1">failed only ({n_failed})</a>'
    )
    clear = f' <a class="all-cells" href="{esc(base)}">all cells</a>' if f.active else ""
    return (
        f'<form class="filters" method="get" action="{esc(action)}">'
        f'<input type="hidden" name="run_id" value="{esc(run_id)}">'
        f'<label><input type="checkbox" name="failed" value="1"{" checked" if f.failed else ""}>'
        " failed only</label>"
        + "".join(selects)
        + '<button type="submit">filter</button>'
        + f' <span class="shown" id="shown">{len(shown)} of {len(cells)} cells shown</span> '
        + failed_link
        + clear
        + "</form>"
    )


def _rerun_form(
    shown: list[CellView],
    f: Filters,
    dag_id: str,
    run_id: str,
    app_base: str,
    embedded: bool,
    can_rerun: bool,
) -> str:
    todo, skipped = targets(shown)
    if not todo and not skipped:
        return '<form class="rerun"><span class="none">no failed cell shown</span></form>'
    if not can_rerun:
        return (
            '<form class="rerun"><span class="denied">re-running failed cells needs edit '
            "access to this suite's DAG</span></form>"
        )
    hidden = [("run_id", run_id), *(("cell", t.cell_id) for t in todo[:MAX_CELLS])]
    hidden += f.query()
    if embedded:
        hidden.append(("view", "1"))
    fields = "".join(f'<input type="hidden" name="{k}" value="{esc(v)}">' for k, v in hidden)
    steps = sorted({t.step for t in todo})
    note = (
        f' <span class="none">not from here: {esc(", ".join(c.cell_id for c in skipped[:3]))}'
        " (a run-level step failed: clear it in Airflow)</span>"
        if skipped
        else ""
    )
    # The cells it re-runs are named beside the button, before anything is cleared.
    names = ", ".join(t.cell_id for t in todo[:NAMED]) + (
        f" and {len(todo) - NAMED} more" if len(todo) > NAMED else ""
    )
    button = (
        f'<button type="submit" name="go" value="1">re-run {len(todo)} failed '
        f"cell{'s' if len(todo) != 1 else ''}</button>"
        f' <span class="targets" id="rerun-targets">{esc(names)}</span>'
        f' <span class="none">clears {esc(", ".join(steps))} and what follows</span>'
        if todo
        else ""
    )
    return (
        f'<form class="rerun" method="post" action="{esc(app_base)}/suites/{q(dag_id)}/rerun">'
        f"{fields}{button}{note}</form>"
    )
