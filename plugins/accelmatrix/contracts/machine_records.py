"""The machine side's records: a cell's resource, the handle of its workload, a pending
provision, and what the janitor sees of a managed resource.

Record technology: pydantic models. They cross process boundaries as JSON (XCom, a
trigger's kwargs, the resource record written on the machine, a Kubernetes annotation), and
pydantic gives both directions from one declaration: ``to_json()`` (``model_dump(mode=
"json")``) where a record leaves a process, ``from_json()`` (``model_validate``) where it
comes back, typed attributes everywhere in between. The machine models (backends/machines)
are pydantic already, and so is the CellSpec the records travel with; dataclasses would need
hand-written nested (de)serialisation for the TPU record's workers and worker records.

The JSON shape is the one the dicts had, key for key: a run in flight (its XCom, its
deferred trigger) and a record written on a machine by an older version stay readable.
Unknown keys are ignored on the way in (``extra="ignore"``): a local record on disk also
holds the groups its setup and services started, which only the local backend reads.

Per-kind fields differ, so each kind has its own record on a common base, and
``MachineResource`` / ``JobHandle`` are unions discriminated by ``backend``, the kind's name:
``resource_from_json`` gives the right one back. The Kubernetes kinds (``k8s-job``,
``k8s-jobset``, ``gke-tpu``) share one record: a JobSet is named and labelled like a Job.
A TPU VM worker's own record is an SSH record whose ``backend`` is ``tpu-vm`` (the worker
belongs to the TPU cell); it lives inside the TPU record, never alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter

__all__ = [
    "K8S_KINDS",
    "CellIdentity",
    "CellRecord",
    "JobHandle",
    "K8sHandle",
    "K8sResource",
    "LocalHandle",
    "LocalResource",
    "MachineResource",
    "ManagedDetail",
    "PendingProvision",
    "Record",
    "ResourceBase",
    "ServiceReadiness",
    "ServiceSpec",
    "SshHandle",
    "SshResource",
    "SshTarget",
    "StartedService",
    "TpuVmHandle",
    "TpuVmResource",
    "TpuWorker",
    "handle_from_json",
    "resource_from_json",
]

# The Kubernetes machine kinds (one resource and handle record for all three).
K8S_KINDS = ("k8s-job", "k8s-jobset", "gke-tpu")


class Record(BaseModel):
    """A record that crosses a process boundary as JSON (see the module docstring)."""

    model_config = ConfigDict(extra="ignore")

    def to_json(self) -> dict[str, Any]:
        """The JSON form (XCom, trigger kwargs, a record on disk)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, value: Self | dict[str, Any]) -> Self:
        """The record back from its JSON form (a record passes through)."""
        return value if isinstance(value, cls) else cls.model_validate(value)


class CellIdentity(Record):
    """The exact (dag, run, cell) a resource was made for."""

    dag_id: str
    run_id: str
    cell_id: str


class CellRecord(Record):
    """The cell context a pending provision or a TPU resource carries across tasks."""

    dag_id: str
    run_id: str
    cell_id: str
    artifacts_dir: str
    ttl_seconds: int


class SshTarget(Record):
    """How to reach a worker accelmatrix provisioned itself (``hooks.ssh.DirectTarget``)."""

    host: str
    port: int
    user: str
    key_path: str
    host_key: str = ""


# -- resources ---------------------------------------------------------------------------------
class ResourceBase(Record):
    """What every kind's resource says: its kind, name, labels and age, and where the cell's
    artifacts go on the Airflow side."""

    backend: str
    name: str
    labels: dict[str, str] = {}
    created_at: float | None = None
    artifacts_dir: str = ""


class LocalResource(ResourceBase):
    """A work dir on the Airflow worker host."""

    backend: Literal["local"] = "local"
    work_dir: str


class SshResource(ResourceBase):
    """A work dir on a host reached over SSH: an Airflow connection's host, or (``backend``
    ``tpu-vm``, ``ssh_target`` set) a TPU VM worker."""

    backend: str = "ssh"
    ssh_conn_id: str | None = None
    ssh_target: SshTarget | None = None
    host: str | None = None
    work_dir: str
    internal_dir: str
    log_dir: str
    include_dir: str


class TpuWorker(Record):
    """One worker of a TPU slice, by its addresses."""

    index: int
    internal_ip: str | None = None
    external_ip: str | None = None
    host: str | None = None


class TpuVmResource(ResourceBase):
    """A TPU node (or multi-host slice). The janitor's teardown record holds only ``name``,
    ``zone`` and ``queued_resource``; a provisioned one holds the rest."""

    backend: Literal["tpu-vm"] = "tpu-vm"
    zone: str | None = None
    queued_resource: str | None = None
    node_name: str = ""
    project: str | None = None
    accelerator_type: str | None = None
    runtime_version: str | None = None
    capacity: str | None = None
    state: str | None = None
    workers: list[TpuWorker] = []
    hosts: list[str | None] = []
    ctx: CellRecord | None = None
    worker_resources: list[SshResource] = []


