"""The culprit report on a change's entry of the history page: which ops got slower, and
what kind of cause the matrix points to.

A re-test that names a culprit stores, with each target's decision
(``history.culprit_profile``), the op-level diff of the last good build's profiler trace
against the culprit's (``history.culprits.profile_diff.ProfileDiff.as_json``, or the one line saying
why there is none) and the cause's class with its sibling evidence
(``history.culprits.attribution``). The alert prints the top 3 ops; this module renders the rest
for the change's entry, server-side, as the other pages are (their CSP allows no script):

* the class (the code, a machine kind, an axis value, noise), why, and the sibling cells
  with their Δ %, which moved and which the class predicts;
* the diff's verdict, a table of the ranked ops (Δ per step, Δ %, share of the
  regression, new or gone) and an SVG bar chart of the top ops' Δ, drawn in the trend
  charts' style (``ui/trend.py``: the ``trend`` class gives it their light and dark
  colours);
* links to both builds' traces, where the evidence store still serves them
  (``ui/files.py``).

Kept apart from ``ui/history.py``, which only calls ``culprit_report`` and the two
renderers: the stored JSON is decoded here into typed records (msgspec, tolerant of
fields added later), so a change to the store's rows touches one call, and this module
never imports the history package's NumPy code to show what it stored.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from accelmatrix.ui import files
from accelmatrix.ui.grid import esc, q

__all__ = [
    "CSS",
    "CulpritReport",
    "culprit_report",
    "render_report",
    "report_anchor",
    "report_link",
]

log = logging.getLogger(__name__)
_S = TypeVar("_S", bound=msgspec.Struct)

# The keys history.culprit_profile stores each target's diff and class under (PROFILE_KEY,
# ATTRIBUTION_KEY there; spelled out so the page never imports NumPy to read them:
# tests/test_op_diff_view.py checks they agree).
PROFILE_KEY = "profile"
ATTRIBUTION_KEY = "attribution"
# Ops drawn in the bar chart (the table lists every stored row: the top 10 and the new or
# gone ops among the first 50).
CHART_OPS = 8
CAUSE_TEXT = {
    "code": "the code",
    "machine_kind": "a machine kind",
    "axis_value": "an axis value",
    "noise": "noise",
}
VERDICT_TEXT = {
    "op": "one op explains most of it",
    "spread": "spread over every op: no single op (a slower machine, clock or runtime)",
    "several": "several ops, none clears the others",
    "intermittent": "an op is slow in some steps only (see its slow-step row)",
    "no_regression": "the traces show no regression beyond their noise",
}


# -- what the store holds (history.culprits.profile_diff / history.culprits.attribution as JSON) -------------
class OpRow(msgspec.Struct, frozen=True):
    """One ranked op of the diff (``profile_diff.OpDelta``), per step, in µs."""

    op: str
    shapes: str = ""
    where: str = "cpu"
    base_us: float = 0.0
    new_us: float = 0.0
    delta_us: float = 0.0
    delta_pct: float | None = None
    excess_us: float = 0.0
    share: float | None = None
    status: str = "changed"  # changed | new | gone
    # 95 % intervals across the profiled samples (None: a diff stored before they were)
    excess_lo: float | None = None
    excess_hi: float | None = None
    share_lo: float | None = None
    share_hi: float | None = None


class TailRow(msgspec.Struct, frozen=True):
    """An intermittent slow path (``profile_diff.TailDelta``): the share of steps over the
    op's slow threshold in both builds, and its p90."""

    op: str
    shapes: str = ""
    threshold_us: float = 0.0
    base_slow: float = 0.0
    new_slow: float = 0.0
    slow_lo: float | None = None
    slow_hi: float | None = None
    base_p90_us: float = 0.0
    new_p90_us: float = 0.0


