"""What every check model shares: the common fields, the derived name, and the field rules
more than one family uses (paths under a base dir: ``accelmatrix.spec.include_paths``).
Only pydantic is imported: suites are parsed at DAG parse time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CheckBase", "Reduce", "RowsSelection", "check_min_max"]

# How a metric's rows become what a check judges: one reduced value, or ``each`` row.
Reduce = Literal["last", "min", "max", "mean", "median", "each"]


def check_min_max(lo: float | None, hi: float | None, what: str) -> None:
    """Refuse an empty range at load time: ``min > max`` can never pass."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{what}: min ({lo}) must be <= max ({hi})")


class CheckBase(BaseModel):
    """Common fields; ``extra="forbid"`` so a typo in suite YAML is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    # warning: reported in the verdict table and the log, never fails the cell.
    severity: Literal["error", "warning"] = "error"

    @property
    def display_name(self) -> str:
        """The user's name, or a derived one readable in task logs and Data Docs."""
        return self.name or f"{self.type}[{self._name_detail()}]"  # type: ignore[attr-defined]

    def _name_detail(self) -> str:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


class RowsSelection(BaseModel):
    """The per-step fields of a check that judges every step of a metric.

    ``skip_first`` ignores that many warm-up steps (compilation, cache fills); ``mostly`` is
    the fraction of the remaining steps that must pass (1: every one), as Great
    Expectations' ``mostly``, except that a NaN or missing value counts as a failing step.
    """

    mostly: float = Field(default=1.0, gt=0, le=1)
    skip_first: int = Field(default=0, ge=0)
