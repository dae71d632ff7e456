"""The ``metric_exists`` check: a metric was collected at all, with a usable value.

For a metric no range can be given for (a new counter, a run's total), or as the first
line of defence before ``metric_between``: a metric source that silently stopped matching
makes every later check of that metric fail with "missing", this one says it once, plainly.
Observation code: accelmatrix.evaluation.checks.metric_exists.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register

__all__ = ["MetricExistsCheck"]


@register
class MetricExistsCheck(CheckBase):
    """The cell's metrics hold at least one finite value of ``metric``."""

    type: Literal["metric_exists"] = "metric_exists"
    metric: str = Field(min_length=1)

    def _name_detail(self) -> str:
        return self.metric