class StoredDiff(msgspec.Struct, frozen=True):
    """A target's stored op-level diff (``ProfileDiff.as_json`` with the builds), or its
    one-line error."""

    good: str = ""
    bad: str = ""
    error: str | None = None
    verdict: str | None = None
    base_source: str = ""
    new_source: str = ""
    base_steps: int = 0
    new_steps: int = 0
    base_step_us: float = 0.0
    new_step_us: float = 0.0
    delta_step_us: float = 0.0
    delta_step_pct: float | None = None
    delta_ops_us: float = 0.0
    drift: float = 0.0
    rows: list[OpRow] = []
    base_peak_memory_bytes: float | None = None
    new_peak_memory_bytes: float | None = None
    base_samples: int = 1
    new_samples: int = 1
    samples_from: str = "traces"
    tails: list[TailRow] = []


class SiblingRow(msgspec.Struct, frozen=True):
    """A cell of the change's runs as the class reads it (``attribution.Evidence``)."""

    cell: str
    machine_kind: str = ""
    axes: dict[str, str] = {}
    delta_pct: float = 0.0
    moved: bool = False
    predicted: bool = False


class StoredClass(msgspec.Struct, frozen=True):
    """A target's stored cause class (``attribution.Attribution`` with its summary)."""

    cause: str
    axis: str | None = None
    value: str | None = None
    reason: str = ""
    evidence: list[SiblingRow] = []
    summary: str = ""
    nights_after: int = 0


@dataclass(frozen=True)
class TraceLink:
    """A trace the diff read, as the page links it (None: no longer served)."""

    name: str
    href: str | None


@dataclass(frozen=True)
class CellReport:
    """One re-tested cell: its metrics' classes and its traces' diff (shared by its
    metrics: the session kept one set of traces per cell)."""

    cell_id: str
    metrics: list[str]
    classes: list[StoredClass] = field(default_factory=list)
    diff: StoredDiff | None = None
    base_traces: list[TraceLink] = field(default_factory=list)
    new_traces: list[TraceLink] = field(default_factory=list)


@dataclass(frozen=True)
class CulpritReport:
    """The culprit report of one re-test: a block per re-tested cell that stored one."""

    cells: list[CellReport]


def culprit_report(
    dag_id: str, decision: Mapping[str, Any] | None, *, page_base: str
) -> CulpritReport | None:
    """The report stored with a change's re-test (its ``Confirmation.decision``: the
    verdict per target, ``cell|metric``), or None when it stored neither a diff nor a
    class (a suite without traces, a re-test still running, a row from before the culprit
    report). A part that does not decode is left out and logged, never an error: it is
    evidence beside the verdict."""
    if not isinstance(decision, Mapping):
        return None
    metrics: dict[str, list[str]] = {}
    classes: dict[str, list[StoredClass]] = {}
    diffs: dict[str, StoredDiff | None] = {}
    for key, d in decision.items():
        if not isinstance(d, Mapping) or (PROFILE_KEY not in d and ATTRIBUTION_KEY not in d):
            continue
        cell_id, _, metric = str(key).partition("|")  # history.retests.followup's target key
        metrics.setdefault(cell_id, []).append(metric)
        known = classes.setdefault(cell_id, [])
        a = _decode(d.get(ATTRIBUTION_KEY), StoredClass, key)
        if a is not None and a.summary not in [k.summary for k in known]:
            known.append(a)
        if diffs.get(cell_id) is None:  # the cell's metrics share its traces' diff
            diffs[cell_id] = _decode(d.get(PROFILE_KEY), StoredDiff, key)
    if not metrics:
        return None
    cells = []
    for cell_id, names in metrics.items():
        diff = diffs.get(cell_id)
        cells.append(
            CellReport(
                cell_id=cell_id,
                metrics=names,
                classes=classes[cell_id],
                diff=diff,
                base_traces=_links(dag_id, diff.base_source, page_base) if diff else [],
                new_traces=_links(dag_id, diff.new_source, page_base) if diff else [],
            )
        )
    return CulpritReport(cells)


