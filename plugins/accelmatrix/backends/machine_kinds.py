"""Every machine kind, once: the one place a backend's facts are stated.

An entry names the kind (the ``backend:`` of a suite's machine), the pydantic model of that
machine, the backend class, what the backend can do, and how the janitor groups its
resources. Everything else reads them from here: the suite's machine union
(``spec/suite.py``), the loader's error messages, suite validation of capabilities,
``get_backend``, the janitor, the fault matrix's coverage check.

Importing this module must stay cheap: ``spec`` imports it while a DAG file is parsed. The
machine models need only pydantic; a backend class (kubernetes, gcloud, SSH clients) is
named by its import path and imported when a task asks for it (:meth:`BackendKind.load`).
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from accelmatrix.backends.machines.gke_tpu import GkeTpuMachine
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine
from accelmatrix.backends.machines.local import LocalMachine
from accelmatrix.backends.machines.ssh import SshMachine
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.errors import BackendError

if TYPE_CHECKING:  # the class is imported by path, when a task needs it
    from accelmatrix.backends.base import Backend

# What a backend can do, by the name a suite error shows.
CAPABILITIES = ("defers_provisioning", "replaces_machine_on_retry", "runs_services")


@dataclass(frozen=True)
class BackendKind:
    machine: type[BaseModel]  # its `backend: Literal[...]` is the kind's name
    backend_path: str  # "module:Class"
    janitor_key: Callable[[dict[str, Any]], str]
    # begin/check/finish_provision: the wait for a machine happens in the triggerer.
    defers_provisioning: bool = False
    # resource_problem/refresh: a retried run on a machine that is gone gets a new one.
    replaces_machine_on_retry: bool = False
    # start_services: workload.services (background processes from setup to teardown).
    runs_services: bool = False
    name: str = field(init=False)

    def __post_init__(self) -> None:
        (name,) = typing.get_args(self.machine.model_fields["backend"].annotation)
        object.__setattr__(self, "name", name)

    def load(self) -> type[Backend]:
        """The backend class (imports its module: cloud clients are heavy)."""
        module, _, cls = self.backend_path.partition(":")
        return getattr(importlib.import_module(module), cls)


def _k8s_key(spec: dict[str, Any]) -> str:
    return f"{spec.get('backend')}:{spec.get('kubernetes_conn_id')}:{spec.get('namespace')}"


# The janitor lists resources once per key: specs with one key see the same resources
# (a host and work root, a project and zone, a cluster connection and namespace).
KINDS: dict[str, BackendKind] = {
    k.name: k
    for k in (
        BackendKind(
            LocalMachine,
            "accelmatrix.backends.local.backend:LocalBackend",
            janitor_key=lambda spec: "local",
            runs_services=True,
        ),
        BackendKind(
            SshMachine,
            "accelmatrix.backends.ssh.backend:SshBackend",
            janitor_key=lambda spec: f"ssh:{spec.get('ssh_conn_id')}:{spec.get('work_root')}",
        ),
        BackendKind(
            TpuVmMachine,
            "accelmatrix.backends.tpu_vm.backend:TpuVmBackend",
            janitor_key=lambda spec: (
                f"tpu-vm:{spec.get('gcp_conn_id')}:{spec.get('project')}:{spec.get('zone')}"
            ),
            defers_provisioning=True,
            replaces_machine_on_retry=True,
        ),
        BackendKind(
            KubernetesJobMachine,
            "accelmatrix.backends.kubernetes.job:KubernetesJobBackend",
            janitor_key=_k8s_key,
        ),
        BackendKind(
            KubernetesJobSetMachine,
            "accelmatrix.backends.kubernetes.jobset:KubernetesJobSetBackend",
            janitor_key=_k8s_key,
        ),
        BackendKind(
            GkeTpuMachine,
            "accelmatrix.backends.kubernetes.gke_tpu:GkeTpuBackend",
            janitor_key=_k8s_key,
        ),
    )
}

MACHINE_MODELS = tuple(k.machine for k in KINDS.values())


class UnknownBackend(KeyError):
    """A ``backend:`` that no entry names."""


def kind_of(name: str | None) -> BackendKind:
    if name not in KINDS:
        raise UnknownBackend(f"unknown backend {name!r} (allowed: {', '.join(KINDS)})")
    return KINDS[name]


def kinds_that(capability: str) -> list[str]:
    """The backends with ``capability`` (one of CAPABILITIES), in registry order."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r} (known: {', '.join(CAPABILITIES)})")
    return [k.name for k in KINDS.values() if getattr(k, capability)]


def machine_of(spec: dict[str, Any]) -> BaseModel:
    """A machine's JSON form (the janitor's list, a bare trigger's kwargs) as its kind's
    model, validated once here."""
    try:
        kind = kind_of(spec.get("backend"))
    except UnknownBackend as e:
        raise BackendError(e.args[0]) from None
    return kind.machine.model_validate(spec)


def get_backend(machine: BaseModel | dict[str, Any]) -> Backend:
    """The backend for a machine (its class imported now, by the path named above).

    A cell passes its validated model (``CellSpec.machine_spec``); a machine's JSON form
    (the janitor's list of machines, a bare trigger's kwargs, the CLI) is validated here,
    once: a backend itself only ever gets the model.
    """
    if isinstance(machine, dict):
        machine = machine_of(machine)
    try:
        kind = kind_of(getattr(machine, "backend", None))
    except UnknownBackend as e:
        raise BackendError(e.args[0]) from None
    return kind.load()(machine)
