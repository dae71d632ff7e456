"""The verdict on a k8s-job cell's Job: running, exited with a code, or an infrastructure failure.

``JobPods`` reads a Job's pods and classifies the Job from them and its conditions. A pod
the cluster could not schedule, pull or start, or stopped itself, is the infrastructure's
failure (the run step may retry it; ``pods.pod_problem``), and is judged before any exit code
because a pod the cluster stopped exits 143/137 too. Only a container exiting on its own is
the workload's. It only observes: creating and deleting is ``job_api``'s.
"""

from __future__ import annotations

import time
from typing import Any

from accelmatrix.backends.base import JobStatus
from accelmatrix.backends.kubernetes import pods as k8s_pods
from accelmatrix.backends.kubernetes.job_manifest import CONTAINER
from accelmatrix.backends.kubernetes.unreachable import infra
from accelmatrix.hooks.k8s import KubeClients

UID_LABEL = "batch.kubernetes.io/controller-uid"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

epoch = k8s_pods.epoch


def index(pod: Any) -> int:
    """The completion index of a pod of an Indexed Job (0 for a plain Job's one pod)."""
    labels = pod.metadata.labels or {}
    try:
        return int(labels.get(INDEX_LABEL, 0))
    except ValueError:
        return 0


def terminated(pod: Any, container: str = CONTAINER) -> Any:
    """The terminated state of one of the pod's (regular) containers, or None."""
    for cs in pod.status.container_statuses or []:
        if cs.name == container and cs.state and cs.state.terminated:
            return cs.state.terminated
    return None


class JobPods:
    """The pods of Jobs in one namespace, and what they say about their Job."""

    def __init__(self, clients: KubeClients, ns: str, creating_timeout: float):
        self.clients = clients
        self.ns = ns
        self.creating_timeout = creating_timeout

    def of(self, job: Any) -> list[Any]:
        """The Job's pods, by completion index, oldest first (a retried index has two)."""
        selector = f"{UID_LABEL}={job.metadata.uid}"
        pods = self.clients.core.list_namespaced_pod(self.ns, label_selector=selector).items
        return sorted(pods, key=lambda p: (index(p), epoch(p.metadata.creation_timestamp) or 0))

    def pod0(self, uid: str) -> Any:
        """The newest index-0 pod of the Job with ``uid`` (the one whose log is the cell's)."""
        selector = f"{UID_LABEL}={uid}"
        pods = self.clients.core.list_namespaced_pod(self.ns, label_selector=selector).items
        pods = [p for p in pods if index(p) == 0]
        pods.sort(key=lambda p: epoch(p.metadata.creation_timestamp) or 0)
        return pods[-1] if pods else None

    def inspect(
        self,
        job: Any,
        scheduling_timeout: float,
        containers: list[str] | None = None,
    ) -> tuple[JobStatus, list[Any]]:
        """Classify a Job: running, exited (with the exit code) or an infrastructure failure.

        ``containers``: whose exit codes count (the setup Job has one per command).
        """
        name = job.metadata.name
        pods = self.of(job)
        conditions = {c.type: c for c in (job.status.conditions or []) if c.status == "True"}
        now = time.time()
        for pod in pods:
            problem = k8s_pods.pod_problem(
                pod,
                now=now,
                scheduling_timeout=scheduling_timeout,
                creating_timeout=self.creating_timeout,
            )
            if problem:  # before any exit code: a pod the cluster stopped exits 143/137
                return infra(problem), pods
        if "Complete" in conditions:
            term = terminated(pods[0]) if pods else None
            code = term.exit_code if term else 0
            return JobStatus(done=True, exit_code=code, detail=f"Job {name} complete"), pods
        if "Failed" in conditions:
            cond = conditions["Failed"]
            for pod in pods:
                for cname in containers or [CONTAINER]:
                    term = terminated(pod, cname)
                    if term is None:
                        term = next(
                            (
                                cs.state.terminated
                                for cs in pod.status.init_container_statuses or []
                                if cs.name == cname and cs.state and cs.state.terminated
                            ),
                            None,
                        )
                    if term is not None and term.exit_code != 0:
                        return JobStatus(
                            done=True,
                            exit_code=term.exit_code,
                            detail=f"pod {pod.metadata.name} container {cname} exited with "
                            f"{term.exit_code} ({term.reason})",
                        ), pods
            if cond.reason == "DeadlineExceeded":
                return JobStatus(
                    done=True,
                    exit_code=None,
                    detail=f"Job {name} passed activeDeadlineSeconds and was stopped",
                ), pods
            return infra(
                f"Job {name} failed ({cond.reason}: {cond.message}) without a container exit "
                "code: its pod was deleted or evicted"
            ), pods
        if not pods:
            age = now - (epoch(job.metadata.creation_timestamp) or now)
            if age > scheduling_timeout:
                return infra(
                    f"Job {name} created no pod in {age:.0f} s (quota, admission webhook or "
                    "a missing service account?)"
                ), pods
            return JobStatus(done=False, detail="waiting for a pod"), pods
        phases = ",".join(sorted({p.status.phase for p in pods}))
        return JobStatus(done=False, detail=f"pods {phases}"), pods
