"""accelmatrix maintenance DAG: re-center step-time bounds and classify perf series, daily.

Thin on purpose: the logic is in accelmatrix.history.bounds_job (nothing heavy imported at
parse time). ``recenter_bounds`` rewrites each bounds file from the history window (a
benchmark with fewer than ``min_samples`` samples keeps its bounds; the log shows old ->
new); ``classify_series`` stores every suite's series verdicts for the matrix page.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Param, get_current_context, task

with DAG(
    dag_id="accelmatrix_maintenance",
    description="Re-center step-time bounds from the perf history; classify perf series",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["accelmatrix", "maintenance"],
    params={
        "bounds_files": Param(
            ["bounds/step_time_bounds.yaml"],
            type="array",
            items={"type": "string"},
            description="bounds files to re-center, relative to the include dir",
        ),
        "window_days": Param(30, type="integer", minimum=1, description="history window"),
        "confidence_level": Param(
            0.95, type="number", exclusiveMinimum=0, exclusiveMaximum=1, description="t-interval"
        ),
        "min_samples": Param(
            10, type="integer", minimum=2, description="fewer samples: keep the old bounds"
        ),
    },
    doc_md=__doc__,
) as dag:

    def _end() -> datetime | None:
        """The window ends at the run's logical date (a backfill re-centers as of then)."""
        return get_current_context()["dag_run"].logical_date

    @task(retries=0)
    def recenter_bounds() -> dict:
        from accelmatrix.history.bounds_job import maintenance_recenter

        p = get_current_context()["params"]
        return maintenance_recenter(
            list(p["bounds_files"]),
            window_days=int(p["window_days"]),
            confidence_level=float(p["confidence_level"]),
            min_samples=int(p["min_samples"]),
            now=_end(),
        )

    @task(retries=0)
    def classify_series() -> dict:
        from accelmatrix.history.bounds_job import maintenance_classify

        return maintenance_classify(now=_end())

    recenter_bounds() >> classify_series()
