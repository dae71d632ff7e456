"""Charts scaled to the data (issue 40): a 4 ms step time judged against bounds 0 to 0.5 s
was drawn flat on the zero line. The y-axis now spans the points; a bound far outside is
marked at the edge; a bound near the points is drawn to scale."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from accelmatrix.ui.trend import BOTTOM, TOP, H, render_trend, y_range
from accelmatrix.ui.trend_model import Point, Series, Trend

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


def _trend(values: list[float], lower: float, upper: float) -> Trend:
    times = [T0 + timedelta(days=i) for i in range(len(values))]
    points = [
        Point(t, v, lower, upper, run_id=f"r{i}")
        for i, (t, v) in enumerate(zip(times, values, strict=True))
    ]
    return Trend(
        benchmark="b",
        metric="step_time",
        series=[Series("c=1", "ok", points)],
        band=[(t, lower, upper) for t in times],
        current=(lower, upper),
    )


def _ys(svg: str) -> list[float]:
    return [float(y) for y in re.findall(r'<circle[^>]* cy="([-\d.]+)"', svg)]


def _tick_values(svg: str) -> list[float]:
    return [
        float(v)
        for v in re.findall(r'<text class="tick" [^>]*text-anchor="end">([^<]+)</text>', svg)
    ]


def test_milliseconds_against_a_generous_bound_fill_the_axis() -> None:
    values = [0.0040, 0.0042, 0.0038, 0.0041, 0.0044]
    svg = render_trend(_trend(values, 0.0, 0.5), "t")
    ys = _ys(svg)
    assert len(ys) == len(values)
    # Every point inside the plot, and spread over it (not one flat line at an edge).
    assert all(TOP <= y <= H - BOTTOM for y in ys)
    assert max(ys) - min(ys) > 0.5 * (H - BOTTOM - TOP)
    # The axis' ticks contain the points, and are not stretched to the bound.
    ticks = _tick_values(svg)
    assert min(ticks) <= min(values) and max(ticks) >= max(values)
    assert max(ticks) < 0.01
    # The upper bound is named at the top edge; the lower bound 0 too (below every point).
    assert 'class="offscale upper" data-bound="0.5"' in svg
    assert 'class="offscale lower" data-bound="0"' in svg
    # Today's bounds lines are not drawn off the axis.
    assert 'class="current upper"' not in svg


def test_bounds_near_the_points_are_drawn_to_scale() -> None:
    values = [1.0, 1.02, 0.98, 1.65]  # the last point regressed past the upper bound
    svg = render_trend(_trend(values, 0.9, 1.1), "t")
    ticks = _tick_values(svg)
    assert min(ticks) <= 0.9 and max(ticks) >= 1.65
    assert "offscale" not in svg
    assert 'class="current upper"' in svg and 'class="current lower"' in svg


def test_y_range_rules() -> None:
    # No points yet: the bounds decide.
    assert y_range([], [0.9, 1.1], []) == (0.9 - 0.016, 1.1 + 0.016)
    # A positive series never gets a negative axis.
    lo, hi = y_range([0.001, 0.002], [0.0], [])
    assert lo >= 0.0 and hi > 0.002
    # A far bound is ignored by the axis; a near one is kept.
    assert y_range([10.0, 11.0], [1000.0], [])[1] < 12
    assert y_range([10.0, 11.0], [11.5], [])[1] > 11.5
