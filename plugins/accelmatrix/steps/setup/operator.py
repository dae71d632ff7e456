"""SetupOperator: run the suite's setup commands (and start its services) on the cell's
machine. It runs to completion on a worker: nothing to wait for in the triggerer."""

from __future__ import annotations

from typing import Any

from accelmatrix.steps.cell_operator import CellOperator, resource_record
from accelmatrix.steps.setup.work import setup


class SetupOperator(CellOperator):
    """Run the suite's setup commands (and start its services) on the cell's machine."""

    template_fields = ("cell", "resource")
    ui_color = "#e6f0fa"

    def __init__(self, *, resource: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.resource = resource

    def execute(self, context: Any) -> None:
        setup(self.cell, resource_record(self.resource), self.ref(context))
