"""A suite's history at a glance: cells x the last N runs, like the PyTorch HUD's commits x
jobs, so a flaky or newly broken cell stands out without opening run after run.

Each square is a cell in one run, coloured like the grid (same kinds) and linking to that
run's page at the cell. Rows are marked from the verdict sequence over the runs shown:
``new`` (failing now, passed the run before), ``broken`` (failing for 2+ runs after
passing earlier in the window), ``flaky`` (2+ flips between pass and fail); perf series
the gate classified as a regression are marked ``regression``. Marked rows come first.

Runs are ordered by logical date, then build (``runtime_version``), then start: a backfill
of last week's builds started today sits where its dates are, not among today's runs, and
every column header is distinct (date and build, a start time where those repeat).

Above the grid, the suite's change groups (one cause behind the change points of a night:
a build, a machine kind, a single series; ``accelmatrix.history``) are listed, open
regressions first, each with its builds, cells, change and triage state; a user who may
edit the suite's DAG sets the state there (a form POSTed to the app's triage route). The
regression mark follows triage at once (``trend_model.stored_verdicts``): an accepted
change clears it without waiting for the suite's next run.

Follow-up runs (confirm, bisect and compare re-tests of named builds,
``results.runs.is_followup``) are runs of the suite's DAG but no column of the grid, and
their cells (samples: ``model=small,build=...,repeat=2``) no row: below the grid, the
re-tests section lists them, newest first, each linked to its run and to the change it
re-tests, whose entry links back to them.

Between the two, the bounds section: per benchmark of the suite's bounds files that
accelmatrix has re-centered, the bounds in force (the newest row stored in the results
store), who set them, when and why (an accepted change, linked; the maintenance window),
and the earlier rows. The bounds files themselves are never written (include/ comes from
git); ``python -m accelmatrix bounds export FILE`` prints one with the stored bounds.

Read in one query over the cells table (30,720 rows for 1,024 cells x 30 runs) and
rendered as one string join: bench/bench_page.py times it against the <= 1 s goal.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from accelmatrix.contracts.change_point_records import (
    OPEN_STATES,
    TRIAGE_STATES,
    ChangeGroup,
    ChangePoint,
    Confirmation,
)
from accelmatrix.contracts.run_records import FOLLOWUP_RUN_TYPES, RunRecord
from accelmatrix.contracts.series_records import BoundsRecord
from accelmatrix.evaluation.bounds import bounds_key, load_bounds, row_in_force
from accelmatrix.history.bounds.bounds_job import reason_line, suite_bounds_files
from accelmatrix.results.runs import FOLLOWUP_PARAM
from accelmatrix.ui import op_diff_view
from accelmatrix.ui.grid import LABELS, esc, q
from accelmatrix.ui.model import cell_kind, run_finished, run_time
from accelmatrix.ui.trend_model import stored_verdicts

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

log = logging.getLogger(__name__)

DEFAULT_RUNS = 30
MAX_RUNS = 100
# Change groups listed besides the open regressions (all of which are listed), newest first.
MAX_OTHER_GROUPS = 30
MAX_CELLS_SHOWN = 4
MAX_RETESTS = 50  # follow-up runs listed in the re-tests section, newest first
MAX_BOUNDS_ROWS = 200  # stored bounds rows read per bounds file, newest first
MAX_EARLIER_BOUNDS = 10  # earlier rows listed per benchmark
NOTE_MAX = 500  # characters of a triage note
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
class ChangeEntry:
    """One line of the change list: a change group, or a change point no group holds."""

    what: str  # group | change (the triage route's kind)
    id: int
    kind: str  # build | infrastructure | series
    direction: str  # regression | improvement
    summary: str
    cells: list[str]
    metrics: list[str]
    machines: list[str]
    series_count: int
    change: float | None  # median relative change
    change_min: float | None
    change_max: float | None
    logical_date: datetime | None
    build: str | None
    prev_logical_date: datetime | None
    prev_build: str | None
    run_id: str | None
    state: str
    state_by: str | None
    state_at: datetime | None
    note: str | None
    # The group's re-test (the store's confirmations), if one was started.
    retest: Confirmation | None = None

    @property
    def anchor(self) -> str:
        return f"{self.what}-{self.id}" if self.what == "change" else f"group-{self.id}"

    @property
    def open_regression(self) -> bool:
        return self.direction == "regression" and self.state in OPEN_STATES


@dataclass
class RetestRun:
    """One follow-up run (a confirm, bisect or compare re-test of named builds): a row of
    the page's re-tests section, never a column of the grid."""

    run: RunRecord
    kind: str  # confirm | bisect | compare | re-test (a kind this page does not know)
    round: int | None
    builds: list[str]  # the first is the reference (last good build, a compare's base)
    cells: list[str]  # the suspect cells it re-tests
    samples: int  # its cells (one session per suspect cell; one per sample before)
    cost: float | None
    confirmation: Confirmation | None
    group: ChangeEntry | None = None  # the change it re-tests, when listed

    @property
    def group_id(self) -> int | None:
        c = self.confirmation
        return int(c.group_id) if c and c.group_id is not None else None