def _decode(raw: Any, kind: type[_S], key: object) -> _S | None:
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, type=kind, strict=False)
    except msgspec.ValidationError as e:
        log.warning("culprit report of %s: stored %s not readable: %s", key, kind.__name__, e)
        return None


def _links(dag_id: str, sources: str, page_base: str) -> list[TraceLink]:
    """The traces a diff read (its ``*_source``: paths joined by ", "), each linked through
    the evidence route when it is still a served file of this suite."""
    out = []
    root = files.suite_root(dag_id)
    roots = [root]
    try:
        roots.append(root.resolve())
    except OSError:
        pass
    for src in (s for s in sources.split(", ") if s):
        path = Path(src)
        href = None
        for r in roots:
            try:
                rel = path.relative_to(r).as_posix()
            except ValueError:
                continue
            if files.evidence_file(dag_id, rel) is not None:
                href = f"{page_base}/suites/{q(dag_id)}/files/{_quote_path(rel)}"
                break
        out.append(TraceLink(f"{path.parent.name}/{path.name}", href))
    return out


def _quote_path(rel: str) -> str:
    return "/".join(q(p) for p in rel.split("/"))


# -- rendering --------------------------------------------------------------------------------
def report_anchor(entry_anchor: str) -> str:
    """The report's anchor for a change entry's (``group-3`` -> ``culprit-group-3``)."""
    return f"culprit-{entry_anchor}"


def report_link(report: CulpritReport | None, entry_anchor: str) -> str:
    """The line in the change's re-test cell that leads to its report (empty: none)."""
    if report is None:
        return ""
    tops = [c.diff.rows[0].op for c in report.cells if c.diff and c.diff.rows]
    causes = [CAUSE_TEXT.get(k.cause, k.cause) for c in report.cells for k in c.classes]
    what = []
    if causes:
        what.append(f"cause: {causes[0]}")
    if tops:
        what.append(f"top op {tops[0]}")
    text = "culprit report" + (f" ({', '.join(what)})" if what else "")
    return f'<a class="sub culprit-link" href="#{esc(report_anchor(entry_anchor))}">{esc(text)}</a>'


def render_report(report: CulpritReport, entry_anchor: str, title: str) -> str:
    """The change's culprit report: per re-tested cell, the class with its siblings, then
    the op-level diff (verdict, bar chart, table, traces)."""
    anchor = report_anchor(entry_anchor)
    blocks = []
    for i, c in enumerate(report.cells):
        blocks.append(
            f'<div class="culprit-cell" data-cell-id="{esc(c.cell_id)}">'
            f'<h4>{esc(c.cell_id)} <span class="meta">({esc(", ".join(c.metrics))})</span></h4>'
            + "".join(_class_html(k) for k in c.classes)
            + (_diff_html(c, f"{anchor}-{i}") if c.diff is not None else "")
            + "</div>"
        )
    return (
        f'<section class="culprit" id="{esc(anchor)}" data-entry="{esc(entry_anchor)}">'
        f'<h3>Culprit report: <a href="#{esc(entry_anchor)}">{esc(title)}</a></h3>'
        + "".join(blocks)
        + "</section>"
    )


def _class_html(k: StoredClass) -> str:
    head = CAUSE_TEXT.get(k.cause, k.cause)
    if k.cause in ("machine_kind", "axis_value") and k.value:
        head += f" ({k.axis}={k.value})" if k.cause == "axis_value" else f" ({k.value})"
    rows = "".join(
        f'<tr class="{"moved" if s.moved else "flat"}" data-cell-id="{esc(s.cell)}">'
        f"<td>{esc(s.cell)}</td><td>{esc(s.machine_kind or '-')}</td>"
        f'<td class="num">{esc(_pct_points(s.delta_pct))}</td>'
        f"<td>{'moved' if s.moved else 'flat'}</td>"
        f"<td>{'yes' if s.predicted else 'no'}</td></tr>"
        for s in k.evidence
    )
    nights = (
        f' <span class="meta">(read from {k.nights_after} night(s) after the change)</span>'
        if k.nights_after
        else ""
    )
    table = (
        '<table class="siblings"><thead><tr><th>cell</th><th>machine kind</th>'
        "<th>&Delta; %</th><th>moved</th><th>the class predicts it moved</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rows
        else ""
    )
    return (
        f'<p class="cause" data-cause="{esc(k.cause)}"><b>Cause: {esc(head)}</b>{nights}'
        f'<span class="sub">{esc(k.summary or k.reason)}</span></p>{table}'
    )


