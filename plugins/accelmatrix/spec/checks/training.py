"""Checks of a training run's metrics: a value in range, the final loss, the loss trend, and
step time within a benchmark's bounds from a bounds file under include/.

Observation code: accelmatrix.evaluation.checks.training. Only pydantic is imported.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from accelmatrix.spec.checks.check_fields import CheckBase, Reduce, RowsSelection, check_min_max
from accelmatrix.spec.checks.registry import register
from accelmatrix.spec.include_paths import relative_path

__all__ = [
    "FinalLossCheck",
    "LossDecreasingCheck",
    "MetricBetweenCheck",
    "StepTimeWithinBoundsCheck",
]


@register
class MetricBetweenCheck(CheckBase, RowsSelection):
    """The reduced value of a metric series lies within [min, max]; with ``reduce: each``,
    every step (after ``skip_first``, ``mostly`` of them) does."""

    type: Literal["metric_between"] = "metric_between"
    metric: str = Field(min_length=1)
    min: float | None = None
    max: float | None = None
    reduce: Reduce = "last"

    @model_validator(mode="after")
    def _bounds(self) -> MetricBetweenCheck:
        if self.min is None and self.max is None:
            raise ValueError("metric_between needs at least one of min or max")
        check_min_max(self.min, self.max, "metric_between")
        if self.reduce != "each" and (self.mostly < 1 or self.skip_first > 0):
            raise ValueError(
                f"metric_between: mostly and skip_first judge every step; they need "
                f"reduce: each (got reduce: {self.reduce})"
            )
        return self

    def _name_detail(self) -> str:
        return self.metric


@register
class FinalLossCheck(CheckBase):
    """The last loss value is within ``tolerance`` of ``target``.

    Target and tolerance are given inline, or read from a benchmark of a bounds file
    (``bounds_file`` + ``benchmark``: its ``target_loss`` and ``loss_tolerance`` fields),
    where the system this replaces keeps them next to the step-time bounds.
    """

    type: Literal["final_loss"] = "final_loss"
    metric: str = Field(default="loss", min_length=1)
    target: float | None = None
    tolerance: float | None = None
    bounds_file: str | None = None
    benchmark: str | None = Field(default=None, min_length=1)

    @field_validator("tolerance")
    @classmethod
    def _tolerance_non_negative(cls, v: float | None) -> float | None:
        if v is not None and v < 0:
            raise ValueError(f"tolerance must be >= 0, got {v}")
        return v

    @field_validator("bounds_file")
    @classmethod
    def _bounds_file_relative(cls, v: str | None) -> str | None:
        return None if v is None else relative_path(v, "bounds_file")

    @model_validator(mode="after")
    def _one_source(self) -> FinalLossCheck:
        inline = (self.target is not None, self.tolerance is not None)
        from_file = (self.bounds_file is not None, self.benchmark is not None)
        if any(from_file):
            if not all(from_file):
                raise ValueError("final_loss: bounds_file and benchmark go together")
            if any(inline):
                raise ValueError(
                    "final_loss: give either target/tolerance or bounds_file/benchmark, not both"
                )
        elif not all(inline):
            raise ValueError("final_loss needs target and tolerance (or bounds_file and benchmark)")
        return self

    def _name_detail(self) -> str:
        return self.metric


@register
class LossDecreasingCheck(CheckBase):
    """The mean of the last ``window`` points is below the mean of the first ``window``."""

    type: Literal["loss_decreasing"] = "loss_decreasing"
    metric: str = Field(default="loss", min_length=1)
    window: int = 3

    @field_validator("window")
    @classmethod
    def _window_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"window must be >= 1, got {v}")
        return v

    def _name_detail(self) -> str:
        return self.metric


@register
class StepTimeWithinBoundsCheck(CheckBase, RowsSelection):
    """The median step time lies within a benchmark's bounds from a shared bounds YAML file;
    given ``mostly`` or ``skip_first``, each step (after the warm-up) is judged too."""

    type: Literal["step_time_within_bounds"] = "step_time_within_bounds"
    metric: str = Field(default="step_time", min_length=1)
    bounds_file: str
    benchmark: str = Field(min_length=1)

    @field_validator("bounds_file")
    @classmethod
    def _bounds_file_relative(cls, v: str) -> str:
        return relative_path(v, "bounds_file")

    @property
    def per_step(self) -> bool:
        """Whether each step is judged against the bounds, besides the median: a ``mostly``
        below 1 or a ``skip_first`` above 0 asks for it (the defaults judge the median)."""
        return self.mostly < 1 or self.skip_first > 0

    def _name_detail(self) -> str:
        return self.benchmark
