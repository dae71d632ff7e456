"""The ``k8s-jobset`` machine: a multi-node training job as one JobSet (jobset.x-k8s.io).

    machines:
      h100x8:
        backend: k8s-jobset
        kubernetes_conn_id: training_cluster
        image: us-docker.pkg.dev/acme/ml/fsdp:2026.11
        gpus: 8
        accelerator: nvidia-h100-80gb
        num_nodes: 4                 # pods, one per node, all running the workload
        max_restarts: 2              # infrastructure failures restart the whole JobSet
        kueue: {queue_name: ml-team, priority_class: ml-batch, admission_timeout_seconds: 3600}

Why a machine kind of its own and not ``num_nodes`` on ``k8s-job``: an Indexed Job gives
pods an index but no stable address to rendezvous at, no restart of the whole group when
one node fails, and no unit Kueue admits all-or-nothing. A JobSet gives all three, but needs
the JobSet controller on the cluster; clusters without it keep using ``k8s-job``.

Every field of ``k8s-job`` applies to each pod; the fields below are the group's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from accelmatrix.backends.machines.k8s_job import DNS_LABEL, KubernetesJobMachine

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
HOSTNAME_MAX = 63  # a pod hostname <jobset>-<replicated job>-<job index>-<pod index> is a label


class KueueQueue(BaseModel):
    """Submit through Kueue: the LocalQueue that admits the JobSet and its priority class.

    A JobSet Kueue has not admitted yet is suspended: that is a wait for capacity, bounded by
    ``admission_timeout_seconds`` (then an infrastructure failure, and the JobSet is deleted).
    """

    model_config = ConfigDict(extra="forbid")

    queue_name: str = Field(pattern=DNS_LABEL, max_length=63, description="a LocalQueue")
    priority_class: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, max_length=253, description="a WorkloadPriorityClass"
    )
    admission_timeout_seconds: PositiveInt = Field(
        1800, description="how long the JobSet may wait for Kueue's admission"
    )


class KubernetesJobSetMachine(KubernetesJobMachine):
    """One JobSet per cell: ``num_nodes`` pods behind a headless Service, one leader."""

    backend: Literal["k8s-jobset"]  # type: ignore[assignment]
    num_nodes: PositiveInt = Field(
        2, le=1024, description="pods of the replicated job (one per node); pod 0 leads"
    )
    rendezvous_port: int = Field(
        29500, ge=1024, le=65535, description="MASTER_PORT of torchrun / torch.distributed"
    )
    jax_coordinator_port: int = Field(
        1234, ge=1024, le=65535, description="port of JAX_COORDINATOR_ADDRESS on the leader"
    )
    max_restarts: int = Field(
        2,
        ge=0,
        le=20,
        description="restarts of the whole JobSet after an infrastructure failure (a pod "
        "evicted or preempted); a non-zero exit of the workload fails it at once",
    )
    restart_on_exit_codes: list[int] = Field(
        default_factory=list,
        description="workload exit codes that restart the group like a disruption (counted "
        "against max_restarts) instead of failing it at once, e.g. [42] for a job that asks "
        "to be restarted",
    )
    kueue: KueueQueue | None = None

    @field_validator("restart_on_exit_codes")
    @classmethod
    def _codes(cls, v: list[int]) -> list[int]:
        bad = [c for c in v if not 1 <= c <= 255]
        if bad:
            raise ValueError(f"exit codes {bad} out of range: allowed 1..255")
        return sorted(set(v))

    @property
    def replicated_job(self) -> str:
        return "workers"

    @property
    def replicas(self) -> int:
        """Jobs of the replicated job (TPU slices on GKE; one group of nodes otherwise)."""
        return 1

    def name_budget(self) -> int:
        """The longest JobSet name whose every derived pod hostname is a DNS label."""
        suffix = len(self.replicated_job) + len(str(self.replicas - 1))
        suffix += len(str(self.num_nodes - 1)) + 3  # three '-'
        return HOSTNAME_MAX - suffix

    @model_validator(mode="after")
    def _fits(self) -> KubernetesJobSetMachine:
        if self.rendezvous_port == self.jax_coordinator_port:
            raise ValueError(
                f"rendezvous_port and jax_coordinator_port are both {self.rendezvous_port}: "
                "a job using both would fail to bind the second"
            )
        if self.name_budget() < 20:  # the prefix, a readable part and the identity hash
            raise ValueError(
                f"num_nodes {self.num_nodes} leaves too few characters for the JobSet name "
                f"in a {HOSTNAME_MAX}-character pod hostname"
            )
        return self
