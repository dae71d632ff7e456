"""GkeTpuBackend: TPU slices on GKE, the k8s-jobset backend with XPK's pod shape.

Everything of the contract is the JobSet backend's; only the pods differ, so only the
manifest does (``GkeTpuManifest``, a ``JobSetManifest``): TPU node selectors,
``google.com/tpu`` chips per VM, the ``google.com/tpu`` toleration, host networking (as XPK:
DCN traffic of multi-slice jobs bypasses the pod network), the TPU runtime ports, one node
pool per slice, and the multi-slice environment.
"""

from __future__ import annotations

from typing import Any

from accelmatrix.backends.kubernetes.jobset import KubernetesJobSetBackend
from accelmatrix.backends.kubernetes.jobset_manifest import (
    COMPLETION_INDEX,
    JobSetManifest,
    leader_host,
)
from accelmatrix.backends.machines.gke_tpu import GkeTpuMachine
from accelmatrix.contracts.machine_records import K8sResource

TPU_RESOURCE = "google.com/tpu"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
TPU_PORTS = (8471, 8080)  # TPU runtime / slice builder, MEGASCALE coordinator


class GkeTpuManifest(JobSetManifest):
    """The JobSet of a TPU slice (or several): XPK's pod shape on the JobSet's."""

    machine: GkeTpuMachine

    def group_env(self, name: str) -> list[dict[str, Any]]:
        m = self.machine
        leader = leader_host(name, m.replicated_job)
        processes = m.num_slices * m.num_nodes
        env: list[dict[str, Any]] = [
            {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{leader}:{m.jax_coordinator_port}"},
            {"name": "JAX_NUM_PROCESSES", "value": str(processes)},
            {"name": "TPU_WORKERS_PER_SLICE", "value": str(m.num_nodes)},
        ]
        index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        if m.num_slices > 1:
            slice_id = {
                "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}
            }
            env += [
                {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": leader},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(m.num_slices)},
                {"name": "MEGASCALE_PORT", "value": str(TPU_PORTS[1])},
                {"name": "MEGASCALE_SLICE_ID", "valueFrom": slice_id},
                {"name": "TPU_WORKER_ID", "valueFrom": index},
            ]
        else:  # one slice: the completion index is the process id
            env += [
                {"name": "JAX_PROCESS_ID", "valueFrom": index},
                {"name": "TPU_WORKER_ID", "valueFrom": index},
            ]
        return env

    def adjust_pod_template(self, template: dict[str, Any]) -> None:
        m = self.machine
        spec = template["spec"]
        spec.setdefault("nodeSelector", {}).update(
            {GKE_TPU_ACCELERATOR: m.gke_accelerator, GKE_TPU_TOPOLOGY: m.topology}
        )
        tolerations = spec.setdefault("tolerations", [])
        if not any(t.get("key") == TPU_RESOURCE for t in tolerations):
            tolerations.append({"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        for c in spec["containers"]:
            c["env"] = [e for e in c["env"] if e["name"] != "CUDA_VISIBLE_DEVICES"]
            res = c.setdefault("resources", {})
            res.setdefault("limits", {})[TPU_RESOURCE] = str(m.chips_per_vm)
            res.setdefault("requests", {})[TPU_RESOURCE] = str(m.chips_per_vm)
            ports = {p["containerPort"] for p in c.get("ports") or []}
            c["ports"] = (c.get("ports") or []) + [
                {"containerPort": p} for p in TPU_PORTS if p not in ports
            ]

    def workload_jobset(
        self, resource: K8sResource, argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        body = super().workload_jobset(resource, argv, env)
        if self.machine.num_slices > 1:  # one slice per node pool
            body["metadata"]["annotations"][EXCLUSIVE_TOPOLOGY] = "cloud.google.com/gke-nodepool"
        return body


class GkeTpuBackend(KubernetesJobSetBackend):
    kind = "gke-tpu"
    machine: GkeTpuMachine

    @staticmethod
    def group_manifest_for(machine: Any) -> GkeTpuManifest:
        return GkeTpuManifest(machine)