@dataclass
class BoundsEntry:
    """A benchmark of one of the suite's bounds files whose bounds accelmatrix re-centered."""

    file: str  # relative to the include dir
    benchmark: str
    lower: float | None  # in force now
    upper: float | None
    file_lower: float | None  # the file's own
    file_upper: float | None
    row: BoundsRecord | None  # the stored row in force; None: the file's values hold
    rows: list[BoundsRecord]  # every stored row read, newest first

    @property
    def superseded(self) -> bool:
        """The newest stored row no longer holds: the file changed since (a merged PR)."""
        return self.row is None and bool(self.rows)


@dataclass
class HistoryView:
    dag_id: str
    runs: list[RunRecord]  # oldest first
    rows: list[Row]
    changes: list[ChangeEntry] = field(default_factory=list)  # open regressions first
    changes_hidden: int = 0  # older closed groups not listed
    retests: list[RetestRun] = field(default_factory=list)  # newest first
    retests_hidden: int = 0  # older follow-up runs not listed
    bounds: list[BoundsEntry] = field(default_factory=list)
    bounds_files: list[str] = field(default_factory=list)  # the suite's, relative

    @property
    def counts(self) -> dict[str, int]:
        return {m: sum(m in r.marks for r in self.rows) for m in MARKS}


def load_history(
    store: ResultsStore, dag_id: str, n_runs: int = DEFAULT_RUNS
) -> HistoryView | None:
    runs = runs_in_order(store, dag_id, max(1, min(n_runs, MAX_RUNS)))
    retests, retests_hidden = load_retests(store, dag_id)
    if not runs and not retests:
        return None
    pos = {r.run_id: i for i, r in enumerate(runs)}
    finished = [run_finished(r) for r in runs]
    rows: dict[str, Row] = {}
    for sq in store.cell_states_of_runs(dag_id, pos):
        i = pos[sq.run_id]
        cid, index = sq.cell_id, sq.cell_index
        row = rows.get(cid)
        if row is None:
            row = rows[cid] = Row(cid, (1 << 30, cid), [None] * len(runs))
        state = sq.state or "planned"
        kind = cell_kind(state, sq.quarantined, False, finished=finished[i])
        row.squares[i] = (kind, state, index)
        if index is not None and i >= row.order_run:  # the latest plan's order wins
            row.order, row.order_run = (index, cid), i
    # As triage left them: accepting a change clears its cells' regression mark at once.
    regressions = {r.cell_id for r in stored_verdicts(store, dag_id) if r.status == "regression"}
    for row in rows.values():
        _mark(row, runs, row.cell_id in regressions)
    rank = {m: i for i, m in enumerate(MARKS)}
    ordered = sorted(
        rows.values(),
        key=lambda r: (min((rank[m] for m in r.marks), default=len(rank)), r.order),
    )
    changes, hidden = load_changes(store, dag_id)
    by_group = {e.id: e for e in changes if e.what == "group"}
    for rt in retests:
        rt.group = by_group.get(rt.group_id) if rt.group_id is not None else None
    view = HistoryView(dag_id, runs, ordered, changes, hidden, retests, retests_hidden)
    view.bounds, view.bounds_files = load_bounds_entries(store, dag_id)
    return view


def load_bounds_entries(store: ResultsStore, dag_id: str) -> tuple[list[BoundsEntry], list[str]]:
    """The re-centered benchmarks of the suite's bounds files (file order), and the files.

    A broken suite, an unreadable file or an older store only leaves the section out."""

    out: list[BoundsEntry] = []
    keys: list[str] = []
    try:
        paths = suite_bounds_files(dag_id)
    except Exception:  # noqa: BLE001 - no suite file: no bounds section
        return [], []
    for path in paths:
        try:
            file_bounds = load_bounds(path)
            key = bounds_key(path)
            rows = store.get_bounds_history([key], limit=MAX_BOUNDS_ROWS)
        except Exception:  # noqa: BLE001 - the section never breaks the page
            log.warning("history: stored bounds of %s not readable", path, exc_info=True)
            continue
        keys.append(key)
        by_bench: dict[str, list[BoundsRecord]] = {}
        for r in rows:
            by_bench.setdefault(r.benchmark, []).append(r)
        for name, bench in file_bounds.benchmarks.items():
            stored = by_bench.get(name)
            if not stored:
                continue
            newest = stored[0]
            held = newest if row_in_force(bench, newest) else None
            lo, hi = bench.step_time_lower_bound, bench.step_time_upper_bound
            if held is not None:
                lo = held.step_time_lower_bound if held.step_time_lower_bound is not None else lo
                hi = held.step_time_upper_bound if held.step_time_upper_bound is not None else hi
            out.append(
                BoundsEntry(
                    key,
                    name,
                    lo,
                    hi,
                    bench.step_time_lower_bound,
                    bench.step_time_upper_bound,
                    held,
                    stored,
                )
            )
    return out, keys


