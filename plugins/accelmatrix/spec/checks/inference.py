"""Check types of inference suites (pydantic only: parsed with the suite at DAG parse time).

Observation code: accelmatrix.evaluation.checks.inference.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register
from accelmatrix.spec.include_paths import relative_path

__all__ = ["GoldenCasesCheck"]


@register
class GoldenCasesCheck(CheckBase):
    """At most ``max_failed`` golden cases failed, and at least ``min_cases`` ran.

    Reads the runner's results JSONL (one row per case and variant: name, variant, status,
    passed, reason); a failure names the failing cases and their first difference.
    """

    type: Literal["golden_cases"] = "golden_cases"
    results: str = Field("out/results.jsonl", description="relative to the collected files")
    max_failed: int = Field(0, ge=0)
    min_cases: int = Field(1, ge=0, description="cases that must have run (not skipped)")

    @field_validator("results")
    @classmethod
    def _relative(cls, v: str) -> str:
        return relative_path(v, "results")

    def _name_detail(self) -> str:
        return self.results
