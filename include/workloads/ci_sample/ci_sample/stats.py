"""Small, pure functions: easy to test, easy to break on purpose in a later commit."""

from __future__ import annotations

from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; an empty input is an error, not a zero."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    """Middle value (mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Means of every full window, in order."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [mean(values[i : i + window]) for i in range(len(values) - window + 1)]