def runs_in_order(store: ResultsStore, dag_id: str, n_runs: int) -> list[RunRecord]:
    """The suite's latest ``n_runs`` runs, oldest first, placed by logical date (a run
    without one by its start), then build (``runtime_version``), then start: the order of
    the builds tested, whenever the runs happened to execute. Follow-up runs (re-tests,
    ``results.runs.is_followup``) are no column: they have their own section."""
    runs = store.latest_runs(dag_id, n_runs)
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(
        runs,
        key=lambda x: (
            run_time(x) or epoch,
            x.runtime_version or "",
            x.started_at or epoch,
            x.run_id,
        ),
    )


def load_retests(store: ResultsStore, dag_id: str) -> tuple[list[RetestRun], int]:
    """The suite's follow-up runs, newest first, up to ``MAX_RETESTS`` (and how many more
    there are), each with the re-test it belongs to (``confirmations``: by the id its
    ``accelmatrix_followup`` block names, else by run id), its cells and their cost."""
    rows = store.get_runs(dag_id, limit=MAX_RETESTS + 1, which="followups")
    if not rows:
        return [], 0
    hidden = max(0, len(rows) - MAX_RETESTS)
    rows = rows[:MAX_RETESTS]
    try:
        confirmations = store.get_confirmations(dag_id)
    except Exception:  # noqa: BLE001 - an older store without the table: runs alone
        confirmations = []
    by_id = {int(c.id): c for c in confirmations}
    by_run: dict[str, Confirmation] = {}
    for conf in confirmations:
        for run_id in [*(conf.run_ids or []), conf.run_id]:
            if run_id:
                by_run[str(run_id)] = conf
    counts = {
        t.run_id: (t.cells, t.cost)
        for t in store.cell_totals_of_runs(dag_id, [r.run_id for r in rows])
    }
    out = []
    for r in rows:
        block = (r.params or {}).get(FOLLOWUP_PARAM)
        block = block if isinstance(block, dict) else {}
        conf = by_run.get(r.run_id)
        if conf is None and isinstance(block.get("confirmation"), int):
            conf = by_id.get(block["confirmation"])
        kind = r.run_type if r.run_type in FOLLOWUP_RUN_TYPES else None
        kind = kind or block.get("kind") or _kind_of_run_id(r.run_id) or "re-test"
        n, cost = counts.get(r.run_id, (0, None))
        out.append(
            RetestRun(
                run=r,
                kind=str(kind),
                round=block.get("round") if isinstance(block.get("round"), int) else None,
                builds=[str(b) for b in block.get("builds") or []],
                cells=[str(x) for x in block.get("cells") or []],
                samples=n,
                cost=cost,
                confirmation=conf,
            )
        )
    return out, hidden


def _kind_of_run_id(run_id: str) -> str | None:
    for kind in FOLLOWUP_RUN_TYPES:
        if run_id.startswith(f"accelmatrix_{kind}__"):
            return kind
    return None


def load_changes(store: ResultsStore, dag_id: str) -> tuple[list[ChangeEntry], int]:
    """The change list: every open regression group (untriaged or acknowledged), newest
    first, then the other groups, newest first, up to ``MAX_OTHER_GROUPS`` (and how many
    more there are). A change point no group holds is listed as its own entry."""
    try:
        groups = store.get_change_groups(dag_id)
        loose = [p for p in store.get_change_points(dag_id) if p.group_id is None]
    except Exception:  # noqa: BLE001 - an older store without the tables: no list
        log.warning("history: change groups of %s not readable", dag_id, exc_info=True)
        return [], 0
    try:
        retests = {c.group_id: c for c in store.get_confirmations(dag_id)}
    except Exception:  # noqa: BLE001 - an older store without the table: no re-tests shown
        retests = {}
    entries = [_group_entry(g, retests.get(g.id)) for g in groups]
    entries += [_point_entry(p) for p in loose]
    epoch = datetime.min.replace(tzinfo=UTC)
    entries.sort(key=lambda e: (e.logical_date or epoch, e.id), reverse=True)
    first = [e for e in entries if e.open_regression]
    rest = [e for e in entries if not e.open_regression]
    return first + rest[:MAX_OTHER_GROUPS], max(0, len(rest) - MAX_OTHER_GROUPS)


