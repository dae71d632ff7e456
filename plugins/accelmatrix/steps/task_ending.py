"""How a trigger ends its task, and keeping Great Expectations warm in the triggerer.

Ending in the triggerer. Airflow 3.3 lets a trigger finish its task without resuming it
on a worker: it yields ``TaskSuccessEvent(xcoms=...)`` or ``TaskFailedEvent``
(``airflow.triggers.base``); ``airflow/models/trigger.py`` sets the task instance's state,
pushes the XComs, and routes a failed end to ``up_for_retry`` when the task has tries left
(``is_eligible_to_retry``). For a matrix run that is the difference between one and two
task starts per waiting step, and a task that never resumes cannot be failed by Airflow
3.3.2's defer/resume race (the scheduler fails a resumed try whose deferral exit it learns
about late; a task the trigger ended is no longer queued, so nothing is failed).

Retry policy, one rule for every step: an infrastructure failure (the machine failed, was
preempted, never became ready) is retried when the task has retries; a test failure (the
workload exited wrongly, timed out or hung; a check failed) never is. A failed end from the
trigger would be retried by Airflow whenever the task has retries, so a *test* failure of a
task with retries is handed back to the worker instead (a plain ``TriggerEvent``), whose
``execute_complete`` raises ``AirflowFailException`` (no retry). Only failing cells pay that
task start; a passing cell never goes back to a worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from airflow.triggers.base import TaskFailedEvent, TaskSuccessEvent, TriggerEvent

from accelmatrix.cleanup.stopped import STOPPED
from accelmatrix.evaluation.evaluate_cell import warm_up

log = logging.getLogger(__name__)

# Cell states that are the machine's fault, not the code under test's.
# How long after deferring a trigger waits before it resumes its task (settle_before_resume).
RESUME_SETTLE_SECONDS = 10.0


async def settle_before_resume(deferred_at: float | None) -> None:
    """Resume a task no sooner than RESUME_SETTLE_SECONDS after it deferred.

    Airflow 3.3.2 fails a resumed try when the scheduler learns of the deferring worker's
    exit only after the resume was queued (the defer/resume race). A workload that failed,
    or a machine ready within seconds (a replacement TPU in the emulator), would otherwise
    resume its task before the scheduler has processed that exit; the fault matrix lost its
    preempted TPU cell to it on a loaded machine. Waiting costs such a cell a few seconds
    and keeps its task at one try.
    """
    if deferred_at is None:
        return
    wait = deferred_at + RESUME_SETTLE_SECONDS - time.time()
    if wait > 0:
        await asyncio.sleep(wait)


INFRASTRUCTURE_STATES = frozenset({"infra_failed"})


def end_event(
    step: str,
    state: str,
    message: str,
    *,
    passed_state: str,
    xcom: Any = None,
    resume: TriggerEvent,
    test_failure_ends_task: bool,
    log: Any = log,
) -> TriggerEvent:
    """The event that ends ``step`` for a cell whose outcome is ``state``.

    ``passed_state``: the state that means the step succeeded (``xcom``, when given, becomes
    its return value; only provision's resource record is one, see steps/cell_operator.py). ``resume``: the event that hands a test failure back to the worker when the task
    has retries (``test_failure_ends_task`` False), see the module docstring.
    """
    if state == passed_state:
        return TaskSuccessEvent(xcoms=None if xcom is None else {"return_value": xcom})
    if state in INFRASTRUCTURE_STATES:
        log.error(
            "%s failed: %s (an infrastructure failure, not a test failure: retried when the "
            "task has retries left)",
            step,
            message,
        )
        return TaskFailedEvent()
    if state == STOPPED:
        log.warning("%s: the cell was cancelled: %s", step, message)
        return TaskFailedEvent()
    log.error("%s failed (%s, a test failure: never retried): %s", step, state, message)
    return TaskFailedEvent() if test_failure_ends_task else resume


_warm_lock = threading.Lock()
_warm_thread: threading.Thread | None = None


def warm_great_expectations() -> None:
    """Start importing Great Expectations in this process, in the background, once.

    Called by the triggers that come before a cell's evaluation (provision, run): the import
    costs 7-18 s of CPU on two cores, and without this the first cells of a run would wait
    for it in their ``evaluate`` step. The import holds the GIL for stretches, so the event
    loop streams logs a little slower meanwhile; it happens once per triggerer process.
    """
    global _warm_thread
    with _warm_lock:
        if _warm_thread is not None:
            return
        _warm_thread = threading.Thread(target=_warm, name="accelmatrix-gx-warmup", daemon=True)
        _warm_thread.start()


def _warm() -> None:
    try:
        warm_up()
    except Exception:  # evaluation imports it again and reports a real problem there
        log.exception("warming Great Expectations failed")
