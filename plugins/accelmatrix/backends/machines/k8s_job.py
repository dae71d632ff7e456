"""The ``k8s-job`` machine of a suite YAML: a batch/v1 Job on any Kubernetes cluster (GKE...).

    machines:
      l4:
        backend: k8s-job
        kubernetes_conn_id: gke_gpu          # Airflow connection (kubeconfig / in-cluster)
        namespace: ml-tests                  # default: the connection's, else `default`
        service_account: accelmatrix-runner
        image: us-docker.pkg.dev/acme/ml/trainer:2025.06
        gpus: 1                              # nvidia.com/gpu; or mig_profile: 1g.10gb
        accelerator: nvidia-l4               # cloud.google.com/gke-accelerator node selector
        cpu: 4
        memory: 16Gi
        artifacts_volume: {claim_name: accelmatrix-work, local_path: /mnt/accelmatrix-work}

The YAML names a connection id and nothing secret: the cluster endpoint, its CA and the
credentials live in the Airflow connection (``kube_config``, ``kube_config_path`` or
``in_cluster`` in its extra), where they are encrypted and rotated without a change to a
suite file that sits in git.

``resources`` reuses ``accelmatrix.backends.machines.resources.Resources`` (cost reports,
scheduling views); the pod's own requests come from ``gpus`` / ``mig_profile`` / ``cpu`` /
``memory`` here, and ``resources`` is filled from them when left out.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from accelmatrix.backends.machines.resources import refuse_credentials, to_resources

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"
# Keys that carry a cluster endpoint or a credential: they belong in the Airflow connection.
_CREDENTIAL_KEYS = (
    "host",
    "server",
    "api_server",
    "token",
    "bearer_token",
    "password",
    "kube_config",
    "kubeconfig",
    "kube_config_path",
    "client_certificate",
    "client_key",
    "certificate_authority",
    "cluster_context",
    "in_cluster",
)
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class Toleration(BaseModel):
    """A pod toleration, as in the Kubernetes API (camelCase keys accepted as written)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class ArtifactsVolume(BaseModel):
    """A ReadWriteMany PersistentVolumeClaim holding the cells' work dirs.

    Mounted in the pod at ``work_dir`` (sub path ``<dag>/<run>/<cell>``), and seen by the
    Airflow workers at ``local_path`` (the same volume: Filestore, NFS, a CSI bucket mount),
    which is where ``collect`` copies the artifact globs from.
    """

    model_config = ConfigDict(extra="forbid")

    claim_name: str = Field(pattern=DNS_LABEL, max_length=253)
    local_path: str = Field(description="where the Airflow workers mount the same volume")

    @field_validator("local_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") == "":
            raise ValueError(f"local_path {v!r} must be an absolute path other than /")
        return v


