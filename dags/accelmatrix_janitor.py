"""The accelmatrix janitor DAG: releases accelerators that dead runs left behind.

Thin on purpose: the logic lives in accelmatrix.cleanup.janitor. Every 30 minutes it lists the
managed resources of every machine the suites define and tears down those past their TTL
whose owning task instances are finished (or past TTL plus a grace), recording each in the
results store's ``reaped`` table. Scheduled runs really delete; a manual run is a dry run
unless triggered with ``{"dry_run": false}``.
"""

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param, get_current_context, task

from accelmatrix.cleanup.janitor import DEFAULT_GRACE_SECONDS


@task(task_id="sweep", retries=1, retry_delay=timedelta(minutes=1))
def sweep_task() -> dict:
    from accelmatrix.cleanup import janitor

    ctx = get_current_context()
    params = ctx["params"]
    dry_run = params.get("dry_run")
    if dry_run is None:  # default: a person clicking "trigger" only looks
        run_type = getattr(ctx["dag_run"], "run_type", "")
        dry_run = str(getattr(run_type, "value", run_type)).lower() == "manual"
    report = janitor.run(
        dry_run=bool(dry_run),
        grace_seconds=float(params.get("grace_seconds") or DEFAULT_GRACE_SECONDS),
        lookup=janitor.SdkOwnerLookup(),
        say=print,
    )
    if report.failed or report.unreachable:
        raise RuntimeError(
            f"janitor: {len(report.failed)} teardown(s) failed, "
            f"{len(report.unreachable)} machine(s) could not be listed (see the table above)"
        )
    return {
        "dry_run": bool(dry_run),
        "reaped": [d.resource.name for d in report.reaped],
        "kept": [d.resource.name for d in report.decisions if not d.reap],
    }


with DAG(
    dag_id="accelmatrix_janitor",
    description="Release accelerators left behind by dead accelmatrix runs",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["accelmatrix", "janitor"],
    params={
        "dry_run": Param(
            None,
            type=["null", "boolean"],
            description="Only report (default for manual runs); scheduled runs delete",
        ),
        "grace_seconds": Param(
            DEFAULT_GRACE_SECONDS,
            type="integer",
            minimum=0,
            description="How long past its TTL a resource of a still-running cell is kept",
        ),
    },
    doc_md=__doc__,
):
    sweep_task()
