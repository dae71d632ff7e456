"""The gate's messages after the verdict: the suite's webhook and a pull request's status
and comment. Never able to change the verdict: a problem here is logged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from accelmatrix.cell_state import RunState
from accelmatrix.notifications import transport as notify
from accelmatrix.notifications.pull_request import report_run
from accelmatrix.results import results_store
from accelmatrix.spec.loader import load_suite

if TYPE_CHECKING:
    from accelmatrix.contracts.run_records import CellRecord
    from accelmatrix.spec.cell import CellSpec
    from accelmatrix.steps.common import RunRef

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step


def report_pull_request(suite_path: str, ref: RunRef) -> None:
    """A run started for a pull request: its status and comment on GitHub
    (``notifications.pull_request``); never changes the verdict."""

    try:
        gh = load_suite(suite_path).github
        if gh is None:
            return
        report_run(
            results_store(),
            ref.dag_id,
            ref.run_id,
            context=gh.context or f"accelmatrix/{ref.dag_id}",
            conn_id=gh.conn_id,
        )
    except Exception:  # noqa: BLE001 - the verdict stands whatever GitHub does
        log.exception("pull request of %s %s not reported", ref.dag_id, ref.run_id)


def notify_webhook(
    suite_path: str,
    planned: list[CellSpec],
    ref: RunRef,
    failed: list[tuple[str, str]],
    rows: dict[str, CellRecord],
    cost: float | None,
) -> None:
    """Send the suite's webhook; a notification problem is logged, never flips the verdict."""

    spec = load_suite(suite_path).notify
    hook = spec.webhook if spec else None
    if hook is None or (hook.when == "failure" and not failed):
        return
    by_id = {c.id: c for c in planned}
    checks = results_store().get_checks(ref.dag_id, ref.run_id)
    failed_cells = []
    for cid, state in failed:
        failed_cells.append(
            {
                "cell": cid,
                "state": state,
                "message": rows[cid].message if cid in rows else "",
                "failed_checks": [
                    c.check_name for c in checks if c.cell_id == cid and not c.passed
                ],
                "failed_tests": notify.failed_tests(
                    [c.glob for c in by_id[cid].checks if c.type == "junit"],
                    ref.artifacts(cid) / "files",
                ),
            }
        )
    run = results_store().get_run(ref.dag_id, ref.run_id)
    payload = notify.build_payload(
        dag_id=ref.dag_id,
        run_id=ref.run_id,
        state=RunState.FAILED if failed else RunState.PASSED,
        failed_cells=failed_cells,
        git_ref=run.git_ref if run else None,
        cost=cost,
    )
    try:
        notify.send_webhook(hook, payload)
    except Exception as e:  # noqa: BLE001 - the run's verdict stands whatever the webhook does
        log.error("webhook %s not notified: %s", hook.conn_id, e)
