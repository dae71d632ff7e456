"""The steps of a cell that run to completion on a worker: setup, collect, teardown.

Each is a thin operator over the matching function of ``accelmatrix.lifecycle`` (where a
step's logic reads top to bottom without Airflow in the way). The steps that wait (provision
for capacity, run for the workload, evaluate for Great Expectations) have modules of their
own because they defer to the triggerer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accelmatrix.operators.base import CellOperator, resource_record

# Teardown must happen even when the cell misbehaved: retried on its own.
TEARDOWN_RETRIES = 3


class SetupOperator(CellOperator):
    """Run the suite's setup commands (and start its services) on the cell's machine."""

    template_fields = ("cell", "resource")
    ui_color = "#e6f0fa"

    def __init__(self, *, resource: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.resource = resource

    def execute(self, context: Any) -> None:
        # The steps write to the results store (SQLAlchemy): kept out of DAG parse time.
        from accelmatrix import lifecycle

        lifecycle.setup(self.cell, resource_record(self.resource), self.ref(context))


class CollectOperator(CellOperator):
    """Copy the cell's artifacts off its machine and turn them into metric rows.

    Runs also after a failed workload (its logs and partial metrics are what on-call reads).
    """

    ui_color = "#f4f0e6"

    def execute(self, context: Any) -> dict[str, Any]:
        # The steps write to the results store (SQLAlchemy): kept out of DAG parse time.
        from accelmatrix import lifecycle

        return lifecycle.collect(self.cell, self.provisioned_resource(context), self.ref(context))


class TeardownOperator(CellOperator):
    """Release the cell's machine; a teardown task of ``provision``, so it runs after
    failures too, and retried on its own."""

    template_fields = ("cell", "resource")
    ui_color = "#eeeeee"

    def __init__(self, *, resource: Any, **kwargs: Any):
        kwargs.setdefault("retries", TEARDOWN_RETRIES)
        kwargs.setdefault("retry_delay", timedelta(seconds=10))
        super().__init__(**kwargs)
        self.resource = resource

    def execute(self, context: Any) -> dict[str, float]:
        # The steps write to the results store (SQLAlchemy): kept out of DAG parse time.
        from accelmatrix import lifecycle

        return lifecycle.teardown(self.cell, resource_record(self.resource), self.ref(context))
