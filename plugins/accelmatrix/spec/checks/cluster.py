"""Checks of the cluster-validation suite. Observation code: evaluation.checks.cluster."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, PositiveInt, field_validator

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register

__all__ = ["WorkersStartedCheck"]

DEFAULT_PATTERN = r"worker (?P<worker>\d+) started at (?P<ts>[0-9]+(?:\.[0-9]+)?)"


@register
class WorkersStartedCheck(CheckBase):
    """All `workers` workers logged their start within `within` seconds of the job's start.

    The successor of "all pods reach Running within 5 minutes". `pattern` matches one log
    line per worker start with the named groups `worker` (its id) and `ts` (epoch
    seconds). The job's start is the workload's start as recorded by accelmatrix (its
    status), or the first worker's start when that is unknown.
    """

    type: Literal["workers_started"] = "workers_started"
    workers: PositiveInt
    within: float = Field(gt=0, description="seconds from the job's start")
    pattern: str = DEFAULT_PATTERN

    @field_validator("pattern")
    @classmethod
    def _groups(cls, v: str) -> str:
        try:
            groups = set(re.compile(v).groupindex)
        except re.error as e:
            raise ValueError(f"pattern {v!r} is not a valid regular expression: {e}") from None
        if not {"worker", "ts"} <= groups:
            raise ValueError(
                f"pattern {v!r} needs the named groups (?P<worker>...) and (?P<ts>...)"
            )
        return v

    def _name_detail(self) -> str:
        return f"{self.workers} within {self.within:g}s"
