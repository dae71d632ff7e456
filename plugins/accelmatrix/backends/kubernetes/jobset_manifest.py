"""The JobSet manifest of a multi-node cell (``jobset.x-k8s.io/v1alpha2``), pure.

Kept apart from the backend so the shape can be read, tested and documented on its own
(docs/backends-kubernetes.md shows one). ``JobSetManifest`` builds the pod template from the
k8s-job parts (``job_manifest.JobManifest``: container, volume, selectors) and wraps it with
the functions below; a machine kind with other pods (GKE TPU) subclasses it. What each part
is for:

* **one replicated job** (``workers``) of ``num_nodes`` Indexed pods; pod 0 of job 0 leads.
  ``network.enableDNSHostnames`` makes the JobSet controller create a headless Service named
  like the JobSet and give every pod the hostname ``<jobset>-workers-<job>-<pod>`` under it,
  so the leader's address is known before any pod exists: no discovery step, no race.
* **rendezvous environment** for torchrun/torch.distributed (``MASTER_ADDR``,
  ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``/``RANK``, and ``PET_*`` which torchrun reads
  as its own arguments) and for JAX (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
  ``JAX_PROCESS_ID``). The rank comes from the downward API (the pod's completion-index
  annotation), never from a shell snippet.
* **failure policy**: each child Job has ``backoffLimit: 0`` and a pod failure policy that
  ends the Job with reason ``PodFailurePolicy`` when the workload container exits non-zero,
  but only *counts* a pod the cluster disrupted (``DisruptionTarget``: eviction,
  preemption). The JobSet rule fails the whole JobSet at once on ``PodFailurePolicy`` (a
  workload exit is not retriable); any other Job failure restarts every Job, up to
  ``max_restarts``. A failed JobSet deletes its still-running Jobs, so the peers of a
  crashed rank stop instead of waiting on a collective.
* **success policy**: all Jobs of ``workers`` complete.
* ``ttlSecondsAfterFinished`` as the backstop for a dead triggerer; Kueue's queue and
  priority labels and ``suspend: true`` (Kueue resumes what it admits).
"""

from __future__ import annotations

from typing import Any

from accelmatrix.backends.kubernetes.job_manifest import JobManifest
from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine
from accelmatrix.contracts.machine_records import K8sResource
from accelmatrix.hooks.jobset import JOBSET_API_VERSION

CONTAINER = "workload"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
WORKLOAD_EXIT_RULE = "workload-exit-is-final"


def leader_host(jobset: str, replicated_job: str) -> str:
    """The leader pod's DNS name (hostname.subdomain; the namespace's search path does the rest)."""
    return f"{jobset}-{replicated_job}-0-0.{jobset}"


def rendezvous_env(
    jobset: str, replicated_job: str, nodes: int, port: int, jax_port: int
) -> list[dict[str, Any]]:
    """Environment every pod gets; the rank ones read the pod's completion index."""
    leader = leader_host(jobset, replicated_job)
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    fixed = {
        "MASTER_ADDR": leader,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes),
        "PET_MASTER_ADDR": leader,
        "PET_MASTER_PORT": str(port),
        "PET_NNODES": str(nodes),
        "JAX_COORDINATOR_ADDRESS": f"{leader}:{jax_port}",
        "JAX_NUM_PROCESSES": str(nodes),
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in fixed.items()]
    for name in ("NODE_RANK", "RANK", "PET_NODE_RANK", "JAX_PROCESS_ID"):
        env.append({"name": name, "valueFrom": index})
    return env


def child_job_spec(
    pod_template: dict[str, Any],
    nodes: int,
    active_deadline_seconds: int,
    restart_on_exit_codes: list[int] | None = None,
) -> dict[str, Any]:
    """The Job template of the replicated job (one Indexed Job of ``nodes`` pods)."""
    return {
        "backoffLimit": 0,
        "completions": nodes,
        "parallelism": nodes,
        "completionMode": "Indexed",
        "activeDeadlineSeconds": active_deadline_seconds,
        "podFailurePolicy": {
            "rules": [
                # First match wins: a pod the cluster stopped exits 143/137 too, and that
                # must not read as the workload's exit.
                {
                    "action": "Count",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "NotIn",
                        # Codes listed here match no rule: counted, so the group restarts.
                        "values": [0, *(restart_on_exit_codes or [])],
                    },
                },
            ]
        },
        "template": pod_template,
    }


def jobset_body(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    replicated_job: str,
    replicas: int,
    job_spec: dict[str, Any],
    max_restarts: int,
    ttl_seconds_after_finished: int,
    queue_name: str | None = None,
    priority_class: str | None = None,
) -> dict[str, Any]:
    meta_labels = dict(labels)
    if queue_name:
        meta_labels[QUEUE_LABEL] = queue_name
        if priority_class:
            meta_labels[PRIORITY_LABEL] = priority_class
    spec: dict[str, Any] = {
        "network": {
            "enableDNSHostnames": True,
            "subdomain": name,
            "publishNotReadyAddresses": True,
        },
        "failurePolicy": {
            "maxRestarts": max_restarts,
            "rules": [
                {
                    "name": WORKLOAD_EXIT_RULE,
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
        },
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [replicated_job]},
        "ttlSecondsAfterFinished": ttl_seconds_after_finished,
        "replicatedJobs": [
            {
                "name": replicated_job,
                "replicas": replicas,
                "template": {
                    "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
                    "spec": job_spec,
                },
            }
        ],
    }
    if queue_name:
        spec["suspend"] = True  # Kueue resumes it on admission
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": meta_labels,
            "annotations": dict(annotations),
        },
        "spec": spec,
    }


class JobSetManifest:
    """The JobSet bodies of one k8s-jobset machine."""

    def __init__(self, machine: KubernetesJobSetMachine):
        self.machine = machine
        self.job = JobManifest(machine)  # the container, volume and scheduling parts

    def workload_jobset(
        self, resource: K8sResource, argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The JobSet manifest submit creates."""
        m = self.machine
        name = resource.job_name
        container = self.job.container(CONTAINER, argv, env)
        container["env"] += self.group_env(name)
        container["ports"] = [
            {"name": "rendezvous", "containerPort": m.rendezvous_port},
            {"name": "jax-coord", "containerPort": m.jax_coordinator_port},
        ]
        job = self.job.job_body(resource, name, "workload", [container], nodes=m.num_nodes)
        pod_template = job["spec"]["template"]
        self.adjust_pod_template(pod_template)
        spec = child_job_spec(
            pod_template,
            m.num_nodes,
            int(resource.active_deadline_seconds),
            m.restart_on_exit_codes,
        )
        meta = job["metadata"]
        return jobset_body(
            name=name,
            namespace=resource.namespace,
            labels=meta["labels"],
            annotations=meta["annotations"],
            replicated_job=m.replicated_job,
            replicas=m.replicas,
            job_spec=spec,
            max_restarts=m.max_restarts,
            ttl_seconds_after_finished=m.ttl_seconds_after_finished,
            queue_name=m.kueue.queue_name if m.kueue else None,
            priority_class=m.kueue.priority_class if m.kueue else None,
        )

    # The two points where a machine kind's pods differ (GKE TPU overrides both).
    def group_env(self, name: str) -> list[dict[str, Any]]:
        """The rendezvous environment of every pod of JobSet ``name``."""
        m = self.machine
        return rendezvous_env(
            name, m.replicated_job, m.num_nodes, m.rendezvous_port, m.jax_coordinator_port
        )

    def adjust_pod_template(self, template: dict[str, Any]) -> None:
        """Add to every pod (nothing for plain JobSets)."""