def _group_entry(g: ChangeGroup, retest: Confirmation | None = None) -> ChangeEntry:
    return ChangeEntry(
        retest=retest,
        what="group",
        id=int(g.id),
        kind=g.kind or "series",
        direction=g.direction or "regression",
        summary=g.summary or "",
        cells=[str(c) for c in g.cells or []],
        metrics=[str(m) for m in g.metrics or []],
        machines=[str(m) for m in g.machines or []],
        series_count=int(g.series_count or 0),
        change=g.change_median,
        change_min=g.change_min,
        change_max=g.change_max,
        logical_date=g.logical_date,
        build=g.runtime_version,
        prev_logical_date=g.prev_logical_date,
        prev_build=g.prev_runtime_version,
        run_id=g.run_id,
        state=g.state or "untriaged",
        state_by=g.state_by,
        state_at=g.state_at,
        note=g.note,
    )


def _point_entry(p: ChangePoint) -> ChangeEntry:
    return ChangeEntry(
        what="change",
        id=int(p.id),
        kind="series",
        direction=p.direction or "regression",
        summary=f"{p.metric} of {p.cell_id}: {_pct(p.change)}",
        cells=[p.cell_id],
        metrics=[p.metric],
        machines=[p.machine] if p.machine else [],
        series_count=1,
        change=p.change,
        change_min=None,
        change_max=None,
        logical_date=p.logical_date,
        build=p.runtime_version,
        prev_logical_date=p.prev_logical_date,
        prev_build=p.prev_runtime_version,
        run_id=p.run_id,
        state=p.state or "untriaged",
        state_by=p.state_by,
        state_at=p.state_at,
        note=p.note,
    )


def _pct(v: float | None) -> str:
    return "?" if v is None or not math.isfinite(v) else f"{v * 100:+.1f} %"


def _mark(row: Row, runs: list[RunRecord], perf_regression: bool) -> None:
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
            row.since = runs[seq[-streak][0]].run_id
    if perf_regression:
        row.marks.append("regression")
    if flips >= 2:
        row.marks.append("flaky")


def render_history(
    view: HistoryView,
    *,
    page_base: str,
    n_runs: int,
    form_base: str | None = None,
    can_edit: bool = False,
) -> str:
    """Compact on purpose: 30,720 squares at 1,024 x 30, so a square is one <a> (no table
    cell around it), its link names the run without needless escapes and the cell by its
    plan index (``#c<index>``, the anchor the run page gives each cell).

    ``form_base``: this app's base, where triage forms are POSTed (the navigation entry's
    view cannot take a POST); ``can_edit``: the user may edit the suite's DAG, so the
    change list carries triage forms."""
    suite = f"{page_base}/suites/{q(view.dag_id)}"
    run_links = [f"{suite}?run_id={quote(r.run_id, safe=':')}" for r in view.runs]
    heads = "".join(
        f'<a class="run" href="{esc(link)}" title="{esc(_run_title(r))}">{esc(label)}</a>'
        for r, link, label in zip(view.runs, run_links, run_labels(view.runs), strict=True)
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
        + render_changes(
            view, page_base=page_base, n_runs=n_runs, form_base=form_base, can_edit=can_edit
        )
        + render_bounds(view)
        + f'<h2>Cells</h2><p class="meta" id="history-meta">{len(view.rows)} cells; '
        f"{esc(counts)}. Oldest build left, newest right (by logical date, then build); "
        f"each square links to that run's cell. Show the last{others} runs.</p>"
        f'<ul class="legend">{legend}</ul>'
        f'<div class="gridwrap"><table class="history" id="history"><thead><tr>'
        f'<th class="corner">cell</th><th>marks</th><th class="sq">{heads}</th></tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        + render_retests(view, page_base=page_base)
        + (render_compare_form(view, form_base) if can_edit and form_base is not None else "")
    )


def render_compare_form(view: HistoryView, form_base: str) -> str:
    """ "Compare two builds" (edit access): base and head default to the two newest builds
    of the suite's runs; the form starts a compare run (``history.build_compare``)."""
    builds = [r.runtime_version for r in view.runs if r.runtime_version]
    head = builds[-1] if builds else ""
    base = builds[-2] if len(builds) > 1 else ""
    action = f"{form_base}/suites/{q(view.dag_id)}/compare"
    return (
        '<h2 id="compare">Compare two builds</h2><p class="meta">Both builds run on one '
        "machine per cell, interleaved (A B B A); the run's report gets the comparison: "
        "medians, the change with its 95 % interval, p, Cliff's delta, the verdict and the "
        f'cost.</p><form method="post" class="compare" action="{esc(action)}">'
        f'<label>base <input name="base" required value="{esc(base)}"></label> '
        f'<label>head <input name="head" required value="{esc(head)}"></label> '
        '<label>cells <input name="cells" value="*" title="cell id globs, comma-separated">'
        '</label> <label>pairs <input name="pairs" type="number" min="7" max="200" '
        'value="10"></label> <button type="submit">compare</button></form>'
    )


