"""The verdict reader of a JobSet cell: fetches what ``jobset_verdict`` judges.

``jobset_verdict`` is pure (the rules in one place); this reads what it needs from the
cluster: the group's pods (by the JobSet name label, in verdict order), Kueue's Workloads
(only while the JobSet is suspended) and the failing pod's last log lines (only when a
verdict names it).
"""

from __future__ import annotations

import time
from typing import Any

from accelmatrix.backends.base import JobStatus
from accelmatrix.backends.kubernetes import jobset_verdict as verdict
from accelmatrix.backends.kubernetes.jobset_manifest import CONTAINER, JOBSET_NAME_LABEL
from accelmatrix.backends.kubernetes.pod_logs import PodLogs
from accelmatrix.contracts.machine_records import K8sHandle
from accelmatrix.hooks import jobset as jobset_api
from accelmatrix.hooks.k8s import KubeClients

TAIL_LINES = 20


class JobSetReader:
    """JobSets in one namespace, as ``jobset_verdict`` needs to see them."""

    def __init__(self, clients: KubeClients, ns: str):
        self.clients = clients
        self.ns = ns

    def pods(self, name: str) -> list[Any]:
        """Every pod of JobSet ``name``, by restart attempt, job and completion index."""
        pods = self.clients.core.list_namespaced_pod(
            self.ns, label_selector=f"{JOBSET_NAME_LABEL}={name}"
        )
        return verdict.sort_pods(pods.items)

    def tail(self, pod: str) -> list[str]:
        """The last lines of a pod's workload log."""
        data = PodLogs(self.clients, self.ns).read(pod, CONTAINER) or b""
        return data.decode("utf-8", "replace").splitlines()[-TAIL_LINES:]

    def kueue_state(self, uid: str) -> tuple[str, str]:
        try:
            workloads = jobset_api.list_workloads(self.clients, self.ns, uid)
        except Exception as e:  # no Kueue API, or no permission: say so, don't guess
            return "unknown", f"cannot read Kueue Workloads: {e}"[:300]
        return verdict.kueue_state(workloads)

    def judge(self, handle: K8sHandle, js: dict[str, Any]) -> JobStatus:
        """The verdict on JobSet ``js`` of the cell with ``handle`` (its uid, timeouts)."""
        return verdict.judge(
            js,
            self.pods(handle.job_name),
            now=time.time(),
            handle=handle,
            kueue=lambda: self.kueue_state(handle.uid),
            tail=self.tail,
        )
