"""A benchmark's trend as inline SVG, rendered on the server: no JavaScript, no CDN.

One chart per (benchmark, metric): the bounds in force at each point as a band, the bounds
in the bounds file today as dashed lines, one line per cell, points outside their bounds
ringed in red, and series classified as a regression drawn thick and labelled.
"""

from __future__ import annotations

import math
from datetime import datetime

from accelmatrix.ui.grid import esc
from accelmatrix.ui.model import Trend

W, H = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 14, 34
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


def render_trend(trend: Trend, chart_id: str) -> str:
    """The chart as an <svg> element plus an HTML legend (one <figure>)."""
    points = [p for s in trend.series for p in s.points]
    times = [p.time for p in points] + [t for t, _, _ in trend.band]
    if not times:
        return ""
    cur_lo, cur_hi = trend.current or (None, None)
    # The y-axis spans the points and the band they were judged against; today's bounds
    # lines are drawn only where they fall inside (a file's generous upper bound must not
    # squash milliseconds onto the zero line).
    ys = _finite(
        [p.value for p in points]
        + [lo for _, lo, _ in trend.band]
        + [hi for _, _, hi in trend.band]
    ) or _finite([cur_lo, cur_hi])
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.1 or 1.0
    y0, y1 = max(0.0, y0 - pad) if y0 >= 0 else y0 - pad, y1 + pad
    t0, t1 = min(times).timestamp(), max(times).timestamp()
    single = t1 <= t0
    if single:  # one run: the point in the middle, one tick, no invented time span
        t0, t1 = t0 - 60, t1 + 60
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
    span = t1 - t0
    fmt = "%Y-%m-%d" if span > 2 * 86400 else "%m-%d %H:%M"
    ticks = [(min(times), "middle")] if single else []
    for i in range(0 if single else 5):
        t = datetime.fromtimestamp(t0 + span * i / 4, tz=min(times).tzinfo)
        ticks.append((t, "start" if i == 0 else "end" if i == 4 else "middle"))
    if single:
        fmt = "%Y-%m-%d %H:%M"
    for t, anchor in ticks:
        xx = x(t)
        parts.append(
            f'<text class="tick" x="{xx:.1f}" y="{H - 12}" text-anchor="{anchor}">'
            f"{esc(t.strftime(fmt))}</text>"
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
            label = f"{s.cell_id} {p.time:%Y-%m-%d %H:%M}: {_fmt(p.value)}"
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
    caption = f"<b>{esc(trend.benchmark)}</b> &middot; {esc(trend.metric)}"
    if regs:
        caption += f' <span class="badge b-regression">{len(regs)} regression(s)</span>'
    return (
        f'<figure class="chart" data-benchmark="{esc(trend.benchmark)}">'
        f"<figcaption>{caption}</figcaption>{''.join(parts)}"
        f'<ul class="series-legend">{"".join(legend)}</ul></figure>'
    )
