"""Checks of what every workload leaves: its exit status, its log, its files.

Observation code: accelmatrix.evaluation.checks.workload. Only pydantic is imported: suites
are parsed at DAG parse time. String fields may contain ``${axis.model}``-style
placeholders; they are resolved before evaluation, so validation treats them as text.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from accelmatrix.spec.checks.check_fields import CheckBase, check_min_max
from accelmatrix.spec.checks.registry import register
from accelmatrix.spec.include_paths import relative_path

__all__ = ["ArtifactCountCheck", "ExitStatusCheck", "LogContainsCheck", "LogNotContainsCheck"]


@register
class ExitStatusCheck(CheckBase):
    """The workload exited with ``expected`` and did not time out."""

    type: Literal["exit_status"] = "exit_status"
    expected: int = 0

    def _name_detail(self) -> str:
        return str(self.expected)


@register
class LogContainsCheck(CheckBase):
    """At least ``min_count`` lines of the workload log match ``pattern``."""

    type: Literal["log_contains"] = "log_contains"
    pattern: str = Field(min_length=1)
    regex: bool = False
    min_count: int = 1

    @field_validator("min_count")
    @classmethod
    def _min_count_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"min_count must be >= 1 (a count of 0 always passes), got {v}")
        return v

    @model_validator(mode="after")
    def _regex_compiles(self) -> LogContainsCheck:
        _compile_if_regex(self.pattern, self.regex)
        return self

    def _name_detail(self) -> str:
        return self.pattern


@register
class LogNotContainsCheck(CheckBase):
    """No line of the workload log matches ``pattern`` (e.g. NCCL timeouts, tracebacks)."""

    type: Literal["log_not_contains"] = "log_not_contains"
    pattern: str = Field(min_length=1)
    regex: bool = True

    @model_validator(mode="after")
    def _regex_compiles(self) -> LogNotContainsCheck:
        _compile_if_regex(self.pattern, self.regex)
        return self

    def _name_detail(self) -> str:
        return self.pattern


def _compile_if_regex(pattern: str, regex: bool) -> None:
    """Fail at suite load time rather than at evaluation time for a broken regex."""
    if not regex:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from exc


@register
class ArtifactCountCheck(CheckBase):
    """The number of files under the cell's files dir matching ``glob`` is within [min, max]."""

    type: Literal["artifact_count"] = "artifact_count"
    glob: str
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)
    count: int | None = Field(default=None, ge=0)

    @field_validator("glob")
    @classmethod
    def _glob_relative(cls, v: str) -> str:
        return relative_path(v, "glob")

    @model_validator(mode="after")
    def _bounds(self) -> ArtifactCountCheck:
        if self.count is not None:
            # Tolerate min == max == count so a dumped model validates again unchanged.
            for bound in (self.min, self.max):
                if bound is not None and bound != self.count:
                    raise ValueError("artifact_count: give either count or min/max, not both")
            self.min = self.max = self.count
        if self.min is None and self.max is None:
            raise ValueError("artifact_count needs count, min or max")
        check_min_max(self.min, self.max, "artifact_count")
        return self

    def _name_detail(self) -> str:
        return self.glob