class K8sResource(ResourceBase):
    """A cell's Job (or JobSet) in a namespace: named at provision, created by submit."""

    backend: Literal["k8s-job", "k8s-jobset", "gke-tpu"] = "k8s-job"
    kubernetes_conn_id: str | None = None
    namespace: str
    job_name: str
    setup_job_name: str | None = None
    work_subpath: str | None = None
    local_work_dir: str | None = None
    active_deadline_seconds: int | None = None
    annotations: dict[str, str] = {}


def _kind(value: Any) -> str | None:
    """The union member for a record or its JSON form: its kind, the Kubernetes kinds as one."""
    backend = value.get("backend") if isinstance(value, dict) else getattr(value, "backend", None)
    return "k8s" if backend in K8S_KINDS else backend


MachineResource = Annotated[
    Annotated[LocalResource, Tag("local")]
    | Annotated[SshResource, Tag("ssh")]
    | Annotated[TpuVmResource, Tag("tpu-vm")]
    | Annotated[K8sResource, Tag("k8s")],
    Discriminator(_kind),
]


class PendingProvision(Record):
    """A machine requested and not ready yet (a TPU waiting for capacity): what the
    triggerer checks and the provision step finishes."""

    pending: Literal[True] = True
    backend: str
    name: str
    zone: str
    queued: bool = False
    labels: dict[str, str] = {}
    started_at: float
    deadline: float
    ctx: CellRecord
    # Set by the provision step when the new machine must also be set up there.
    reprovision_setup: bool = False


# -- job handles -------------------------------------------------------------------------------
class HandleBase(Record):
    """A started workload: its kind and whether submit found it running already."""

    backend: str
    reattached: bool = False


class LocalHandle(HandleBase):
    backend: Literal["local"] = "local"
    work_dir: str
    log_path: str
    status_path: str
    pid: int
    pgid: int


class SshHandle(HandleBase):
    backend: str = "ssh"
    ssh_conn_id: str | None = None
    ssh_target: SshTarget | None = None
    host: str | None = None
    work_dir: str
    log_dir: str
    log_path: str
    status_path: str
    artifacts_dir: str = ""
    pid: int
    pgid: int


class TpuVmHandle(HandleBase):
    backend: Literal["tpu-vm"] = "tpu-vm"
    name: str
    zone: str
    workers: list[SshHandle]
    node_check_seconds: float = 60.0


class K8sHandle(HandleBase):
    backend: Literal["k8s-job", "k8s-jobset", "gke-tpu"] = "k8s-job"
    kubernetes_conn_id: str | None = None
    namespace: str
    job_name: str
    uid: str | None = None
    artifacts_dir: str
    scheduling_timeout: float
    # JobSets: their pods' ContainerCreating limit, the Kueue admission and the node count.
    creating_timeout: float | None = None
    admission_timeout: float | None = None
    queue: str | None = None
    nodes: int | None = None


JobHandle = Annotated[
    Annotated[LocalHandle, Tag("local")]
    | Annotated[SshHandle, Tag("ssh")]
    | Annotated[TpuVmHandle, Tag("tpu-vm")]
    | Annotated[K8sHandle, Tag("k8s")],
    Discriminator(_kind),
]

_RESOURCE: TypeAdapter[MachineResource] = TypeAdapter(MachineResource)
_HANDLE: TypeAdapter[JobHandle] = TypeAdapter(JobHandle)


def resource_from_json(value: MachineResource | dict[str, Any]) -> MachineResource:
    """A resource back from its JSON form, as its kind's record (a record passes through)."""
    return value if isinstance(value, ResourceBase) else _RESOURCE.validate_python(value)


def handle_from_json(value: JobHandle | dict[str, Any]) -> JobHandle:
    """A job handle back from its JSON form, as its kind's record (a record passes through)."""
    return value if isinstance(value, HandleBase) else _HANDLE.validate_python(value)


# -- workload services ------------------------------------------------------------------------
class ServiceReadiness(Record):
    port_file: str
    http_path: str = "/health"
    timeout: int = 60


class ServiceSpec(Record):
    """A workload service as setup starts it: the suite's ``Service`` with its placeholders
    filled in (spec/services.py validates the YAML)."""

    name: str
    run: list[str]
    ready: ServiceReadiness


class StartedService(Record):
    """A service started on the machine (recorded with it, so teardown stops it)."""

    name: str
    pid: int
    pgid: int
    log_path: str
    started_at: float
    port: int | None = None


# -- the janitor's view ------------------------------------------------------------------------
class ManagedDetail(Record):
    """What a backend's listing says of a managed resource beyond its name and labels: the
    exact owner, the record teardown takes, and what the janitor reports."""

    identity: CellIdentity | None = None
    resource: MachineResource | None = None
    # A group resource (a JobSet): every object it holds, for the janitor's report.
    children: list[str] = []
    # Where it is and how it stands (each kind says what it knows).
    work_dir: str | None = None
    ssh_conn_id: str | None = None
    kind: str | None = None  # a TPU: "node" or "queued-resource"
    zone: str | None = None
    state: str | None = None
    node_name: str | None = None
    namespace: str | None = None
    annotations: dict[str, str] = {}
    jobs: list[str] = []
    jobset: str | None = None
    jobset_uid: str | None = None
    pods: list[str] = []
    services: list[str] = []
    active: int = 0
    succeeded: int = 0
    failed: int = 0