def _diff_html(c: CellReport, chart_id: str) -> str:
    d = c.diff
    assert d is not None
    builds = f"{esc(d.good or '?')} &rarr; {esc(d.bad or '?')}"
    if d.error:
        return (
            f'<p class="opdiff-error">Ops, {builds}: <span class="note">{esc(d.error)}</span></p>'
        )
    verdict = VERDICT_TEXT.get(d.verdict or "", d.verdict or "?")
    step = (
        esc(
            f"step {_ms(d.delta_step_us, sign=True)}"
            + (f" ({d.delta_step_pct * 100:+.1f} %)" if _finite(d.delta_step_pct) else "")
        )
        + f", {esc(_ms(d.base_step_us))} &rarr; {esc(_ms(d.new_step_us))}"
    )
    mem = ""
    if d.base_peak_memory_bytes is not None and d.new_peak_memory_bytes is not None:
        delta = (d.new_peak_memory_bytes - d.base_peak_memory_bytes) / 2**20
        mem = f"; peak memory {delta:+.1f} MiB"
    head = (
        f'<p class="opdiff-head" data-verdict="{esc(d.verdict or "")}">Ops, last good '
        f"{builds}: {step}: <b>{esc(verdict)}</b>{esc(mem)}. "
        f'<span class="meta">Self time per step, {d.base_steps} and {d.new_steps} profiled '
        f"steps in {d.base_samples} and {d.new_samples} "
        + ("samples" if d.samples_from == "traces" else "blocks of one trace")
        + "; the share is of the ops' summed change beyond the common drift, with its 95 % "
        "interval across the samples; ranked by that change.</span></p>"
    )
    return (
        head
        + render_bars(d.rows[:CHART_OPS], chart_id)
        + _table(d.rows)
        + _tails_table(d.tails)
        + _traces_html(c)
    )


