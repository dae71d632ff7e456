"""ProvisionTrigger: wait in the triggerer until a requested machine is ready (or never is).

Each poll is one cheap backend call (for a TPU: one ``describe``), run in a thread. On a
failure (stockout, valid-until passed, node preempted while booting, timeout) the trigger
deletes what was requested *before* it fires: the resumed task may never run (Airflow 3.3.2
resume race, apache/airflow#67287) and a failed provision gets no teardown. The resumed
task repeats the cleanup; deleting what is already gone is a no-op. For the same reason
the trigger records the failure in the results store itself (``owner``: the cell's dag,
run and cell id): a resumed task that never runs must not leave the cell "provisioning".

With ``end_task`` (the provision step's usual case) the trigger also finishes a ready
machine (``finish_provision``) and ends the task with the resource as its XCom; a
failure ends it failed, retried when the task has retries (an infrastructure failure). See
accelmatrix.steps.task_ending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent

from accelmatrix.backends.base import ProvisionCheck
from accelmatrix.backends.machine_kinds import get_backend, machine_of
from accelmatrix.contracts.machine_records import PendingProvision
from accelmatrix.contracts.step_events import ProvisionEvent
from accelmatrix.spec.cell import CellSpec
from accelmatrix.steps.common import RunRef
from accelmatrix.steps.provision.work import finish_provision, record_provision_failure
from accelmatrix.steps.task_ending import settle_before_resume, warm_great_expectations


class ProvisionTrigger(BaseTrigger):
    """Wait for ``pending`` (a requested machine) to be ready.

    A cell's trigger (``for_cell``) carries the cell once, and its machine comes from it;
    without a cell it waits on a machine described by ``machine_spec`` alone (its JSON form).
    ``cell`` and ``pending`` come as their JSON forms after the triggerer deserialised the
    trigger.
    """

    def __init__(
        self,
        machine_spec: dict[str, Any] | None,
        pending: PendingProvision | dict[str, Any],
        poll_interval=15.0,
        owner: dict[str, str] | None = None,
        cell: CellSpec | dict[str, Any] | None = None,
        end_task: bool = False,
        deferred_at: float | None = None,
    ):
        super().__init__()
        self.cell = CellSpec.from_json(cell) if cell is not None else None
        if self.cell is not None:  # an older serialised trigger passes both: the cell wins
            self.machine = self.cell.machine_spec
        elif machine_spec is not None:
            self.machine = machine_of(machine_spec)
        else:
            raise TypeError("ProvisionTrigger needs a cell or a machine_spec")
        self.pending = PendingProvision.from_json(pending)
        self.poll_interval = float(poll_interval)
        self.owner = owner
        self.end_task = end_task
        self.deferred_at = deferred_at

    @classmethod
    def for_cell(
        cls, cell: CellSpec, pending: PendingProvision, ref: Any = None, end_task: bool = False
    ) -> tuple[ProvisionTrigger, float]:
        """The trigger waiting for ``cell``'s pending machine, and the seconds until its own
        deadline (Airflow's deferral timeout adds a grace to that, as a backstop)."""
        owner = {"dag_id": ref.dag_id, "run_id": ref.run_id, "cell_id": cell.id} if ref else None
        poll = float(getattr(cell.machine_spec, "provision_poll_seconds", None) or 15)
        trigger = cls(
            None,
            pending,
            poll,
            owner,
            cell=cell,
            end_task=end_task and ref is not None,
            deferred_at=time.time(),
        )
        return trigger, max(0.0, pending.deadline - time.time())

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                # A cell's trigger carries the cell once; its machine is in it.
                "machine_spec": None
                if self.cell is not None
                else self.machine.model_dump(mode="json"),
                "pending": self.pending.to_json(),
                "poll_interval": self.poll_interval,
                "owner": self.owner,
                "cell": self.cell.to_json() if self.cell is not None else None,
                "end_task": self.end_task,
                "deferred_at": self.deferred_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_great_expectations()  # the cell's evaluation comes later in this process
        backend = get_backend(self.machine)
        name = self.pending.name
        started = time.monotonic()
        last_detail = None
        while True:
            try:
                check = await asyncio.to_thread(backend.check_provision, self.pending)
            except Exception as e:  # a failing API call is worth another look, not a verdict
                self.log.warning("could not check %s (will retry): %s", name, e)
                check = None
                if time.time() > self.pending.deadline:
                    check = ProvisionCheck(failed=f"{name}: no answer by its deadline: {e}")
            if check is not None:
                if check.detail != last_detail:
                    self.log.info("%s: %s", name, check.detail or "waiting")
                    last_detail = check.detail
                if check.failed:
                    self.log.error("%s: %s; deleting what was requested", name, check.failed)
                    try:
                        await asyncio.to_thread(
                            backend.abandon_provision, self.pending, check.failed
                        )
                    except Exception:
                        self.log.exception("could not clean up %s", name)
                    await self._record_failure(check.failed)
                    if self.end_task:
                        yield TaskFailedEvent()  # cleaned up and recorded above
                    else:
                        await settle_before_resume(self.deferred_at)
                        failed = ProvisionEvent(
                            status="failed", detail=check.failed, pending=self.pending
                        )
                        yield TriggerEvent(failed.to_json())
                    return
                if check.ready:
                    waited = time.monotonic() - started
                    self.log.info("%s is ready after %.0f s", name, waited)
                    if self.end_task:
                        yield await self._finish()
                    else:
                        await settle_before_resume(self.deferred_at)
                        ready = ProvisionEvent(status="ready", waited=waited, pending=self.pending)
                        yield TriggerEvent(ready.to_json())
                    return
            await asyncio.sleep(self.poll_interval)

    async def _finish(self) -> TriggerEvent:
        """Finish the ready machine and end the provision task with its resource record."""
        assert self.cell is not None and self.owner is not None  # end_task needs both
        ref = RunRef(dag_id=self.owner["dag_id"], run_id=self.owner["run_id"])
        try:
            resource = await asyncio.to_thread(finish_provision, self.cell, ref, self.pending)
        except Exception:  # recorded as a provision failure by finish_provision
            self.log.exception("could not finish provisioning %s", self.pending.name)
            return TaskFailedEvent()
        return TaskSuccessEvent(xcoms={"return_value": resource.to_json()})

    async def _record_failure(self, reason: str) -> None:
        if not self.owner:
            return
        try:
            await asyncio.to_thread(record_provision_failure, **self.owner, reason=reason)
        except Exception:  # the resumed task records it too
            self.log.exception("could not record the provision failure")
