"""The ``steps_complete`` check: every step of a run was logged exactly once, as a number.

A run that lost steps 40-59 (a crashed logger, a truncated file), logged 30-39 twice (a
resume from a checkpoint) or wrote NaN at step 37 can pass every check of a reduced value:
the median does not notice twenty missing steps. This check names them. Observation code:
accelmatrix.evaluation.checks.steps. Only pydantic is imported.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import register

__all__ = ["StepsCompleteCheck"]

_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


@register
class StepsCompleteCheck(CheckBase):
    """Steps ``first_step`` .. ``first_step + steps - 1`` each hold exactly one finite value
    of every metric in ``metrics``.

    ``steps`` is a count or a placeholder (``${params.steps}``) that the plan renders per
    run; a rendered value that is not a whole number fails the check, naming it.
    """

    type: Literal["steps_complete"] = "steps_complete"
    metrics: list[str] = Field(min_length=1)
    steps: int | str
    first_step: int = Field(default=0, ge=0)

    @field_validator("metrics")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not m.strip() for m in v):
            raise ValueError("metrics: a metric name is empty")
        if len(set(v)) != len(v):
            raise ValueError(f"metrics: a metric is listed twice ({v})")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"steps must be >= 1, got {v}")
        if isinstance(v, str) and not v.strip().isdigit() and not _PLACEHOLDER.search(v):
            raise ValueError(
                f"steps must be a whole number or a placeholder such as ${{params.steps}}, "
                f"got {v!r}"
            )
        return v

    def step_count(self) -> int | None:
        """``steps`` as a number; None when the rendered text is not a whole number >= 1."""
        if isinstance(self.steps, int):
            return self.steps
        text = self.steps.strip()
        return int(text) if text.isdigit() and int(text) >= 1 else None

    def expected_steps(self) -> range | None:
        """The steps this check expects, or None when ``steps`` did not render to a count."""
        n = self.step_count()
        return None if n is None else range(self.first_step, self.first_step + n)

    def _name_detail(self) -> str:
        return ",".join(self.metrics)
