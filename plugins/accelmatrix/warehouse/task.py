"""The suite DAG's ``export`` task: after the gate decided, the run's rows to the warehouse.

It is a teardown task downstream of the gate (dag_factory.py): it runs whatever the gate
decided, also when a person marked the run failed, and, as a teardown without
``on_failure_fail_dagrun``, its own outcome never changes the run's state. A warehouse
that stays down past the retries fails this task only: its log holds one line with the
command that exports the run again, and the run keeps the gate's verdict.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExportFailed", "export_step"]


class ExportFailed(RuntimeError):
    """The export did not reach the warehouse (the log line before says what to run)."""


def export_step(dag_id: str, run_id: str) -> dict[str, Any]:
    from accelmatrix.results import results_store
    from accelmatrix.warehouse.config import WarehouseConfig
    from accelmatrix.warehouse.export import export_after_gate

    config = WarehouseConfig.from_env()
    if config is None:
        return {"exported": False, "reason": "ACCELMATRIX_WAREHOUSE_DATASET is not set"}
    result = export_after_gate(results_store(), dag_id, run_id, config)
    if result is None:
        raise ExportFailed(f"warehouse export of {dag_id} {run_id} failed; see the line above")
    return {"exported": True, "rows": result.rows, "seconds": round(result.seconds, 3)}