def _short(run: RunRecord) -> str:
    when = run_time(run)
    return f"{when:%m-%d}" if when else run.run_id[:8]


def run_labels(runs: list[RunRecord]) -> list[str]:
    """Column headers, one per run, all distinct: the logical date and the build; where
    those repeat (a date tested twice, or runs without a build), the start time too, and
    the run id as the last resort."""
    labels = []
    for r in runs:
        build = r.runtime_version
        labels.append(f"{_short(r)} {build}" if build else _short(r))
    seen = Counter(labels)
    for i, r in enumerate(runs):
        if seen[labels[i]] > 1:
            started = r.started_at or r.created_at
            if started:
                labels[i] += f" {started.astimezone(UTC):%H:%M}"
    seen = Counter(labels)
    return [f"{lb} {r.run_id}" if seen[lb] > 1 else lb for lb, r in zip(labels, runs, strict=True)]


def _run_title(r: RunRecord) -> str:
    parts = [r.run_id, f"state {r.state or '-'}"]
    if r.logical_date:
        parts.append(f"logical date {r.logical_date.astimezone(UTC):%Y-%m-%d %H:%M} UTC")
    if r.runtime_version:
        parts.append(f"build {r.runtime_version}")
    if r.started_at:
        parts.append(f"started {r.started_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC")
    return "; ".join(parts)


# -- the change list ------------------------------------------------------------------------
KIND_TEXT = {
    "build": "build",
    "infrastructure": "infrastructure",
    "series": "series",
}


def triage_action(form_base: str, dag_id: str, e: ChangeEntry) -> str:
    """The triage route of an entry (``app.py``)."""
    return f"{form_base}/suites/{q(dag_id)}/changes/{e.what}/{e.id}/triage"


def _when(t: datetime | None, fmt: str = "%Y-%m-%d") -> str:
    return t.astimezone(UTC).strftime(fmt) if t else "?"


def _change_text(e: ChangeEntry) -> str:
    text = _pct(e.change)
    lo, hi = e.change_min, e.change_max
    if lo is not None and hi is not None and (lo != hi) and math.isfinite(lo) and math.isfinite(hi):
        text += f" ({_pct(lo)} to {_pct(hi)})"
    return text


def _retest_text(e: ChangeEntry, suite: str, listed: bool = False) -> str:
    """The re-test cell: verdict, the decisive medians, the culprit, the bisect steps, its
    runs; ``listed``: the re-tests section lists runs of it (linked)."""
    c = e.retest
    if c is None:
        return '<span class="meta">-</span>'
    out = f'<b class="rt-{esc(c.state)}">{esc(c.state.replace("_", " "))}</b>'
    decision = c.decision or {}
    if decision:
        d = max(decision.values(), key=lambda d: abs(d.get("change") or 0))
        med = f"{_num(d.get('median_good'))} &rarr; {_num(d.get('median_suspect'))}"
        p_text = f"{d['p_worse']:.2g}" if d.get("p_worse") is not None else "-"
        out += (
            f'<span class="sub">median {med} ({esc(_pct(d.get("change")))}, '
            f"p={esc(p_text)}, {d['n_good']}+{d['n_suspect']} runs)</span>"
        )
    if c.culprit:
        out += (
            f'<span class="sub culprit">first bad build <b>{esc(c.culprit)}</b> '
            f"(last good {esc(c.last_good or '-')})</span>"
        )
    steps = c.steps or []
    if steps:
        rows = "".join(
            f"<tr><td>{esc(st['build'])}</td><td>{int(st.get('n') or 0)}</td>"
            f"<td>{esc(_num(st.get('median_build')))}</td><td>{esc(st['verdict'])}</td></tr>"
            for st in steps
        )
        out += (
            '<table class="steps"><thead><tr><th>build</th><th>runs</th><th>median</th>'
            f"<th>verdict</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    if c.reason:
        out += f'<span class="note">{esc(c.reason)}</span>'
    links = []
    for i, r in enumerate(c.run_ids or []):
        href = f"{suite}?run_id={quote(r, safe=':')}"
        links.append(f'<a href="{esc(href)}">{esc(r.split("__")[0])} {i + 1}</a>')
    if links:
        out += '<span class="sub runs">' + " ".join(links) + "</span>"
    if listed:
        out += (
            f'<a class="sub retests-link" href="#retests-group-{e.id}">'
            "its runs in the re-tests below</a>"
        )
    return out


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) and math.isfinite(v) else "-"


