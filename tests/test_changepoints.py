"""The change-point detector on generated series with known answers: false positives on
noise (Gaussian and heavy-tailed, with lone outliers and 2-point blips), steps found at
their exact position with the reported sizes, the tail rules, and agreement with
ruptures' PELT on the same penalised problem. Rates over many series, not one example."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accelmatrix.history.series.detector import DEFAULT, Detector, detect, detect_many

LEVEL, SIGMA = 100.0, 2.0


def noise(rng: np.random.Generator, shape, heavy: bool = False) -> np.ndarray:
    if heavy:
        return SIGMA * rng.standard_t(3, shape) / math.sqrt(3)
    return SIGMA * rng.standard_normal(shape)


@pytest.mark.parametrize("heavy", [False, True])
def test_no_change_points_on_noise_with_outliers_and_blips(heavy: bool) -> None:
    rng = np.random.default_rng(7 + heavy)
    x = LEVEL + noise(rng, (100, 365), heavy)
    for row in x:
        # one lone 6-sigma outlier and one 2-point 6-sigma blip per 100 points, apart
        for start in range(20, 345, 100):
            row[start] += 6 * SIGMA
            row[start + 40 : start + 42] -= 6 * SIGMA
    found = detect_many(list(x))
    false = sum(len(f) for f in found)
    assert false * 1000 / x.size <= 1.0, [
        (i, [c.index for c in f]) for i, f in enumerate(found) if f
    ]


@pytest.mark.parametrize("size", [10.0, 6.0, 4.0, 2.5])
def test_a_step_is_found_at_its_position_with_its_size(size: float) -> None:
    rng = np.random.default_rng(int(size * 10))
    x = LEVEL + noise(rng, (100, 90))
    x[:, 60:] *= 1 + size * SIGMA / LEVEL  # a step of `size` sigmas, relative
    found = detect_many(list(x))
    hits = [next((c for c in f if abs(c.index - 60) <= 1), None) for f in found]
    assert sum(h is not None for h in hits) >= (95 if size >= 4 else 85)
    exact = [h.index == 60 for h in hits if h is not None]
    assert sum(exact) / len(exact) >= (0.9 if size >= 4 else 0.7)
    h = next(h for h in hits if h is not None and h.index == 60)
    assert h.before.n == 60 and h.after.n == 30
    assert h.change == pytest.approx(size * SIGMA / LEVEL, abs=0.012)
    assert h.effect == pytest.approx(size, rel=0.35) and h.p_value < 1e-6


def test_delay_a_big_step_is_reported_with_two_points_a_lone_point_never() -> None:
    rng = np.random.default_rng(3)
    base = LEVEL + noise(rng, (200, 62))
    base[:, 60:] += 12 * SIGMA
    one = detect_many(list(base[:, :61]))  # only the first point at the new level
    two = detect_many(list(base))
    assert sum(bool(f) for f in one) == 0
    assert sum(any(c.index == 60 for c in f) for f in two) >= 180


def test_a_two_point_blip_at_the_end_is_not_a_change_and_a_third_point_decides() -> None:
    rng = np.random.default_rng(5)
    x = LEVEL + noise(rng, (200, 63))
    x[:, 60:62] += 6 * SIGMA  # two high nights
    blip_now = detect_many(list(x[:, :62]))
    returned = detect_many(list(x))  # the third night is back at the old level
    assert sum(bool(f) for f in blip_now) <= 4
    assert sum(bool(f) for f in returned) <= 2
    x[:, 62] += 6 * SIGMA  # ... or it stays high: a new level
    stayed = detect_many(list(x))
    assert sum(any(abs(c.index - 60) <= 1 for c in f) for f in stayed) >= 180


def test_regression_and_its_fix_are_two_change_points() -> None:
    rng = np.random.default_rng(11)
    x = LEVEL + noise(rng, 120)
    x[50:58] += 5 * SIGMA
    found = detect(x)
    assert [c.index for c in found] == [50, 58]
    assert found[0].change > 0 > found[1].change


def test_noise_scale_is_the_series_own() -> None:
    """The same 5 % step is a change in a 1 %-noise series and not in a 10 %-noise one."""
    rng = np.random.default_rng(2)
    quiet = 100 * (1 + 0.01 * rng.standard_normal(80))
    loud = 100 * (1 + 0.10 * rng.standard_normal(80))
    quiet[50:] *= 1.05
    loud[50:] *= 1.05
    assert [c.index for c in detect(quiet)] == [50]
    assert detect(loud) == []


def test_constant_and_short_series() -> None:
    assert detect([5.0] * 30) == []
    assert detect([1.0, 2.0]) == []
    steps = [1.0] * 20 + [2.0] * 20  # no noise at all: the floor keeps it finite
    (cp,) = detect(steps)
    assert cp.index == 20 and cp.change == pytest.approx(1.0) and math.isfinite(cp.effect)
    with pytest.raises(ValueError, match="finite"):
        detect([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="min_size"):
        Detector(min_size=1)


def test_detect_many_equals_detect_one_by_one() -> None:
    rng = np.random.default_rng(9)
    series = [LEVEL + noise(rng, n) for n in (40, 40, 75, 3, 40)]
    series[1][25:] += 8 * SIGMA
    series[2][30:] -= 5 * SIGMA
    many = detect_many(series)
    assert many == [detect(s) for s in series]
    assert [c.index for c in many[1]] == [25] and [c.index for c in many[2]] == [30]


def test_segmentation_agrees_with_ruptures_pelt() -> None:
    """Before the merge rules, the segmentation is the exact optimum of squared error plus
    a penalty per change: ruptures' PELT (model l2) must find the same change points on
    the same standardised, cleaned series."""
    import ruptures  # requirements-dev.txt

    from accelmatrix.history.series import detector as cpm

    rng = np.random.default_rng(4)
    for trial in range(15):
        x = LEVEL + noise(rng, 150)
        for at in rng.choice(np.arange(10, 140), size=trial % 4, replace=False):
            x[at:] += rng.choice([-1, 1]) * rng.uniform(2, 8) * SIGMA
        raw = x[None, :]
        sigma = cpm._noise_sigma(raw, DEFAULT.min_relative_sigma, DEFAULT.noise_lag)
        clean = cpm._replace_outliers(raw, sigma, DEFAULT.outlier)
        sigma = np.maximum(sigma, cpm._spread_sigma(clean, sigma))
        z = clean / sigma[:, None]
        beta = DEFAULT.penalty * math.log(150)
        ours = cpm._backtrack(cpm._optimal_partition(z, beta, min_size=2)[0], 150)
        theirs = ruptures.Pelt(model="l2", min_size=2, jump=1).fit(z[0]).predict(pen=beta)[:-1]
        assert ours == theirs, (trial, ours, theirs)
