"""A benchmark's trend as inline SVG, rendered on the server: no JavaScript, no CDN.

One chart per (benchmark, metric): the bounds in force at each point as a band, the bounds
in the bounds file today as dashed lines, one line per cell, points outside their bounds
ringed in red, series classified as a regression drawn thick and labelled, and each stored
change point of a drawn series marked at its first run: a dashed vertical (its tooltip says
before -> after, % change, p-value, builds and triage state; it links to the change's group
on the history page) and a diamond on the point (links to that run's page).

The x-axis ticks sit on whole days (UTC midnight), so a point of a nightly build sits just
right of its own day's label; each point's tooltip names its build and logical date.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from urllib.parse import quote

from accelmatrix.contracts.change_point_records import ChangePoint
from accelmatrix.ui.grid import esc
from accelmatrix.ui.trend_model import Point, Series, Trend

W, H = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 14, 34
X_PAD = 0.03  # of the time span, either side
CHAR_W = 6.3  # px per character of an 11px tick label (a generous estimate)
# Whole days between x-axis ticks, fewest first; hours when the chart spans under 2 days.
DAY_STEPS = (1, 2, 3, 7, 14, 28, 56, 91, 182, 364)
HOUR_STEPS = (1, 2, 3, 6, 12, 24)
MIN_TICK_GAP = 12  # px between two tick labels
DAY = 86400
PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100 or a < 0.001:
        return f"{v:.3g}"
    return f"{v:.4g}"


def _finite(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / (n - 1)
    return [lo + i * step for i in range(n)]


# A bound is drawn to scale when it lies within this many "reaches" of the points (the
# points' spread, at least NEAR_FRACTION of their magnitude); farther, it would squash the
# points onto one line (bounds 0 to 0.5 s for a 4 ms step time drew every point flat at 0),
# so the axis ignores it and the chart marks it at the edge instead.
NEAR_REACH = 1.0
NEAR_FRACTION = 0.25
EDGE_STRIP = 6  # px: the strip marking a bound beyond the top or bottom edge


def y_range(values: list[float], bounds: list[float], current: list[float]) -> tuple[float, float]:
    """The plotted y-range: the points, with a little room, plus the bounds near them.

    Without points (nothing measured yet) the bounds, then today's bounds, decide. A
    positive series never gets a negative axis."""
    if values:
        d0, d1 = min(values), max(values)
        reach = NEAR_REACH * max(d1 - d0, NEAR_FRACTION * max(abs(d0), abs(d1)))
        near = [b for b in bounds if d0 - reach <= b <= d1 + reach]
        ys = values + near
    else:
        ys = bounds or current
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.1 or 1.0
    return (max(0.0, y0 - pad) if y0 >= 0 else y0 - pad), y1 + pad


def _off_scale(bounds: list[float], y0: float, y1: float, pw: float) -> list[str]:
    """A strip at the top (bottom) edge for bounds above (below) the axis, saying where
    they are: the band itself is then clamped to that edge."""
    out = []
    for edge, beyond in (
        ("upper", [b for b in bounds if b > y1]),
        ("lower", [b for b in bounds if b < y0]),
    ):
        if not beyond:
            continue
        v = max(beyond) if edge == "upper" else min(beyond)
        yy = TOP if edge == "upper" else H - BOTTOM - EDGE_STRIP
        text_y = TOP + EDGE_STRIP + 10 if edge == "upper" else H - BOTTOM - EDGE_STRIP - 3
        word = "above" if edge == "upper" else "below"
        out.append(
            f'<g class="offscale {edge}" data-bound="{esc(_fmt(v))}">'
            f'<rect x="{LEFT}" y="{yy}" width="{pw}" height="{EDGE_STRIP}"/>'
            f'<text x="{LEFT + pw - 4}" y="{text_y}" text-anchor="end">'
            f"{edge} bound {esc(_fmt(v))} {word} the axis</text>"
            f"<title>{edge} bound {esc(_fmt(v))}: off scale, {word} every point</title></g>"
        )
    return out


def render_trend(trend: Trend, chart_id: str, *, suite_url: str | None = None) -> str:
    """The chart as an <svg> element plus an HTML legend (one <figure>).

    ``suite_url``: the suite's matrix page (``<page base>/suites/<dag>``), where a change
    point's links lead (its group on the history page, its first run); without it a change
    point is drawn with its tooltip only."""
    points = [p for s in trend.series for p in s.points]
    times = [p.time for p in points] + [t for t, _, _ in trend.band]
    if not times:
        return ""
    cur_lo, cur_hi = trend.current or (None, None)
    bounds = _finite([lo for _, lo, _ in trend.band] + [hi for _, _, hi in trend.band])
    y0, y1 = y_range(_finite([p.value for p in points]), bounds, _finite([cur_lo, cur_hi]))
    t_lo, t_hi = min(times), max(times)
    t0, t1 = t_lo.timestamp(), t_hi.timestamp()
    single = t1 <= t0
    if single:  # one run: the point in the middle, one tick, no invented time span
        t0, t1 = t0 - 60, t1 + 60
    else:  # a little room either side, and the first point's own day tick in view
        t0, t1 = x_range(t_lo, t_hi)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: datetime) -> float:
        return LEFT + (t.timestamp() - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        v = min(max(v, y0), y1)  # +/-inf and off-scale values sit on the edge
        return TOP + (1 - (v - y0) / (y1 - y0)) * ph

    parts = [
        f'<svg class="trend" id="{esc(chart_id)}" viewBox="0 0 {W} {H}" width="{W}" '
        f'height="{H}" role="img" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{esc(trend.benchmark)} {esc(trend.metric)} over time</title>",
        f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/>',
    ]
    for v in _ticks(y0, y1):
        yy = y(v)
        parts.append(
            f'<line class="gridline" x1="{LEFT}" x2="{LEFT + pw}" y1="{yy:.1f}" y2="{yy:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
            f"{esc(_fmt(v))}</text>"
        )
    for t, label, anchor in x_ticks(t_lo, t_hi, pw, single=single):
        xx = x(t)
        if not single:
            parts.append(
                f'<line class="xgrid" x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP}" y2="{TOP + ph}"/>'
            )
        parts.append(
            f'<text class="tick xtick" data-time="{t.isoformat()}" x="{xx:.1f}" y="{H - 12}" '
            f'text-anchor="{anchor}">{esc(label)}</text>'
        )
    # The band of bounds in force (each point was judged against these).
    band = [(t, lo, hi) for t, lo, hi in trend.band if not (math.isnan(lo) and math.isnan(hi))]
    if band:
        if len(band) == 1:
            t = band[0][0]
            band = [(t, band[0][1], band[0][2])] * 2
            xs = [LEFT, LEFT + pw]
        else:
            xs = [x(t) for t, _, _ in band]
        top = [
            (xx, y(hi if not math.isnan(hi) else y1))
            for xx, (_, _, hi) in zip(xs, band, strict=True)
        ]
        bot = [
            (xx, y(lo if not math.isnan(lo) else y0))
            for xx, (_, lo, _) in zip(xs, band, strict=True)
        ]
        poly = " ".join(f"{a:.1f},{b:.1f}" for a, b in [*top, *reversed(bot)])
        parts.append(f'<polygon class="band" points="{poly}"><title>bounds</title></polygon>')
    parts += _off_scale(bounds, y0, y1, pw)
    for v, name in ((cur_lo, "lower"), (cur_hi, "upper")):
        if v is not None and math.isfinite(v) and y0 <= v <= y1:
            yy = y(v)
            parts.append(
                f'<line class="current {name}" x1="{LEFT}" x2="{LEFT + pw}" y1="{yy:.1f}" '
                f'y2="{yy:.1f}"><title>{name} bound in the bounds file now: {esc(_fmt(v))}'
                "</title></line>"
            )
    for i, s in enumerate(trend.series):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(x(p.time), y(p.value), p) for p in s.points if not math.isnan(p.value)]
        cls = f"series s-{s.status}"
        coords = " ".join(f"{a:.1f},{b:.1f}" for a, b, _ in pts)
        parts.append(
            f'<g class="{cls}" data-cell-id="{esc(s.cell_id)}" data-status="{esc(s.status)}">'
            f'<polyline points="{coords}" stroke="{colour}"/>'
        )
        for a, b, p in pts:
            label = point_label(s.cell_id, p)
            if p.violated:
                label += f" outside [{_fmt(p.lower)}, {_fmt(p.upper)}]"
            ring = ' class="violation"' if p.violated else ""
            parts.append(
                f'<circle{ring} cx="{a:.1f}" cy="{b:.1f}" r="{4.5 if p.violated else 2.5}" '
                f'fill="{colour}"><title>{esc(label)}</title></circle>'
            )
        if s.status == "regression" and pts:
            a, b, _ = pts[-1]
            parts.append(
                f'<text class="mark" x="{min(a, LEFT + pw - 4):.1f}" y="{max(b - 9, TOP + 10):.1f}"'
                ' text-anchor="end">regression</text>'
            )
        parts.append("</g>")
    n_changes = 0
    for s in trend.series:
        for c in s.changes:
            if not t0 <= c.logical_date.timestamp() <= t1:
                continue  # outside the window drawn
            at = _point_at(s, c.logical_date)
            parts.append(
                _change_mark(
                    c,
                    s.cell_id,
                    trend.metric,
                    x(c.logical_date),
                    None if at is None else y(at.value),
                    suite_url,
                    TOP,
                    TOP + ph,
                )
            )
            n_changes += 1
    parts.append("</svg>")
    legend = []
    for i, s in enumerate(trend.series):
        legend.append(
            f'<li class="s-{esc(s.status)}"><span class="swatch" '
            f'style="background:{PALETTE[i % len(PALETTE)]}"></span>{esc(s.cell_id)} '
            f'<span class="status">{esc(s.status.replace("_", " "))}</span></li>'
        )
    hidden = sum(trend.hidden.values())
    if hidden:
        detail = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(trend.hidden.items()))
        legend.append(f'<li class="hidden">{hidden} more series not drawn ({esc(detail)})</li>')
    regs = trend.regressions
    caption = (
        f"<b>{esc(trend.benchmark)}</b> &middot; {esc(trend.metric)}"
        if trend.benchmark
        else f"<b>{esc(trend.metric)}</b> &middot; tracked, no bounds"
    )
    if regs:
        caption += f' <span class="badge b-regression">{len(regs)} regression(s)</span>'
    if n_changes:
        caption += f' <span class="badge b-change">{n_changes} change point(s)</span>'
    return (
        f'<figure class="chart" data-benchmark="{esc(trend.benchmark)}">'
        f"<figcaption>{caption}</figcaption>{''.join(parts)}"
        f'<ul class="series-legend">{"".join(legend)}</ul></figure>'
    )


# -- the x-axis ------------------------------------------------------------------------------
def x_ticks(
    lo: datetime, hi: datetime, width: float, *, single: bool = False
) -> list[tuple[datetime, str, str]]:
    """(instant, label, text-anchor) of the x-axis ticks for points from ``lo`` to ``hi``
    drawn ``width`` px wide: on whole days (UTC midnight), every 1, 2, 3, 7, ... days, as
    many as fit with their labels apart; on whole hours when the points span under 2 days.
    A label names the instant under it, so a point sits right of its day's tick, never
    under another day's label. One run: its own time, the only tick."""
    if single or hi <= lo:
        return [(lo, f"{lo.astimezone(UTC):%Y-%m-%d %H:%M}", "middle")]
    span = hi.timestamp() - lo.timestamp()
    t0, t1 = x_range(lo, hi)
    px = width / (t1 - t0)  # px per second
    if span >= 2 * DAY:
        unit, steps = DAY, DAY_STEPS
        fmts = ("%Y-%m-%d", "%m-%d")
    else:
        unit, steps = 3600, HOUR_STEPS
        fmts = ("%m-%d %H:%M", "%H:%M")
    step, fmt = steps[-1] * unit, fmts[-1]
    for n in steps:
        gap = n * unit * px
        wide = next((f for f in fmts if gap >= _label_w(f) + MIN_TICK_GAP), None)
        if wide is not None:
            step, fmt = n * unit, wide
            break
    first = math.ceil(t0 / step) * step  # whole days (UTC) since the epoch, step-aligned
    out = []
    t = first
    while t <= t1:
        when = datetime.fromtimestamp(t, tz=UTC)
        xx = (t - t0) * px
        half = _label_w(fmt) / 2
        anchor = (
            "start" if xx - half < -LEFT + 2 else "end" if xx + half > width + RIGHT else "middle"
        )
        out.append((when, when.strftime(fmt), anchor))
        t += step
    return out


