"""TeardownOperator: release the cell's machine. It is the teardown task of ``provision``,
so it runs after failures too, and it is retried on its own: teardown must happen even when
the cell misbehaved."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accelmatrix.steps.cell_operator import CellOperator, resource_record
from accelmatrix.steps.teardown.work import teardown

TEARDOWN_RETRIES = 3


class TeardownOperator(CellOperator):
    """Release the cell's machine; retried on its own."""

    template_fields = ("cell", "resource")
    ui_color = "#eeeeee"

    def __init__(self, *, resource: Any, **kwargs: Any):
        kwargs.setdefault("retries", TEARDOWN_RETRIES)
        kwargs.setdefault("retry_delay", timedelta(seconds=10))
        super().__init__(**kwargs)
        self.resource = resource

    def execute(self, context: Any) -> dict[str, Any]:
        return teardown(self.cell, resource_record(self.resource), self.ref(context))