class KubernetesJobMachine(BaseModel):
    """One batch/v1 Job per cell (an Indexed Job when ``num_nodes`` > 1)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["k8s-job"]
    kubernetes_conn_id: str = Field(
        "kubernetes_default",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        max_length=250,
        description="Airflow connection (conn_type kubernetes) holding the cluster access",
    )
    namespace: str | None = Field(
        None, pattern=DNS_LABEL, max_length=63, description="default: the connection's"
    )
    service_account: str | None = Field(None, pattern=DNS_LABEL, max_length=253)
    image: str = Field(min_length=1, max_length=1024, description="container image of the cell")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    gpus: PositiveInt | None = Field(None, description="nvidia.com/gpu per pod")
    mig_profile: str | None = Field(
        None,
        pattern=r"^[0-9]+g\.[0-9]+gb$",
        description="MIG slice per pod, e.g. 1g.10gb -> nvidia.com/mig-1g.10gb",
    )
    accelerator: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="GKE node selector cloud.google.com/gke-accelerator, e.g. nvidia-l4",
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    cpu: str | None = Field(
        None, pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU request, e.g. 4 or 500m"
    )
    memory: str | None = Field(None, pattern=QUANTITY, description="memory request, e.g. 16Gi")
    num_nodes: PositiveInt = Field(
        1, le=256, description=">1: an Indexed Job, one pod per node, all run the workload"
    )
    python: str = Field("python", min_length=1, description="${python} inside the image")
    work_dir: str = Field("/workspace", description="the pod's working dir (${work_dir})")
    include_dir: str = Field(
        "/opt/accelmatrix/include", description="${include_dir}: where the image holds include/"
    )
    artifacts_volume: ArtifactsVolume | None = None
    ttl_seconds_after_finished: PositiveInt = Field(
        6 * 3600, description="backstop: Kubernetes deletes a finished Job after this"
    )
    active_deadline_seconds: PositiveInt | None = Field(
        None,
        description="backstop for a dead triggerer; default: the cell's resource TTL (6 h). "
        "The workload timeout itself is enforced by the run step, which deletes the Job",
    )
    scheduling_timeout_seconds: PositiveInt = Field(
        600, description="a pod Pending (unschedulable) this long is an infrastructure failure"
    )
    container_creating_timeout_seconds: PositiveInt = Field(
        600,
        description="a scheduled pod whose container stays in ContainerCreating this long (a "
        "volume that does not attach, a missing secret) is an infrastructure failure",
    )
    resources: Any = Field(
        default=None,
        description="Resources for cost/scheduling views; default: derived from gpus/cpu/memory",
    )
    pool: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Airflow pool bounding concurrent use; default accelmatrix_<machine>",
    )
    pool_slots: PositiveInt = Field(4, description="slots of the pool when accelmatrix creates it")
    hourly_cost: Annotated[float, Field(ge=0)] = 0.0
    price_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", description="entry of include/pricing.yaml"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        backend = data.get("backend", "k8s-job") if isinstance(data, dict) else "k8s-job"
        return refuse_credentials(
            data,
            _CREDENTIAL_KEYS,
            f"a {backend} machine takes no cluster endpoint or credentials; put them in the "
            "Airflow connection named by kubernetes_conn_id (extra: kube_config, "
            "kube_config_path or in_cluster)",
        )

    @field_validator("resources", mode="before")
    @classmethod
    def _validate_resources(cls, v: Any) -> Any:
        return None if v is None else to_resources(v)

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _number_to_quantity(cls, v: Any) -> Any:
        # YAML reads `cpu: 4` as an int; Kubernetes quantities are strings.
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:g}"
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if any(c.isspace() for c in v) or re.search(r"[\x00-\x1f\x7f]", v):
            raise ValueError(f"image {v!r} cannot contain whitespace or control characters")
        return v

    @field_validator("work_dir", "include_dir")
    @classmethod
    def _container_path(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/") or v.rstrip("/") == "":
            raise ValueError(f"{v!r} must be an absolute path inside the container, not /")
        return v.rstrip("/")

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _LABEL_NAME.match(key) or len(key) > 316:
                raise ValueError(f"node_selector key {key!r} is not a valid label key")
            if len(value) > 63 or not re.fullmatch(
                r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value
            ):
                raise ValueError(f"node_selector value {value!r} is not a valid label value")
        return v

    @model_validator(mode="after")
    def _accelerators(self) -> KubernetesJobMachine:
        if self.gpus and self.mig_profile:
            raise ValueError(
                "set either gpus (whole GPUs, nvidia.com/gpu) or mig_profile "
                "(one MIG slice, nvidia.com/mig-<profile>), not both"
            )
        if self.accelerator and not (self.gpus or self.mig_profile):
            raise ValueError(
                f"accelerator {self.accelerator!r} selects GPU nodes: also set gpus or mig_profile"
            )
        if self.resources is None:
            derived: dict[str, Any] = {"gpu_type": self.accelerator}
            if self.gpus or self.mig_profile:
                derived["gpus"] = self.gpus or 1
            if self.cpu:
                derived["cpu"] = (
                    float(self.cpu[:-1]) / 1000 if self.cpu.endswith("m") else float(self.cpu)
                )
            if self.memory and re.fullmatch(
                r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?", self.memory
            ):
                derived["memory"] = self.memory
            self.resources = to_resources({k: v for k, v in derived.items() if v is not None})
        return self

    # -- what the pod asks for --------------------------------------------------------------
    @property
    def accelerator_resource(self) -> str | None:
        """The extended resource name of the requested accelerator, if any."""
        if self.mig_profile:
            return f"nvidia.com/mig-{self.mig_profile}"
        if self.gpus:
            return "nvidia.com/gpu"
        return None