def x_range(lo: datetime, hi: datetime) -> tuple[float, float]:
    """The plotted time range (epoch seconds) for points from ``lo`` to ``hi``: a little
    room either side (no point or label on the plot's edge) and, on a day axis, from the
    first point's own midnight on, so its day's tick is drawn left of it (a nightly run at
    23:00 is not read as the next day's)."""
    a, b = lo.timestamp(), hi.timestamp()
    pad = (b - a) * X_PAD
    t0, t1 = a - pad, b + pad
    if b - a >= 2 * DAY:
        t0 = min(t0, a // DAY * DAY)
    return t0, t1


def _label_w(fmt: str) -> float:
    return len(datetime(2026, 12, 31, 23, 59, tzinfo=UTC).strftime(fmt)) * CHAR_W


def point_label(cell_id: str, p: Point) -> str:
    """A point's tooltip names its build and logical date (what a bisect needs)."""
    build = f" build {p.build}" if p.build else ""
    return f"{cell_id}{build} {p.time.astimezone(UTC):%Y-%m-%d %H:%M} UTC: {_fmt(p.value)}"


# -- change points ---------------------------------------------------------------------------
def _point_at(s: Series, when: datetime) -> Point | None:
    """The series' point of the change's first run (same time), else the first after it."""
    later = [p for p in s.points if p.time >= when and not math.isnan(p.value)]
    return min(later, key=lambda p: p.time) if later else None


def _pct(change: float | None) -> str:
    return "?" if change is None or not math.isfinite(change) else f"{change * 100:+.1f} %"


def _day(t: datetime | None) -> str:
    return f"{t.astimezone(UTC):%Y-%m-%d}" if t else "?"


def change_tooltip(c: ChangePoint, cell_id: str, metric: str) -> str:
    """Before -> after, % change, significance, the builds and the triage state."""
    lines = [f"{c.direction} of {metric} on {cell_id}: {_pct(c.change)}"]
    if c.mean_before is not None and c.mean_after is not None:
        lines.append(f"mean {_fmt(c.mean_before)} -> {_fmt(c.mean_after)}")
    if c.median_before is not None and c.median_after is not None:
        lines.append(f"median {_fmt(c.median_before)} -> {_fmt(c.median_after)}")
    if c.p_value is not None:
        lines.append(f"p-value {c.p_value:.2g}")
    lines.append(
        f"builds {c.prev_runtime_version or '?'} ({_day(c.prev_logical_date)}) -> {c.runtime_version or '?'} "
        f"({_day(c.logical_date)}): the first run at the new level"
    )
    state = f"state {c.state}"
    if c.state_by:
        state += f" by {c.state_by}"
    if c.state_at:
        state += f" at {c.state_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    lines.append(state)
    return "\n".join(lines)


def change_links(c: ChangePoint, suite_url: str) -> tuple[str, str]:
    """(its group's entry on the history page, the matrix page of its first run)."""
    anchor = f"group-{c.group_id}" if c.group_id is not None else f"change-{c.id}"
    return (
        f"{suite_url}/history#{anchor}",
        f"{suite_url}?run_id={quote(c.run_id, safe=':')}",
    )


def _change_mark(
    c: ChangePoint,
    cell_id: str,
    metric: str,
    xx: float,
    yy: float | None,
    suite_url: str | None,
    top: float,
    bottom: float,
) -> str:
    """A vertical line at the change's first run (links to its group), a label with the %
    change, and a diamond on the series' point there (links to the run)."""
    tip = f"<title>{esc(change_tooltip(c, cell_id, metric))}</title>"
    group_href, run_href = change_links(c, suite_url) if suite_url is not None else ("", "")

    def link(cls: str, href: str, inner: str) -> str:
        if not href:
            return f'<g class="{cls}">{tip}{inner}</g>'
        return f'<a class="{cls}" href="{esc(href)}">{tip}{inner}</a>'

    right = xx > W - RIGHT - 60
    label_x = xx - 3 if right else xx + 3
    line = (
        f'<line class="cp-hit" x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{bottom}"/>'
        f'<line class="cp-line" x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{bottom}"/>'
        f'<text class="cp-label" x="{label_x:.1f}" y="{top + 10}" '
        f'text-anchor="{"end" if right else "start"}">{esc(_pct(c.change))}</text>'
    )
    out = [
        f'<g class="change c-{esc(c.direction)} t-{esc(c.state)}" data-change-id="{c.id}" '
        f'data-group-id="{"" if c.group_id is None else c.group_id}" '
        f'data-cell-id="{esc(cell_id)}" data-time="{c.logical_date.astimezone(UTC).isoformat()}" '
        f'data-build="{esc(c.runtime_version or "")}" data-state="{esc(c.state)}">',
        link("cp-group", group_href, line),
    ]
    if yy is not None:
        d = f"M{xx:.1f},{yy - 7:.1f}L{xx + 7:.1f},{yy:.1f}L{xx:.1f},{yy + 7:.1f}L{xx - 7:.1f},{yy:.1f}Z"
        out.append(link("cp-run", run_href, f'<path class="cp-mark" d="{d}"/>'))
    out.append("</g>")
    return "".join(out)


CSS = """
svg.trend .xgrid{stroke:#edf2f7}
svg.trend .change .cp-line{stroke:#c53030;stroke-width:1.5;stroke-dasharray:4 3}
svg.trend .change .cp-hit{stroke:transparent;stroke-width:10}
svg.trend .change .cp-mark{fill:#fff;stroke:#c53030;stroke-width:2.5}
svg.trend .change .cp-label{fill:#c53030;font-weight:700}
svg.trend .c-improvement .cp-line,svg.trend .c-improvement .cp-mark{stroke:#2f855a}
svg.trend .c-improvement .cp-label{fill:#2f855a}
svg.trend .change:not(.t-untriaged):not(.t-acknowledged) .cp-line{stroke-opacity:.45}
svg.trend .change:hover .cp-line{stroke-width:3}
.b-change{background:#744210}
svg.trend .offscale rect{fill:#68d391;fill-opacity:.8}svg.trend .offscale text{fill:#276749}
""".strip()
