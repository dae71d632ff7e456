"""accelmatrix maintenance DAG, daily: change points over every series' whole history, then
bounds re-centered only onto levels nobody has to decide about.

Thin on purpose: the logic is in accelmatrix.history (nothing heavy imported at parse
time). ``analyse_history`` recomputes every suite's change points over all its points (the
gate re-analyses only the last ``history.window`` points after each run), notifies new
regression groups once, and stores the series verdicts for the matrix page.
``recenter_bounds`` then re-centers the bounds of each bounds file from the history
window, using only points after a series' last accepted change point and before any change
still untriaged or acknowledged; a benchmark with an open regression keeps its bounds (the
log says which change holds it), as does one with fewer than ``min_samples`` samples. The
new bounds are stored in the results store (by ``accelmatrix-maintenance``, with the window
and sample count); the bounds files under include/ (git's) are never written.
``prune_deliveries`` forgets the GitHub webhook deliveries older than their retention
(``accelmatrix.results.pull_requests.DELIVERY_RETENTION_DAYS``; docs/pull-requests.md).
``retention``, beside them, deletes the runs older than their kind's retention from the
results store and from the warehouse (``ACCELMATRIX_RETENTION``; unset, it deletes nothing).
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Param, get_current_context, task

with DAG(
    dag_id="accelmatrix_maintenance",
    description="Change points over the whole perf history; bounds re-centered, never across a regression",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["accelmatrix", "maintenance"],
    params={
        "bounds_files": Param(
            [],
            type="array",
            items={"type": "string"},
            description=(
                "bounds files to re-center, relative to the include dir "
                "(empty: every bounds file a suite's checks read)"
            ),
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
        from accelmatrix.history.bounds.bounds_job import maintenance_recenter

        p = get_current_context()["params"]
        return maintenance_recenter(
            list(p["bounds_files"]),
            window_days=int(p["window_days"]),
            confidence_level=float(p["confidence_level"]),
            min_samples=int(p["min_samples"]),
            now=_end(),
        )

    @task(retries=0)
    def analyse_history() -> dict:
        from accelmatrix.history.change_points.history_pass import maintenance_history

        return maintenance_history(now=_end())

    @task(retries=1)
    def prune_deliveries() -> int:
        from accelmatrix.results import results_store

        return results_store().prune_deliveries(_end() or datetime.now(UTC))

    analyse_history() >> recenter_bounds()
    prune_deliveries()

    @task(retries=0)
    def retention() -> dict:
        """Runs past their kind's days deleted from the store and the warehouse
        (ACCELMATRIX_RETENTION; unset: nothing deleted). accelmatrix.warehouse.retention."""
        import msgspec

        from accelmatrix.warehouse.retention import apply_retention

        return msgspec.to_builtins(apply_retention(now=_end()))

    retention()
