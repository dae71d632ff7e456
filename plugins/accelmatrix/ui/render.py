"""Whole pages: the suite list and a run (run picker, grid, legend, trend charts).

Plain HTML with inline CSS and SVG: the page is shown in an iframe of the Airflow UI on
machines without internet access, so it may load nothing from elsewhere, and it needs no
JavaScript at all (the response's Content-Security-Policy forbids scripts outright).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from accelmatrix.contracts.run_records import FOLLOWUP_RUN_TYPES, RunRecord
from accelmatrix.reports.verdicts import CellVerdicts, lead_html
from accelmatrix.results.runs import is_followup
from accelmatrix.ui import history, oncall, op_diff_view, theme, trend
from accelmatrix.ui.grid import esc, q, render_grid, render_legend
from accelmatrix.ui.model import RunView, SuiteSummary, run_finished, run_time
from accelmatrix.ui.trend import render_trend

CSS = (
    """
body,:host{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a202c}
body{margin:16px}.am-body{padding:16px;color-scheme:light}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:20px 0 8px}
a{color:#1e5bb8}nav.crumbs{margin-bottom:8px;font-size:13px}
table.suites td,table.suites th{padding:4px 10px;text-align:left;border-bottom:1px solid #e2e8f0}
.gridwrap{overflow:auto;max-width:100%;border:1px solid #cbd5e0}
table.grid{border-collapse:collapse;font-size:12px}
table.grid th{background:#edf2f7;padding:3px 6px;border:1px solid #cbd5e0;white-space:nowrap}
table.grid th.row{text-align:left;position:sticky;left:0;z-index:1}
table.grid td.cell{border:1px solid #cbd5e0;padding:3px 5px;min-width:72px;vertical-align:top}
td.cell .st{display:block;font-weight:600}td.cell .links a{margin-right:6px;font-size:11px}
.k-passed{background:#c6f6d5}.k-failed{background:#feb2b2}.k-infra{background:#fbd38d}
.k-quarantined{background:#d6bcfa}.k-flaky{background:#faf089}.k-excluded{background:#e2e8f0;color:#718096}
.k-pending{background:#bee3f8}.k-cancelled{background:#cbd5e0}
td.cell .why{display:block;font-size:11px;max-width:260px;white-space:normal;color:#2d3748}
td.cell .attempt{display:block;font-size:10px;color:#4a5568}.k-none{background:#fff}
.badge{display:inline-block;font-size:10px;padding:0 4px;margin:1px 2px 1px 0;border-radius:3px;
background:#2d3748;color:#fff}.b-regression{background:#c53030}.b-flaky{background:#b7791f}
.b-suspicious{background:#718096}.b-quarantined{background:#6b46c1}
ul.legend{list-style:none;padding:0;display:flex;gap:14px;flex-wrap:wrap;font-size:13px}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px;border:1px solid #a0aec0;
vertical-align:middle}
form.picker{margin:8px 0;font-size:13px}
.meta{font-size:13px;color:#4a5568}
figure.chart{margin:0 0 18px}figcaption{font-size:14px;margin-bottom:4px}
svg.trend{background:#fff;font-size:11px}svg.trend .plot{fill:#fff;stroke:#cbd5e0}
svg.trend .gridline{stroke:#edf2f7}svg.trend .tick{fill:#4a5568}
svg.trend .band{fill:#c6f6d5;fill-opacity:.55;stroke:#68d391;stroke-width:.5}
svg.trend .current{stroke:#2f855a;stroke-dasharray:5 4;stroke-width:1}
svg.trend polyline{fill:none;stroke-width:1.5}svg.trend .s-regression polyline{stroke-width:3}
svg.trend circle.violation{stroke:#e53e3e;stroke-width:2.5}
svg.trend .mark{fill:#c53030;font-weight:700}
ul.series-legend{list-style:none;padding:0;font-size:12px;columns:2;max-width:760px}
ul.series-legend .s-regression .status{color:#c53030;font-weight:700}
ul.series-legend .s-flaky .status{color:#b7791f;font-weight:700}
""".strip()
    + "\n"
    + history.CSS
    + "\n"
    + trend.CSS
    + "\n"
    + op_diff_view.CSS
    + "\n"
    + oncall.CSS
    + "\n"
    + theme.CSS
)


def page(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>"
    )


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M UTC")
    return "-"


def suites_page(suites: list[SuiteSummary], app_base: str) -> str:
    rows = []
    for s in suites:
        latest = s.latest
        rows.append(
            f'<tr data-dag-id="{esc(s.dag_id)}"><td><a href="{esc(app_base)}/suites/'
            f'{esc(q(s.dag_id))}">{esc(s.dag_id)}</a></td>'
            f"<td>{esc((latest.state if latest else None) or '-')}</td>"
            f"<td>{esc(_when(latest.started_at if latest else None))}</td>"
            f"<td>{esc(_when(latest.logical_date if latest else None))}</td><td>{s.runs}</td>"
            f'<td><a class="history" href="{esc(app_base)}/suites/{esc(q(s.dag_id))}/history">'
            "history</a></td></tr>"
        )
    table = (
        '<table class="suites"><tr><th>suite</th><th>latest run</th><th>started</th>'
        "<th>logical date</th><th>runs</th><th></th></tr>" + "".join(rows) + "</table>"
        if rows
        else "<p>No runs recorded yet: trigger a suite and its results appear here.</p>"
    )
    return page("accelmatrix suites", f"<h1>accelmatrix: test suites</h1>{table}")


def _picker(view: RunView, page_base: str) -> str:
    options = []
    for r in view.runs:
        sel = " selected" if r.run_id == view.run.run_id else ""
        label = f"{r.run_id} ({r.state or '-'}, {_when(run_time(r))})"
        options.append(f'<option value="{esc(r.run_id)}"{sel}>{esc(label)}</option>')
    return (
        f'<form class="picker" method="get" action="{esc(page_base)}/suites/{esc(q(view.dag_id))}">'
        f'<label>run <select name="run_id">{"".join(options)}</select></label> '
        '<button type="submit">show</button>'
        + (
            ""
            if view.is_latest
            else f' <a href="{esc(page_base)}/suites/{esc(q(view.dag_id))}">latest</a>'
        )
        + "</form>"
    )


# Run params not shown beside the run: the follow-up block (a re-test says what it is).
HIDDEN_PARAMS = frozenset({"accelmatrix_followup", "accelmatrix_compare"})
PARAMS_SHOWN = 300  # characters


def _params(run: RunRecord) -> str:
    """The params the run ran with (its conf over the suite's defaults, as its plan
    recorded them): a backfill whose conf Airflow's form did not send shows its defaults
    here, so on-call can tell it from what was intended."""
    params = {k: v for k, v in (run.params or {}).items() if k not in HIDDEN_PARAMS}
    text = ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) or "none"
    if len(text) > PARAMS_SHOWN:
        text = text[: PARAMS_SHOWN - 3] + "..."
    return f'<span class="run-params" id="run-params">params {esc(text)}</span>'


def _lead(view: RunView) -> str:
    """A finished run's page leads with its cells' verdicts ("1 of 3 cells failed: ..."),
    the same line as its report and Data Docs (reports/verdicts.py). Nothing while the run
    is in progress or a cell re-runs: a cell without a verdict yet has not failed."""
    if not run_finished(view.run) or any(c.kind == "pending" for c in view.cells):
        return ""

    return lead_html(CellVerdicts.of((c.cell_id, c.state, c.quarantined) for c in view.cells))


def run_page(
    view: RunView,
    *,
    ui_base: str,
    app_base: str,
    page_base: str | None = None,
    panel: str = "",
    cells: list | None = None,
) -> str:
    """``app_base``: this app (Data Docs files); ``page_base``: where links to the other
    matrix pages go (the app, or the navigation entry's view inside Airflow's UI).
    ``panel``: HTML above the grid (ui/oncall.py); ``cells``: the cells shown (filtered),
    all of the run's when None (the legend counts the whole run either way)."""
    page_base = app_base if page_base is None else page_base
    run = view.run
    run_link = f"{ui_base}/dags/{q(view.dag_id)}/runs/{q(run.run_id)}"
    meta = [
        f"state <b>{esc(run.state or '-')}</b>",
        f"started {esc(_when(run.started_at))}",
        f"logical date {esc(_when(run.logical_date))}",
    ]
    for key, value in (("runtime_version", run.runtime_version), ("git_ref", run.git_ref)):
        if value:
            meta.append(f"{key.replace('_', ' ')} {esc(value)}")
    meta.append(_params(run))
    meta.append(f'<a class="run-link" href="{esc(run_link)}">run in Airflow</a>')
    if is_followup(run):
        # A re-test of named builds: its cells are samples, not the suite's cells.
        kind = run.run_type if run.run_type in FOLLOWUP_RUN_TYPES else "re-test"
        meta.append(
            f'<span class="retest-note">a {esc(kind)} run re-testing builds, not a run of the '
            f'suite (<a href="{esc(page_base)}/suites/{esc(q(view.dag_id))}/history#retests">'
            "re-tests</a>)</span>"
        )
    if view.run_docs:
        docs = "/".join(q(part) for part in view.run_docs.split("/"))
        meta.append(
            f'<a class="run-docs" href="{esc(app_base)}/suites/{esc(q(view.dag_id))}/files/'
            f'{esc(docs)}">run Data Docs</a>'
        )
    grid = render_grid(
        view.cells if cells is None else cells,
        view.axes,
        ui_base=ui_base,
        app_base=app_base,
        dag_id=view.dag_id,
        run_id=run.run_id,
    )
    suite_url = f"{page_base}/suites/{q(view.dag_id)}"
    charts = "".join(
        render_trend(t, f"trend-{i}", suite_url=suite_url) for i, t in enumerate(view.trends)
    )
    source = (
        "verdicts as stored after the latest run"
        if view.verdict_source == "series_status"
        else "verdicts computed over the window shown"
    )
    trends = (
        f'<h2>Trends</h2><p class="meta">{esc(view.window_days)} days up to this run; '
        f"{source}. Band: bounds each point was judged against;"
        + (" dashed: bounds in the bounds file now;" if any(t.current for t in view.trends) else "")
        + " red rings: points outside their bounds;"
        + " dashed verticals: change points at their first run (hover: before and after,"
        + " builds, state; click: its group on the history page, or the run)."
        + f"</p>{charts}"
        if view.trends
        else '<h2>Trends</h2><p class="meta">No perf check has judged this suite in the window.</p>'
    )
    body = (
        f'<nav class="crumbs"><a href="{esc(page_base)}/">suites</a> / {esc(view.dag_id)} '
        f'(<a class="history" href="{esc(page_base)}/suites/{esc(q(view.dag_id))}/history">'
        "history of the last runs</a>)</nav>"
        f"<h1>{esc(view.dag_id)}</h1>{_picker(view, page_base)}"
        f'<p class="meta" id="run-meta">run {esc(run.run_id)}: {" &middot; ".join(meta)}</p>'
        f"{_lead(view)}{render_legend(view.counts)}{panel}{grid}{trends}"
    )
    return page(f"{view.dag_id} {run.run_id}", body)


def message_page(title: str, text: str, link: tuple[str, str] | None = None) -> str:
    extra = f' <a href="{esc(link[0])}" target="_top">{esc(link[1])}</a>' if link else ""
    return page(title, f"<h1>{esc(title)}</h1><p>{esc(text)}{extra}</p>")


def history_page(
    view: history.HistoryView,
    *,
    page_base: str,
    n_runs: int,
    form_base: str | None = None,
    can_edit: bool = False,
) -> str:
    body = history.render_history(
        view, page_base=page_base, n_runs=n_runs, form_base=form_base, can_edit=can_edit
    )
    return page(f"{view.dag_id} history", body)
