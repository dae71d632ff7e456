"""Checks of CI suites: JUnit test results and elapsed-time regression.

Observation code: accelmatrix.evaluation.checks.ci. Only pydantic is imported: suites are
parsed at DAG parse time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register
from accelmatrix.spec.include_paths import relative_path

__all__ = ["ElapsedRegressionCheck", "JunitCheck"]


@register
class JunitCheck(CheckBase):
    """Test results from JUnit XML files: counts within limits; failures are named.

    ``glob`` is relative to the cell's collected files; every matching file is summed (e.g.
    lint and unit-test reports). Never a grep for "OK": a run whose report is missing or
    unreadable fails, as does one with fewer than ``min_passed`` passing tests.
    """

    type: Literal["junit"] = "junit"
    glob: str
    max_failed: int = Field(0, ge=0)
    max_errored: int = Field(0, ge=0)
    min_passed: int = Field(1, ge=0)
    max_skipped: int | None = Field(None, ge=0)

    @field_validator("glob")
    @classmethod
    def _glob_relative(cls, v: str) -> str:
        return relative_path(v, "glob")

    def _name_detail(self) -> str:
        return self.glob


@register
class ElapsedRegressionCheck(CheckBase):
    """A duration metric against a stored baseline: above ``max_ratio`` x baseline fails.

    The baseline is the ``baseline_key`` entry of a YAML file under include/ (``baseline_file``,
    ``{baselines: {key: {elapsed_seconds: 105}}}``), reviewed like code: re-baselining is a
    commit, not a side effect of a slow run. Usually written with ``severity: warning``, as
    the system this replaces only warned above 1.2x.
    """

    type: Literal["elapsed_regression"] = "elapsed_regression"
    metric: str = Field("elapsed_seconds", min_length=1)
    baseline_file: str
    baseline_key: str = Field(min_length=1)
    max_ratio: float = Field(1.2, gt=0)

    @field_validator("baseline_file")
    @classmethod
    def _file_relative(cls, v: str) -> str:
        return relative_path(v, "baseline_file")

    @model_validator(mode="after")
    def _ratio(self) -> ElapsedRegressionCheck:
        if self.max_ratio < 1:
            raise ValueError(
                f"max_ratio must be >= 1 (a run faster than its baseline is fine), got {self.max_ratio}"
            )
        return self

    def _name_detail(self) -> str:
        return self.baseline_key