def _tails_table(tails: list[TailRow]) -> str:
    """The intermittent slow paths: an op slower in some steps only."""
    if not tails:
        return ""
    body = "".join(
        f'<tr class="tail-row" data-op="{esc(t.op)}"><td>{esc(t.op)}'
        + (f'<span class="sub">{esc(t.shapes)}</span>' if t.shapes else "")
        + f'</td><td class="num">{esc(_ms(t.threshold_us))}</td>'
        f'<td class="num">{esc(_pct(t.base_slow, sign=False))}</td>'
        f'<td class="num">{esc(_pct(t.new_slow, sign=False))}'
        f"{esc(_interval(t.slow_lo, t.slow_hi, sign=True))}</td>"
        f'<td class="num">{esc(_ms(t.base_p90_us))} &rarr; {esc(_ms(t.new_p90_us))}</td></tr>'
        for t in tails
    )
    return (
        '<h4>Intermittent slow paths</h4><table class="changes opdiff tails"><thead><tr>'
        "<th>op</th><th>slow above</th><th>slow steps, last good</th>"
        "<th>slow steps, culprit (rise, 95 %)</th><th>p90 per step</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _interval(lo: float | None, hi: float | None, *, sign: bool = False) -> str:
    if not (_finite(lo) and _finite(hi)):
        return ""
    assert lo is not None and hi is not None
    f = "{:+.0f}" if sign else "{:.0f}"
    return f" [{f.format(lo * 100)}, {f.format(hi * 100)}]"


def _table(rows: list[OpRow]) -> str:
    body = "".join(
        f'<tr class="op-row st-{esc(r.status)}" data-op="{esc(r.op)}" data-status="{esc(r.status)}">'
        f"<td>{esc(r.op)}"
        + (f'<span class="sub">{esc(r.shapes)}</span>' if r.shapes else "")
        + (f'<span class="sub">on {esc(r.where)}</span>' if r.where != "cpu" else "")
        + f'</td><td class="num">{esc(_ms(r.base_us))}</td>'
        f'<td class="num">{esc(_ms(r.new_us))}</td>'
        f'<td class="num delta">{esc(_ms(r.delta_us, sign=True))}</td>'
        f'<td class="num">{esc(_pct(r.delta_pct))}</td>'
        f'<td class="num share">{esc(_pct(r.share, sign=False))}'
        f"{esc(_interval(r.share_lo, r.share_hi))}</td>"
        f"<td>{esc(r.status if r.status != 'changed' else '')}</td></tr>"
        for r in rows
    )
    return (
        '<table class="changes opdiff"><thead><tr><th>op</th><th>last good, per step</th>'
        "<th>culprit, per step</th><th>&Delta; per step</th><th>&Delta; %</th>"
        "<th>share of the regression</th><th>new / gone</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _traces_html(c: CellReport) -> str:
    def links(traces: list[TraceLink]) -> str:
        if not traces:
            return '<span class="meta">none recorded</span>'
        return ", ".join(
            f'<a class="trace" href="{esc(t.href)}">{esc(t.name)}</a>'
            if t.href
            else f'<span class="meta" title="no longer in the evidence store">{esc(t.name)}</span>'
            for t in traces
        )

    return (
        f'<p class="traces">Traces: last good build {links(c.base_traces)}; '
        f"culprit {links(c.new_traces)}.</p>"
    )


# The bar chart, in the trend charts' frame (ui/trend.py: the `trend` class, its plot,
# gridline and tick styles, light and dark).
BAR_W = 640
LABEL_W = 250  # op names, right-aligned at the zero side
VALUE_W = 80  # the Δ after each bar
ROW_H = 22
BAR_H = 14
CHART_TOP, CHART_BOTTOM = 8, 26
LABEL_CHARS = 38


def render_bars(rows: list[OpRow], chart_id: str) -> str:
    """The ops' Δ per step as horizontal bars from a zero line: slower to the right (red),
    faster to the left (green), an op new in the culprit marked; each bar's tooltip is the
    op's line of the report. Empty without rows."""
    if not rows:
        return ""
    lim = max((abs(r.delta_us) for r in rows), default=0.0) or 1.0
    neg = any(r.delta_us < 0 for r in rows)
    pw = BAR_W - LABEL_W - VALUE_W
    x_zero = LABEL_W + (pw / 2 if neg else 0.0)
    scale = (pw / 2 if neg else pw) / lim
    h = CHART_TOP + len(rows) * ROW_H + CHART_BOTTOM
    plot_h = len(rows) * ROW_H
    parts = [
        f'<svg class="trend opdiff-bars" id="{esc(chart_id)}" viewBox="0 0 {BAR_W} {h}" '
        f'width="{BAR_W}" height="{h}" role="img" xmlns="http://www.w3.org/2000/svg">',
        "<title>the top ops' change in self time per step</title>",
        f'<rect class="plot" x="{LABEL_W}" y="{CHART_TOP}" width="{pw}" height="{plot_h}"/>',
    ]
    for frac in (-1.0, -0.5, 0.5, 1.0) if neg else (0.5, 1.0):
        xx = x_zero + frac * lim * scale
        parts.append(
            f'<line class="gridline" x1="{xx:.1f}" x2="{xx:.1f}" y1="{CHART_TOP}" '
            f'y2="{CHART_TOP + plot_h}"/>'
            f'<text class="tick" x="{xx:.1f}" y="{h - 10}" text-anchor="middle">'
            f"{esc(_ms(frac * lim, sign=True))}</text>"
        )
    names = Counter(r.op for r in rows)  # an op drawn twice (two shapes) is told apart
    for i, r in enumerate(rows):
        y = CHART_TOP + i * ROW_H + (ROW_H - BAR_H) / 2
        w = abs(r.delta_us) * scale
        x = x_zero if r.delta_us >= 0 else x_zero - w
        cls = "slower" if r.delta_us >= 0 else "faster"
        if r.status in ("new", "gone"):
            cls += f" {r.status}"
        name = f"{r.op} {r.shapes}" if names[r.op] > 1 and r.shapes else r.op
        name = name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"
        tip = _op_line(r)
        vx = x + w + 4 if r.delta_us >= 0 else x_zero + 4
        parts.append(
            f'<g class="op-bar" data-op="{esc(r.op)}" data-delta-us="{r.delta_us:.3f}">'
            f"<title>{esc(tip)}</title>"
            f'<text class="tick label" x="{LABEL_W - 6}" y="{y + BAR_H - 3:.1f}" '
            f'text-anchor="end">{esc(name)}</text>'
            f'<rect class="bar {cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" '
            f'height="{BAR_H}"/>'
            f'<text class="tick value" x="{vx:.1f}" y="{y + BAR_H - 3:.1f}">'
            f"{esc(_ms(r.delta_us, sign=True))}</text></g>"
        )
    parts.append(
        f'<line class="zero" x1="{x_zero:.1f}" x2="{x_zero:.1f}" y1="{CHART_TOP}" '
        f'y2="{CHART_TOP + plot_h}"/></svg>'
    )
    return f'<figure class="chart opdiff-chart">{"".join(parts)}</figure>'


def _op_line(r: OpRow) -> str:
    """The op as the alert words it (``profile_diff.OpDelta.describe``)."""
    name = r.op + (f" {r.shapes}" if r.shapes else "")
    if r.status == "new":
        text = f"{name} new in the culprit, {_ms(r.new_us)} per step"
    elif r.status == "gone":
        text = f"{name} gone from the culprit, was {_ms(r.base_us)} per step"
    else:
        text = f"{name} self time {_ms(r.delta_us, sign=True)} per step ({_pct(r.delta_pct)})"
    if r.share is not None:
        text += (
            f", {_pct(r.share, sign=False)}{_interval(r.share_lo, r.share_hi)} of the regression"
        )
    return text


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _ms(us: float, *, sign: bool = False) -> str:
    ms = us / 1000
    return f"{ms:+.3f} ms" if sign else f"{ms:.3f} ms"


def _pct(v: float | None, *, sign: bool = True) -> str:
    if not _finite(v):
        return "-"
    assert v is not None
    return f"{v * 100:+.0f} %" if sign else f"{v * 100:.0f} %"


def _pct_points(v: float) -> str:
    return f"{v:+.1f} %" if math.isfinite(v) else "-"


CSS = """
section.culprit{border:1px solid #cbd5e0;padding:4px 10px;margin:8px 0;font-size:12px}
section.culprit:target{outline:2px solid #1e5bb8}
section.culprit h3{margin:4px 0;font-size:14px}section.culprit h4{margin:6px 0 2px}
section.culprit .sub{display:block;font-size:11px;color:#4a5568}
section.culprit p{margin:4px 0}
table.siblings{border-collapse:collapse;font-size:11px;margin:2px 0 6px}
table.siblings td,table.siblings th{border:1px solid #cbd5e0;padding:1px 5px;text-align:left}
table.siblings tr.moved td{font-weight:600}
table.opdiff td.num{text-align:right;white-space:nowrap}
table.opdiff tr.st-new td,table.opdiff tr.st-gone td{font-style:italic}
svg.opdiff-bars .bar.slower{fill:#e53e3e}svg.opdiff-bars .bar.faster{fill:#38a169}
svg.opdiff-bars .bar.new{fill:#9b2c2c}svg.opdiff-bars .zero{stroke:#4a5568;stroke-width:1}
svg.opdiff-bars{font-size:11px}
""".strip()
