"""What a trigger hands back to its step's operator: the provision, workload and evaluation
events.

Pydantic records, like the machine records (contracts/machine_records.py, which says why):
a trigger builds one, fires it as ``TriggerEvent(event.to_json())`` (Airflow 3.3 serialises
the payload), and the resumed operator reads it back with ``from_json`` before looking at
anything in it. The JSON is the shape the dict payloads had, so a trigger fired by an older
version is still understood.
"""

from __future__ import annotations

from typing import Literal

from accelmatrix.contracts.check_verdicts import CheckVerdict
from accelmatrix.contracts.machine_records import JobHandle, PendingProvision, Record

__all__ = [
    "EvaluationEvent",
    "EvaluationResult",
    "ProvisionEvent",
    "RunOutcome",
    "WorkloadEvent",
]


class ProvisionEvent(Record):
    """The requested machine is ready, or never will be (the trigger cleaned it up then).

    ``pending`` echoes the request: the resumed task finishes (or abandons) it.
    """

    status: Literal["ready", "failed"]
    detail: str = ""
    waited: float = 0.0
    pending: PendingProvision | None = None


# How a watched workload ended: it exited (any code), its machine failed, it went silent,
# or its deadline passed.
RunOutcome = Literal["exited", "infra_failed", "hung", "timeout"]


class WorkloadEvent(Record):
    """How a workload ended, where its log was read up to, and the handle it ran under."""

    status: RunOutcome
    exit_code: int | None = None
    detail: str = ""
    log_offset: int = 0
    handle: JobHandle | None = None
    # The cell state and message the trigger recorded before it fired (and released the
    # machine for); None: nothing recorded, so the task that resumes records it. One
    # outcome is recorded once.
    state: str | None = None
    message: str = ""


class EvaluationResult(Record):
    """A cell's checks, evaluated (steps.evaluate.work.run_checks): the verdict, its table
    for the log, and the check verdicts the results store takes as they are."""

    passed: bool
    table: str
    seconds: float
    data_docs: str | None = None
    verdicts: list[CheckVerdict] = []
    warnings: list[str] = []


class EvaluationEvent(Record):
    """The evaluation ran (``done``, its result; ``logged``: the trigger logged the table)
    or could not run (``error``). ``recorded``: the trigger recorded the verdicts, so the
    task that resumes only ends as they say (``failure``: why the cell failed, if it did);
    one outcome is recorded once."""

    status: Literal["done", "error"]
    result: EvaluationResult | None = None
    logged: bool = False
    error: str = ""
    recorded: bool = False
    failure: str | None = None
