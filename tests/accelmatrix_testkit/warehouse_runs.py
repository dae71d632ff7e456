"""Finished runs written to a results store the way the steps and the gate write them
(upsert_run, upsert_cell, replace_metrics, replace_checks), for the warehouse tests and
bench/bench_warehouse.py: N cells, a few metric points and check verdicts each, a known
verdict per cell, so every count the export should produce is known in advance."""

from __future__ import annotations

from datetime import datetime, timedelta

from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.run_records import MetricValue

__all__ = ["STEPS", "fill_run", "expected_rows"]

STEPS = 3  # step_time points per cell, besides one scalar (throughput)


def fill_run(
    store,
    dag_id: str,
    run_id: str,
    *,
    cells: int,
    logical_date: datetime,
    failed: frozenset[int] = frozenset(),
    state: str | None = None,
    run_type: str = "scheduled",
    build: str = "b1",
) -> None:
    """A run of ``cells`` cells; the cells at the indexes ``failed`` failed (check and
    state), the others passed; ``state`` the run's verdict (failed when any cell failed)."""
    store.upsert_run(
        dag_id,
        run_id,
        suite=dag_id,
        logical_date=logical_date,
        run_type=run_type,
        runtime_version=build,
        started_at=logical_date,
        state=state or ("failed" if failed else "passed"),
        finished_at=logical_date + timedelta(minutes=5),
    )
    for i in range(cells):
        cid = f"model=m{i % 8},chips={1 + i // 8}"
        bad = i in failed
        store.upsert_cell(
            dag_id, run_id, cid,
            cell_index=i, axes={"model": f"m{i % 8}", "chips": 1 + i // 8},
            machine="cpu", backend="local", state="failed" if bad else "passed",
            workload_seconds=10.0 + i, cost=0.01,
        )  # fmt: skip
        store.replace_metrics(
            dag_id, run_id, cid,
            [MetricValue(name="step_time", value=0.1 + 0.01 * s, step=s, unit="s")
             for s in range(STEPS)]
            + [MetricValue(name="throughput", value=100.0 + i, unit="items/s")],
        )  # fmt: skip
        store.replace_checks(
            dag_id, run_id, cid,
            [CheckVerdict(name="exit_code", type="exit_code", passed=not bad,
                          expected="0", observed="1" if bad else "0", message=""),
             CheckVerdict(name="step_time", type="step_time_within_bounds", passed=True,
                          expected="[0.05, 0.2]", observed="0.11", message="",
                          perf={"benchmark": f"m{i % 8}", "metric": "step_time",
                                "value": 0.11, "lower_bound": 0.05, "upper_bound": 0.2})],
        )  # fmt: skip


def expected_rows(cells: int) -> dict[str, int]:
    """The rows one run filled by fill_run gives each per-run table."""
    return {
        "runs": 1,
        "cells": cells,
        "metric_points": cells * (STEPS + 1),
        "check_verdicts": cells * 2,
    }