def render_changes(
    view: HistoryView,
    *,
    page_base: str,
    n_runs: int,
    form_base: str | None,
    can_edit: bool,
) -> str:
    """The change list above the grid: open regressions first, a triage form per entry
    for users who may edit the suite's DAG."""
    suite = f"{page_base}/suites/{q(view.dag_id)}"
    n_open = sum(e.open_regression for e in view.changes)
    if not view.changes:
        return (
            '<h2>Changes</h2><p class="meta" id="changes-meta">No change point found in this '
            "suite's perf series.</p>"
        )
    embedded = form_base is not None and form_base != page_base
    listed = {rt.group_id for rt in view.retests if rt.group is not None}
    rows, reports = [], []
    for e in view.changes:
        # The culprit report stored with its re-test (ui/op_diff_view.py), below the list.
        decision = e.retest.decision if e.retest is not None else None
        report = op_diff_view.culprit_report(view.dag_id, decision, page_base=page_base)
        if report is not None:
            reports.append(op_diff_view.render_report(report, e.anchor, e.summary or e.anchor))
        cells = e.cells[:MAX_CELLS_SHOWN]
        more = len(e.cells) - len(cells)
        cell_text = ", ".join(cells) + (f" +{more} more" if more > 0 else "")
        builds = (
            f"{esc(e.prev_build or '?')} ({esc(_when(e.prev_logical_date))}) &rarr; "
            if e.prev_build or e.prev_logical_date
            else ""
        )
        first = f"{esc(e.build or '?')} ({esc(_when(e.logical_date))})"
        if e.run_id:
            href = f"{suite}?run_id={quote(e.run_id, safe=':')}"
            first = f'<a class="first-run" href="{esc(href)}">{first}</a>'
        state = f'<b class="st-{esc(e.state)}">{esc(e.state)}</b>'
        if e.state_by:
            state += f" by {esc(e.state_by)}"
        if e.state_at:
            state += f" {esc(_when(e.state_at, '%Y-%m-%d %H:%M'))} UTC"
        if e.note:
            state += f'<span class="note">{esc(e.note)}</span>'
        form = ""
        if can_edit and form_base is not None:
            options = "".join(
                f'<option value="{s}"{" selected" if s == e.state else ""}>{s}</option>'
                for s in TRIAGE_STATES
            )
            form = (
                f'<form class="triage" method="post" '
                f'action="{esc(triage_action(form_base, view.dag_id, e))}">'
                f'<select name="state" aria-label="state">{options}</select> '
                f'<input name="note" maxlength="{NOTE_MAX}" placeholder="note" '
                f'aria-label="note"> <input type="hidden" name="runs" value="{n_runs}">'
                + ('<input type="hidden" name="embed" value="1">' if embedded else "")
                + '<button type="submit">set</button></form>'
            )
        where = ", ".join(e.machines) if e.machines else ""
        rows.append(
            f'<tr id="{esc(e.anchor)}" class="change-entry d-{esc(e.direction)}'
            f'{" open" if e.open_regression else ""}" data-what="{e.what}" data-id="{e.id}" '
            f'data-state="{esc(e.state)}" data-kind="{esc(e.kind)}">'
            f'<td><span class="badge g-{esc(e.kind)}">{esc(KIND_TEXT.get(e.kind, e.kind))}'
            f'</span><span class="dir">{esc(e.direction)}</span></td>'
            f'<td class="summary">{esc(e.summary)}'
            + (f'<span class="sub">{esc(", ".join(e.metrics))}' if e.metrics else "")
            + (f" on {esc(where)}" if e.metrics and where else "")
            + ("</span>" if e.metrics else "")
            + f'</td><td class="cells" title="{esc(", ".join(e.cells))}">'
            f"{e.series_count or len(e.cells)} series: {esc(cell_text)}</td>"
            f'<td class="pct">{esc(_change_text(e))}</td>'
            f'<td class="builds">{builds}{first}</td>'
            f'<td class="retest">'
            f"{_retest_text(e, suite, e.what == 'group' and e.id in listed)}"
            f"{op_diff_view.report_link(report, e.anchor)}</td>"
            f'<td class="state">{state}</td>' + (f"<td>{form}</td>" if can_edit else "") + "</tr>"
        )
    more = (
        f" {view.changes_hidden} older closed change(s) not listed." if view.changes_hidden else ""
    )
    head = "<th>cause</th><th>what moved</th><th>cells</th><th>change</th>"
    head += "<th>builds (last good &rarr; first at the new level)</th><th>re-test</th>"
    head += "<th>state</th>"
    head += "<th>triage</th>" if can_edit else ""
    return (
        f'<h2>Changes</h2><p class="meta" id="changes-meta">{n_open} open regression(s) '
        f"first, then the rest, newest first.{esc(more)}"
        + ("" if can_edit else " Setting a state needs edit access to this suite's DAG.")
        + f'</p><table class="changes" id="changes"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>" + "".join(reports)
    )


