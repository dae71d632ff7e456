"""Checks of a run as a whole (``run_checks:`` in a suite), judged over the run's table of
cells at the gate, after every cell has its verdict.

Every run is validated for what makes its verdict true (every planned cell reported once
and has a verdict; no passed cell has a failed check: ``accelmatrix.evaluation.run_table``);
a suite adds what only the whole run can show. Only pydantic is imported.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CellsAgreeCheck", "RunCheck"]


class CellsAgreeCheck(BaseModel):
    """The cells of one group agree on a perf metric within a ratio: no cell's value is more
    than ``within`` times the smallest value of its group.

    A group is the cells with the same values of the ``by`` axes on machines of one backend
    kind (``same_machine_kind``): a model's step time on every runtime of one kind of
    machine, say. The value is each cell's perf check value of ``metric`` (the median step
    time of ``step_time_within_bounds``). A cell without a value (it failed before) is not
    judged here: its own verdict says why.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["cells_agree"] = "cells_agree"
    name: str | None = None
    metric: str = Field(default="step_time", min_length=1)
    by: list[str] = Field(default_factory=list)
    within: float = Field(gt=1)
    same_machine_kind: bool = True

    @property
    def display_name(self) -> str:
        by = ",".join(self.by) or "all cells"
        return self.name or f"cells_agree[{self.metric} by {by}]"


RunCheck = Annotated[CellsAgreeCheck, Field(discriminator="type")]
