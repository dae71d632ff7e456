"""The contract every machine kind implements (local process, SSH host, TPU VM, K8s Job).

Which kinds there are, what each can do, and which class implements each (``get_backend``)
is `accelmatrix.backends.machine_kinds`; this module knows none of them.

Operators and triggers only talk to this interface, so switching a cell from `local` to a
TPU VM is a change of its machine in the suite YAML, nothing else. A backend is built from
the cell's validated machine model (backends/machines) and speaks in the typed records of
``accelmatrix.contracts.machine_records``: the resource, the pending provision, the job
handle. Each becomes JSON only where it crosses a task boundary (XCom, a trigger's kwargs),
so it survives a worker dying between two tasks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from accelmatrix.contracts.machine_records import (
    JobHandle,
    MachineResource,
    ManagedDetail,
    PendingProvision,
    ServiceSpec,
    StartedService,
)
from accelmatrix.errors import BackendError, InfrastructureError

__all__ = [
    "MANAGED_BY",
    "Backend",
    "BackendError",
    "CellContext",
    "InfrastructureError",
    "JobStatus",
    "LogFn",
    "ManagedResource",
    "ProvisionCheck",
    "SetupFailed",
]
MANAGED_BY = "accelmatrix"

LogFn = Callable[[str], None]


class SetupFailed(BackendError):
    """A setup command exited non-zero or timed out."""


@dataclass
class CellContext:
    """Who is asking: enough to name and label a resource deterministically."""

    dag_id: str
    run_id: str
    cell_id: str
    artifacts_dir: Path
    ttl_seconds: int = 6 * 3600
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class JobStatus:
    done: bool
    exit_code: int | None = None
    detail: str = ""
    infrastructure_failure: bool = False
    # Waiting for capacity (a queue such as Kueue has not admitted the workload): its clock,
    # the workload timeout, has not started.
    queued: bool = False
    # For a queued workload: when its clock started (epoch s, its first pod running), if known.
    started_at: float | None = None


@dataclass
class ProvisionCheck:
    """One look at a machine being provisioned: ready, failed (infrastructure), or neither."""

    ready: bool = False
    failed: str | None = None
    detail: str = ""


@dataclass
class ManagedResource:
    """A resource as a janitor sees it."""

    backend: str
    name: str
    labels: dict[str, str]
    created_at: float | None = None
    detail: ManagedDetail = field(default_factory=ManagedDetail)


class Backend(abc.ABC):
    """One machine kind. Instances are cheap; build one per task from the cell's machine
    (its validated model: ``machine_kinds.get_backend``)."""

    kind: ClassVar[str]

    def __init__(self, machine: BaseModel):
        self.machine = machine

    @abc.abstractmethod
    def provision(self, ctx: CellContext) -> MachineResource:
        """Get-or-create the cell's machine; idempotent. Cleans up itself if it fails half way."""

    # Provisioning that waits for capacity (a queued TPU, a cloud VM booting) is split in
    # three so the wait can happen in the triggerer (steps/provision/operator.py). A backend
    # whose machines are ready at once keeps these defaults.
    def begin_provision(self, ctx: CellContext) -> MachineResource | PendingProvision:
        """Start provisioning; the resource if ready at once, else a PendingProvision for
        ``check_provision`` (it travels to the triggerer as JSON)."""
        return self.provision(ctx)

    def check_provision(self, pending: PendingProvision) -> ProvisionCheck:
        """Cheap, non-blocking look at a pending machine (called from the triggerer)."""
        raise NotImplementedError(f"{self.kind} provisions synchronously")

    def finish_provision(self, pending: PendingProvision) -> MachineResource:
        """The resource of a machine ``check_provision`` found ready. Undoes on failure."""
        raise NotImplementedError(f"{self.kind} provisions synchronously")

    def abandon_provision(self, pending: PendingProvision, reason: str) -> None:
        """Delete whatever a failed or timed-out provisioning left behind."""
        return None  # machines ready at once leave nothing pending

    def resource_problem(self, resource: MachineResource) -> str | None:
        """Why ``resource`` can no longer run a workload (preempted, deleted), or None.

        Asked before a retried run: a machine that is gone is replaced, not reused.
        """
        return None

    def refresh(self, resource: MachineResource) -> MachineResource:
        """``resource`` as it is now (a replaced machine may have new addresses)."""
        return resource

    def queue_wait_limit(self) -> float:
        """The longest a submitted workload may wait for capacity before its clock starts
        (a queue such as Kueue): the run step's deferral allows for it. 0: no queue."""
        return 0.0

    @abc.abstractmethod
    def variables(self, resource: MachineResource) -> dict[str, str]:
        """Values of the backend placeholders (${work_dir}, ${include_dir}, ${python})."""

    @abc.abstractmethod
    def setup(
        self,
        resource: MachineResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        """Run the setup commands in order; raise SetupFailed on the first failure."""

    def start_services(
        self,
        resource: MachineResource,
        services: list[ServiceSpec],
        env: dict[str, str],
        log: LogFn,
    ) -> list[StartedService]:
        """Start the workload's background services and wait until each is ready.

        Must record them with the resource so that ``teardown`` stops them even when the
        task that started them died. Raise SetupFailed if one does not become ready.
        Optional: backends without it refuse suites that declare services.
        """
        raise SetupFailed(f"the {self.kind} backend does not support workload.services")

    @abc.abstractmethod
    def submit(self, resource: MachineResource, argv: list[str], env: dict[str, str]) -> JobHandle:
        """Start the workload detached from the caller; return a job handle.

        Idempotent per resource: if the workload of this resource is still running (a retry
        of the run task after a worker died), return a handle to it instead of starting again.
        """

    @abc.abstractmethod
    def poll(self, handle: JobHandle) -> JobStatus:
        """Cheap, non-blocking status check (called from the triggerer)."""

    @abc.abstractmethod
    def read_logs(self, handle: JobHandle, offset: int) -> tuple[list[str], int]:
        """Complete log lines after byte ``offset`` and the new offset (non-blocking)."""

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Stop the workload (its whole process tree / pod). Tolerates already-gone."""

    @abc.abstractmethod
    def collect(self, resource: MachineResource, globs: list[str], dest: Path) -> list[str]:
        """Copy artifacts matching ``globs`` into ``dest``; return their relative paths."""

    @abc.abstractmethod
    def teardown(self, resource: MachineResource) -> None:
        """Release everything; idempotent, tolerates not-found."""

    def unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` says the machine's control plane could not be reached (so the
        same call may succeed later), rather than that it answered no. The teardown step
        waits out the first kind. Machines without a control plane of their own: never."""
        return False

    @abc.abstractmethod
    def list_managed(self) -> list[ManagedResource]:
        """Every resource this backend created and still holds (for the janitor)."""
