"""CollectOperator: copy the cell's artifacts off its machine and turn them into metric
rows. It runs to completion on a worker, also after a failed workload (its logs and partial
metrics are what on-call reads)."""

from __future__ import annotations

from typing import Any

from accelmatrix.steps.cell_operator import CellOperator
from accelmatrix.steps.collect.work import collect


class CollectOperator(CellOperator):
    """Copy the cell's artifacts off its machine and turn them into metric rows."""

    ui_color = "#f4f0e6"

    def execute(self, context: Any) -> dict[str, Any]:
        return collect(self.cell, self.provisioned_resource(context), self.ref(context))
