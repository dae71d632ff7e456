"""Checks of the runtime x machine suite: a workload's item report, executed notebooks.

Both read structured files the workload leaves in the cell's files dir instead of a log a
person has to scroll through (the system this replaces had no pass/fail at all).
Observation code: accelmatrix.evaluation.checks.runtime.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register
from accelmatrix.spec.include_paths import relative_path

__all__ = ["NotebooksCheck", "ReportItemsCheck"]


@register
class ReportItemsCheck(CheckBase):
    """Every item of a JSON report `{"items": [{name, expected, observed, passed}]}` passed.

    The environment report of include/workloads/runtime/env_checks.py has this shape: one
    item per tool, import, Python version and device-visibility check. The verdict names
    each failed item with what was expected and what was found.
    """

    type: Literal["report_items"] = "report_items"
    path: str = Field(description="report file relative to the collected files dir")
    min_items: int = Field(1, ge=1, description="fewer items means the report is incomplete")

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        return relative_path(v, "path")

    def _name_detail(self) -> str:
        return self.path


@register
class NotebooksCheck(CheckBase):
    """Executed notebooks (papermill output) contain no error, and the expected ones exist.

    `expected` lists notebook file names; a comma-separated string is accepted so it can
    come from an axis field (`expected: "${axis.runtime.notebooks}"`). A failure names the
    notebook, the failing cell (index in the source notebook), its source and the error.
    """

    type: Literal["notebooks"] = "notebooks"
    glob: str = Field("out/notebooks/*.ipynb", description="executed notebooks")
    expected: list[str] | str = Field(default_factory=list)

    @field_validator("glob")
    @classmethod
    def _relative(cls, v: str) -> str:
        return relative_path(v, "glob")

    @property
    def expected_names(self) -> list[str]:
        raw = self.expected.split(",") if isinstance(self.expected, str) else self.expected
        return [x.strip() for x in raw if x.strip()]

    def _name_detail(self) -> str:
        return self.glob
