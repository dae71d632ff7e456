"""The janitor's view of the k8s-jobset backend: each cell's JobSet and everything it holds.

``JobSetInventory.list_managed`` extends the k8s-job listing (the cell's setup and child
Jobs) with the cell's JobSets, found by the kind label, and names exactly what each holds
(child Jobs, pods, the headless Service) for the janitor's record of a reap. The janitor's
sweep is its own concern, apart from a cell's lifecycle.
"""

from __future__ import annotations

import json

from accelmatrix import settings
from accelmatrix.backends.base import MANAGED_BY, ManagedResource
from accelmatrix.backends.kubernetes import pods as k8s_pods
from accelmatrix.backends.kubernetes.job_inventory import JobInventory, identity_of
from accelmatrix.backends.kubernetes.job_manifest import KIND_LABEL
from accelmatrix.backends.kubernetes.jobset_manifest import JOBSET_NAME_LABEL
from accelmatrix.contracts.machine_records import K8sResource, ManagedDetail
from accelmatrix.hooks import jobset as jobset_api
from accelmatrix.hooks.k8s import KubeClients


class JobSetInventory:
    """The managed JobSets (and their cells' Jobs) of one machine kind in one namespace."""

    def __init__(self, clients: KubeClients, ns: str, kind: str):
        self.clients = clients
        self.ns = ns
        self.kind = kind

    def list_managed(self) -> list[ManagedResource]:
        """One entry per cell: its JobSet, child and setup Jobs, pods and Service, by exact name."""
        clients, ns = self.clients, self.ns
        jobs = JobInventory(clients, ns, self.kind).list_managed()
        entries = {e.name: e for e in jobs}
        for e in entries.values():
            e.backend = self.kind
            if e.detail.resource is not None:
                e.detail.resource.backend = self.kind
        selector = f"managed-by={MANAGED_BY},{KIND_LABEL}={self.kind}"
        for js in jobset_api.list_jobsets(clients, ns, selector):
            meta = js["metadata"]
            labels = dict(meta.get("labels") or {})
            name = meta["name"]
            annotations = dict(meta.get("annotations") or {})
            try:
                record = json.loads(annotations.get("accelmatrix.io/resource") or "null")
            except ValueError:
                record = None
            if not isinstance(record, dict) or not record.get("job_name"):
                record = {"name": f"{ns}/{name}", "job_name": name, "setup_job_name": name}
            record.update(namespace=ns, backend=self.kind)
            record.setdefault("kubernetes_conn_id", clients.conn_id)
            record.setdefault(
                "artifacts_dir", str(settings.home() / "orphans" / self.kind / ns / name)
            )
            ident = identity_of(annotations)
            key = f"{ns}/{name}"
            entry = entries.get(key)
            if entry is None:
                entry = entries[key] = ManagedResource(
                    backend=self.kind,
                    name=key,
                    labels={k: v for k, v in labels.items() if k != "accelmatrix.io/role"},
                    created_at=k8s_pods.epoch(meta.get("creationTimestamp")),
                    detail=ManagedDetail(namespace=ns, identity=ident, annotations=annotations),
                )
            detail = entry.detail
            detail.resource = K8sResource.model_validate(record)
            detail.jobset, detail.jobset_uid = name, meta.get("uid")
            pods = clients.core.list_namespaced_pod(
                ns, label_selector=f"{JOBSET_NAME_LABEL}={name}"
            )
            detail.pods = sorted(p.metadata.name for p in pods.items)
            detail.services = _services(clients, ns, name)
            # Exact ids of everything the cell holds, for the janitor's record of the reap.
            detail.children = (
                [f"JobSet {ns}/{name} uid={meta.get('uid')}"]
                + [f"Job {ns}/{j}" for j in sorted(detail.jobs)]
                + [f"Pod {ns}/{p}" for p in detail.pods]
                + [f"Service {ns}/{s}" for s in detail.services]
            )
        return list(entries.values())


def _services(clients: KubeClients, ns: str, name: str) -> list[str]:
    """The JobSet's headless Service, if it still exists."""
    from kubernetes.client.exceptions import ApiException

    try:
        svc = clients.core.read_namespaced_service(name, ns)
    except ApiException:
        return []
    return [svc.metadata.name]
