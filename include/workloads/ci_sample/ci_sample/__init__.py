"""Statistics helpers used by the tiered_ci example suite."""

from ci_sample.stats import mean, median, moving_average

__all__ = ["mean", "median", "moving_average"]
