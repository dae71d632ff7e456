"""The Job manifest of the k8s-job backend: containers, pod template, labels, annotations.

``JobManifest`` turns a machine and a cell's resource record into the ``batch/v1`` Job
bodies the backend creates (the workload Job and the setup Job), and these constants name
the labels and annotation they carry. It is pure: no API call, no clock, so a manifest can be
rendered and read without a cluster (tests and docs do). The JobSet manifest builds its pod
template from the same parts (``jobset_manifest.JobSetManifest``).
"""

from __future__ import annotations

import json
from typing import Any

from accelmatrix.backends.base import BackendError
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.contracts.machine_records import K8sResource

CONTAINER = "workload"
RESOURCE_ANNOTATION = "accelmatrix.io/resource"
TEARDOWN_KEYS = (
    "backend",
    "name",
    "kubernetes_conn_id",
    "namespace",
    "job_name",
    "setup_job_name",
    "artifacts_dir",
    "work_subpath",
    "local_work_dir",
)
JOB_LABEL = "accelmatrix.io/job"
KIND_LABEL = "accelmatrix.io/backend"  # set by other Kubernetes kinds (k8s-jobset, gke-tpu)
ROLE_LABEL = "accelmatrix.io/role"
GPU_TAINT = "nvidia.com/gpu"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"


class JobManifest:
    """The Job bodies of one machine (a k8s-job machine, or a JobSet machine's pods)."""

    def __init__(self, machine: KubernetesJobMachine):
        self.machine = machine

    def env(self, env: dict[str, str]) -> list[dict[str, str]]:
        """The container env: the suite's, the work dir, the node count; a CPU-only cell
        hides any GPU the node has, so it cannot use one by accident."""
        m = self.machine
        values = dict(env)
        values["ACCELMATRIX_WORK_DIR"] = m.work_dir
        values["ACCELMATRIX_NUM_NODES"] = str(m.num_nodes)
        if m.accelerator_resource is None:
            values.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # CPU-only: no GPU even if present
        return [{"name": k, "value": v} for k, v in values.items()]

    def container(self, name: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        """One container running ``argv`` as written (no shell), with the machine's
        image, resources and the work volume."""
        if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
            raise BackendError(f"invalid argv {argv!r}: empty, not strings or containing NUL")
        m = self.machine
        requests = {k: v for k, v in (("cpu", m.cpu), ("memory", m.memory)) if v}
        limits: dict[str, str] = {}
        if m.accelerator_resource:
            limits[m.accelerator_resource] = str(m.gpus or 1)
        resources: dict[str, Any] = {}
        if requests:
            resources["requests"] = requests
        if limits:
            resources["limits"] = limits
        return {
            "name": name,
            "image": m.image,
            "imagePullPolicy": m.image_pull_policy,
            # Exec form: no shell ever sees an argument. But the kubelet itself expands
            # `$(VAR)` in command and args from the container's env; `$$` is its escape, so
            # every `$` is doubled and each argument reaches the process exactly as written.
            "command": [a.replace("$", "$$") for a in argv],
            "workingDir": m.work_dir,
            "env": self.env(env),
            "resources": resources,
            "volumeMounts": [{"name": "work", "mountPath": m.work_dir}],
        }

    def job_body(
        self,
        resource: K8sResource,
        name: str,
        role: str,
        containers: list[dict[str, Any]],
        init_containers: list[dict[str, Any]] | None = None,
        nodes: int = 1,
    ) -> dict[str, Any]:
        """A Job of ``role`` (workload or setup) around ``containers``: the pod template
        (volume, node selector, tolerations), the cell's labels, and the record teardown
        needs as an annotation (a janitor can release a Job it finds orphaned)."""
        m = self.machine
        if m.artifacts_volume:
            volume = {
                "name": "work",
                "persistentVolumeClaim": {"claimName": m.artifacts_volume.claim_name},
            }
            for c in containers + (init_containers or []):
                c["volumeMounts"][0]["subPath"] = resource.work_subpath
        else:
            volume = {"name": "work", "emptyDir": {}}
        node_selector = dict(m.node_selector)
        if m.accelerator:
            node_selector[GKE_ACCELERATOR] = m.accelerator
        tolerations = [t.model_dump(exclude_none=True) for t in m.tolerations]
        if m.accelerator_resource and not any(t.get("key") == GPU_TAINT for t in tolerations):
            tolerations.append({"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"})
        labels = dict(resource.labels)
        pod_labels = {**labels, JOB_LABEL: resource.job_name, ROLE_LABEL: role}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": containers,
            "volumes": [volume],
        }
        if init_containers:
            pod_spec["initContainers"] = init_containers
        if m.service_account:
            pod_spec["serviceAccountName"] = m.service_account
        if node_selector:
            pod_spec["nodeSelector"] = node_selector
        if tolerations:
            pod_spec["tolerations"] = tolerations
        spec: dict[str, Any] = {
            "backoffLimit": 0,
            "completions": nodes,
            "parallelism": nodes,
            "ttlSecondsAfterFinished": m.ttl_seconds_after_finished,
            "activeDeadlineSeconds": int(resource.active_deadline_seconds),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        }
        if nodes > 1:
            spec["completionMode"] = "Indexed"
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": resource.namespace,
                "labels": {**labels, JOB_LABEL: resource.job_name, ROLE_LABEL: role},
                "annotations": {
                    **dict(resource.annotations or {}),
                    # What teardown needs, so a janitor can release a Job it finds orphaned.
                    RESOURCE_ANNOTATION: json.dumps(
                        {k: getattr(resource, k) for k in TEARDOWN_KEYS}, separators=(",", ":")
                    ),
                },
            },
            "spec": spec,
        }

    def workload_job(
        self, resource: K8sResource, argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The Job manifest submit creates."""
        return self.job_body(
            resource,
            resource.job_name,
            "workload",
            [self.container(CONTAINER, argv, env)],
            nodes=self.machine.num_nodes,
        )
