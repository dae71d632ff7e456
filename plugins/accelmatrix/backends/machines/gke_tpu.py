"""The ``gke-tpu`` machine: TPU slices on GKE as one JobSet, the shape XPK gives the same request.

    machines:
      v5e-16x2:
        backend: gke-tpu
        kubernetes_conn_id: tpu_cluster
        image: us-docker.pkg.dev/acme/ml/maxtext:2026.11
        accelerator_type: v5litepod-16     # XPK's name: <family>-<TensorCores>
        topology: 4x4                      # chips per slice = 16 -> 4 VMs of 4 chips
        num_slices: 2                      # multi-slice over DCN
        kueue: {queue_name: multislice-queue}

What it derives, as XPK does (``xpk workload create --tpu-type v5litepod-16 --num-slices 2``):
one replicated job ``slice-job`` with ``num_slices`` replicas of ``vms_per_slice`` Indexed
pods, node selectors ``cloud.google.com/gke-tpu-accelerator`` / ``gke-tpu-topology``,
``google.com/tpu`` = chips per VM on every pod, one node pool per slice (the JobSet's
exclusive-topology annotation) and the multi-slice environment (``MEGASCALE_*``). Why not
call ``xpk``: see docs/backends-kubernetes.md.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine

# family -> (GKE accelerator label value, TensorCores per chip), from XPK's system table.
TPU_FAMILIES: dict[str, tuple[str, int]] = {
    "v4": ("tpu-v4-podslice", 2),
    "v5p": ("tpu-v5p-slice", 2),
    "v5litepod": ("tpu-v5-lite-podslice", 1),
    "v6e": ("tpu-v6e-slice", 1),
}
_TYPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<cores>[0-9]+)$")
_TOPOLOGY = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


class GkeTpuMachine(KubernetesJobSetMachine):
    """TPU slices on GKE; ``num_nodes`` is derived (VMs per slice), not written."""

    backend: Literal["gke-tpu"]  # type: ignore[assignment]
    accelerator_type: str = Field(
        description="XPK's TPU type <family>-<TensorCores>, e.g. v5litepod-16, v6e-8, v5p-32"
    )
    topology: str = Field(description="chips per slice as AxB or AxBxC, e.g. 4x4, 2x2x2")
    num_slices: PositiveInt = Field(1, le=64, description="slices (multi-slice over DCN)")
    restart_on_exit_codes: list[int] = Field(
        default_factory=lambda: [42, *range(127, 256)],
        description="as XPK: 42 and 127-255 (killed by a signal) restart the slices",
    )
    jax_coordinator_port: int = Field(
        8476, ge=1024, le=65535, description="JAX's coordinator port on GKE TPU (its default)"
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_nodes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("num_nodes", "gpus", "mig_profile", "accelerator"):
                if data.get(key) not in (None, 1 if key == "num_nodes" else None):
                    if key == "num_nodes" and data.get(key) == _vms(data):
                        continue
                    raise ValueError(
                        f"{key}: a gke-tpu machine derives its pods from accelerator_type, "
                        "topology and num_slices; leave it out"
                    )
            vms = _vms(data)
            if vms is not None:
                data = {**data, "num_nodes": vms}
                if data.get("resources") is None:  # cost and scheduling views count chips
                    chips = math.prod(int(x) for x in data["topology"].split("x"))
                    slices = data.get("num_slices", 1)
                    if isinstance(slices, int) and slices > 0:
                        data["resources"] = {"chips": chips * slices}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GkeTpuMachine:
        m = _TYPE.match(self.accelerator_type)
        if not m or m.group("family") not in TPU_FAMILIES:
            raise ValueError(
                f"accelerator_type {self.accelerator_type!r}: expected <family>-<TensorCores> "
                f"with family one of {', '.join(TPU_FAMILIES)} (e.g. v5litepod-16)"
            )
        if not _TOPOLOGY.match(self.topology):
            raise ValueError(f"topology {self.topology!r}: expected AxB or AxBxC, e.g. 4x4")
        cores = self.chips * TPU_FAMILIES[m.group("family")][1]
        if cores != int(m.group("cores")):
            raise ValueError(
                f"topology {self.topology} is {self.chips} chips = {cores} TensorCores, but "
                f"accelerator_type {self.accelerator_type} has {m.group('cores')}"
            )
        return self

    @property
    def family(self) -> str:
        return self.accelerator_type.rsplit("-", 1)[0]

    @property
    def gke_accelerator(self) -> str:
        return TPU_FAMILIES[self.family][0]

    @property
    def chips(self) -> int:
        return math.prod(int(x) for x in self.topology.split("x"))

    @property
    def chips_per_vm(self) -> int:
        return 1 if self.chips == 1 else 4

    @property
    def replicated_job(self) -> str:
        return "slice-job"

    @property
    def replicas(self) -> int:
        return self.num_slices


def _vms(data: dict[str, Any]) -> int | None:
    """VMs per slice from the topology (None if it is not valid yet: the model says why)."""
    topology = data.get("topology")
    if not isinstance(topology, str) or not _TOPOLOGY.match(topology):
        return None
    chips = math.prod(int(x) for x in topology.split("x"))
    return 1 if chips == 1 else chips // 4