def _bounds_pair(lo: Any, hi: Any) -> str:
    return f"[{_num(lo) if lo is not None else '-'}, {_num(hi) if hi is not None else '-'}]"


def _bounds_why(row: BoundsRecord, view: HistoryView) -> str:

    d = row.detail or {}
    text = esc(reason_line(row))
    gid = d.get("group_id")
    cid = d.get("change_id")
    if d.get("dag_id") == view.dag_id and (gid is not None or cid is not None):
        anchor = f"group-{int(gid)}" if gid is not None else f"change-{int(cid)}"
        text = f'<a class="change-link" href="#{anchor}">{text}</a>'
    who = f"{esc(row.by or '?')}, {esc(_when(row.at, '%Y-%m-%d %H:%M'))} UTC"
    note = f'<span class="note">{esc(row.note)}</span>' if row.note else ""
    return f'{text}<span class="sub">by {who}</span>{note}'


def render_bounds(view: HistoryView) -> str:
    """The bounds section: per re-centered benchmark of the suite's bounds files, the bounds
    in force with who, when and why, and the earlier stored rows."""
    if not view.bounds_files:
        return ""
    files = ", ".join(view.bounds_files)
    meta = (
        f'<h2 id="bounds">Bounds</h2><p class="meta" id="bounds-meta">Step-time bounds of '
        f"{esc(files)}. The files are the initial baseline and are never written here; bounds "
        "re-centered since (an accepted change, the maintenance DAG) are stored in the results "
        "store, and the newest row is in force. <code>python -m accelmatrix bounds export "
        "FILE</code> prints a file with them, for a PR."
    )
    if not view.bounds:
        return meta + " No benchmark has been re-centered: the files' values are in force.</p>"
    rows = []
    for e in view.bounds:
        if e.row is not None:
            force = _bounds_why(e.row, view)
            earlier = e.rows[1 : 1 + MAX_EARLIER_BOUNDS]
        else:
            force = (
                '<span class="meta">the file\'s values: the file changed since the newest '
                "stored row (a merged PR wins)</span>"
            )
            earlier = e.rows[:MAX_EARLIER_BOUNDS]
        older = "".join(
            f"<li>{esc(_bounds_pair(r.step_time_lower_bound, r.step_time_upper_bound))} "
            f"{_bounds_why(r, view)}</li>"
            for r in earlier
        )
        more = len(e.rows) - (1 if e.row is not None else 0) - len(earlier)
        if more > 0:
            older += f'<li class="meta">{more} older row(s) not listed</li>'
        hist = (
            f'<details><summary>{len(earlier) + max(more, 0)} earlier</summary><ul class="bounds-rows">'
            f"{older}</ul></details>"
            if older
            else '<span class="meta">-</span>'
        )
        rows.append(
            f'<tr class="bounds-entry" data-file="{esc(e.file)}" data-benchmark="{esc(e.benchmark)}"'
            f' data-source="{"store" if e.row is not None else "file"}">'
            f'<td>{esc(e.benchmark)}<span class="sub">{esc(e.file)}</span></td>'
            f'<td class="in-force">{esc(_bounds_pair(e.lower, e.upper))}</td>'
            f"<td>{esc(_bounds_pair(e.file_lower, e.file_upper))}</td>"
            f"<td>{force}</td><td>{hist}</td></tr>"
        )
    return (
        meta + "</p>"
        '<table class="changes bounds" id="bounds-table"><thead><tr><th>benchmark</th>'
        "<th>in force</th><th>in the file</th><th>set by, when, why</th><th>earlier</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_retests(view: HistoryView, *, page_base: str) -> str:
    """The re-tests section: the suite's follow-up runs (confirm, bisect, compare), newest
    first, each linked to its run page and to the change it re-tests. They are kept out of
    the grid and of the suite's latest run: a re-test runs older builds, often several per
    run, and its cells are samples, not cells of the suite."""
    if not view.retests:
        return ""
    suite = f"{page_base}/suites/{q(view.dag_id)}"
    rows, anchored = [], set()
    for rt in view.retests:
        r = rt.run
        href = f"{suite}?run_id={quote(r.run_id, safe=':')}"
        kind = rt.kind + (f" {rt.round}" if rt.round else "")
        gid = rt.group_id
        anchor = ""
        if gid is not None and rt.group is not None and gid not in anchored:
            anchored.add(gid)
            anchor = f' id="retests-group-{gid}"'
        if rt.group is not None:
            change = (
                f'<a class="change-link" href="#{esc(rt.group.anchor)}">'
                f"{esc(rt.group.summary or f'group {gid}')}</a>"
            )
        elif gid is not None:
            change = f"change group {gid}"
        else:
            change = '<span class="meta">on demand</span>'
        conf = rt.confirmation
        verdict = (
            f'<b class="rt-{esc(conf.state)}">{esc(str(conf.state).replace("_", " "))}</b>'
            if conf and conf.state
            else "-"
        )
        builds = esc(rt.builds[0]) if rt.builds else ""
        if len(rt.builds) > 1:
            builds += " vs " + esc(", ".join(rt.builds[1:]))
        builds = builds or esc(r.runtime_version or "-")
        cells = rt.cells[:MAX_CELLS_SHOWN]
        more = len(rt.cells) - len(cells)
        cell_text = ", ".join(cells) + (f" +{more} more" if more > 0 else "")
        cost = (
            f"{rt.cost:.4g}" if isinstance(rt.cost, int | float) and math.isfinite(rt.cost) else "-"
        )
        rows.append(
            f'<tr class="retest-run"{anchor} data-run-id="{esc(r.run_id)}" '
            f'data-kind="{esc(rt.kind)}" data-group-id="{"" if gid is None else gid}">'
            f'<td><a class="run" href="{esc(href)}" title="{esc(_run_title(r))}">'
            f'{esc(kind)}</a><span class="sub">{esc(r.run_id)}</span></td>'
            f"<td>{esc(_when(r.started_at or r.created_at, '%Y-%m-%d %H:%M'))}</td>"
            f"<td>{esc(r.state or '-')}</td>"
            f"<td>{builds}</td>"
            f'<td class="cells" title="{esc(", ".join(rt.cells))}">{esc(cell_text or "-")}'
            f'<span class="sub">{rt.samples} cell(s) in the run</span></td>'
            f"<td>{esc(cost)}</td><td>{change}</td><td>{verdict}</td></tr>"
        )
    more = (
        f" {view.retests_hidden} older follow-up run(s) not listed." if view.retests_hidden else ""
    )
    return (
        f'<h2 id="retests">Re-tests</h2><p class="meta" id="retests-meta">'
        f"{len(view.retests)} follow-up run(s), newest first: confirm, bisect and compare runs "
        "re-test named builds on the suspect cells. They are not runs of the suite: never a "
        f"column above, nor its latest run.{esc(more)}</p>"
        '<table class="changes retests" id="retests-table"><thead><tr><th>re-test run</th>'
        "<th>started</th><th>state</th><th>builds</th><th>cells</th><th>cost</th>"
        "<th>change re-tested</th><th>verdict</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


CSS = """
table.history{border-collapse:collapse;font-size:11px}
table.history th{background:#edf2f7;padding:2px 4px;border:1px solid #cbd5e0;white-space:nowrap}
table.history th.row{text-align:left;position:sticky;left:0;z-index:1}
table.history .sq{display:flex;padding:0 2px;border:0}
table.history .sq>*{flex:0 0 14px;width:14px;height:14px;margin:1px;display:block}
table.history a.run{writing-mode:vertical-rl;transform:rotate(180deg);height:auto;font-weight:400}
table.history td.marks{white-space:nowrap}
.b-new{background:#c53030}.b-broken{background:#9b2c2c}
table.changes{border-collapse:collapse;font-size:12px;margin-bottom:8px}
table.changes table.steps{border-collapse:collapse;font-size:11px;margin-top:2px}
table.changes table.steps td,table.changes table.steps th{padding:1px 4px}
table.changes .rt-confirmed,table.changes .rt-found{color:#c53030}
table.changes .rt-not_reproduced{color:#2f855a}
table.changes th,table.changes td{border:1px solid #cbd5e0;padding:3px 6px;text-align:left;
vertical-align:top}
table.changes th{background:#edf2f7}
table.changes tr.open{background:#fff5f5}table.changes tr:target{outline:2px solid #1e5bb8}
table.changes .dir{display:block;font-size:11px;color:#4a5568}
table.changes .sub,table.changes .note{display:block;font-size:11px;color:#4a5568}
table.changes td.cells{max-width:260px}table.changes td.pct{white-space:nowrap;font-weight:600}
table.changes .d-regression td.pct{color:#c53030}table.changes .d-improvement td.pct{color:#2f855a}
table.changes form.triage{margin:0;white-space:nowrap}
table.changes input[name=note]{width:140px}
.g-build{background:#c53030}.g-infrastructure{background:#b7791f}.g-series{background:#4a5568}
""".strip()
