"""The janitor's view of the k8s-job backend: the managed Jobs in a namespace, by cell.

A cell's Jobs carry ``managed-by=accelmatrix``, the cell's job label and, as an annotation,
the resource record teardown needs; ``JobInventory.list_managed`` groups them by cell and
reads the record back so a janitor can release an orphan. The janitor's sweep is its own
concern, apart from a cell's lifecycle; the JobSet inventory adds the cells' JobSets to it.
"""

from __future__ import annotations

import json

from accelmatrix import settings
from accelmatrix.backends.base import MANAGED_BY, ManagedResource
from accelmatrix.backends.kubernetes.job_manifest import (
    JOB_LABEL,
    KIND_LABEL,
    RESOURCE_ANNOTATION,
    ROLE_LABEL,
)
from accelmatrix.backends.kubernetes.job_pods import epoch
from accelmatrix.contracts.machine_records import CellIdentity, K8sResource, ManagedDetail
from accelmatrix.hooks.k8s import KubeClients


def identity_of(annotations: dict[str, str]) -> CellIdentity | None:
    """The exact (dag, run, cell) a cell's Job or JobSet annotations name, or None."""
    ident = {
        "dag_id": annotations.get("accelmatrix.io/dag-id"),
        "run_id": annotations.get("accelmatrix.io/run-id"),
        "cell_id": annotations.get("accelmatrix.io/cell-id"),
    }
    return CellIdentity.model_validate(ident) if all(ident.values()) else None


class JobInventory:
    """The managed Jobs of one machine kind in one namespace, grouped by cell."""

    def __init__(self, clients: KubeClients, ns: str, kind: str):
        self.clients = clients
        self.ns = ns
        self.kind = kind

    def list_managed(self) -> list[ManagedResource]:
        """One entry per cell (its setup and workload Jobs share the cell's job label)."""
        clients, ns = self.clients, self.ns
        jobs = clients.batch.list_namespaced_job(ns, label_selector=f"managed-by={MANAGED_BY}")
        by_cell: dict[str, ManagedResource] = {}
        for job in jobs.items:
            labels = dict(job.metadata.labels or {})
            if labels.get("managed-by") != MANAGED_BY:
                continue
            # Another Kubernetes machine kind's cell (a JobSet's child and setup Jobs) is
            # that backend's to judge: reaping its Jobs here would fight its controller.
            if labels.get(KIND_LABEL, "k8s-job") != self.kind:
                continue
            annotations = dict(job.metadata.annotations or {})
            cell_job = labels.get(JOB_LABEL) or job.metadata.name
            st = job.status
            try:
                record = json.loads(annotations.get(RESOURCE_ANNOTATION) or "null")
            except ValueError:
                record = None
            if not isinstance(record, dict) or not record.get("job_name"):
                # No record (made by an older version): delete just this Job.
                record = {"name": f"{ns}/{cell_job}", "job_name": job.metadata.name}
                record["setup_job_name"] = job.metadata.name
            record.update(namespace=ns, backend=self.kind)
            record.setdefault("kubernetes_conn_id", clients.conn_id)
            record.setdefault(
                "artifacts_dir",
                str(settings.home() / "orphans" / self.kind / ns / cell_job),
            )
            entry = by_cell.get(cell_job)
            if entry is None:
                entry = by_cell[cell_job] = ManagedResource(
                    backend=self.kind,
                    name=f"{ns}/{cell_job}",
                    labels={k: v for k, v in labels.items() if k != ROLE_LABEL},
                    created_at=epoch(job.metadata.creation_timestamp),
                    detail=ManagedDetail(
                        namespace=ns,
                        identity=identity_of(annotations),
                        annotations=annotations,
                        resource=K8sResource.model_validate(record),
                    ),
                )
            d = entry.detail
            d.jobs.append(job.metadata.name)
            d.active += getattr(st, "active", None) or 0
            d.succeeded += getattr(st, "succeeded", None) or 0
            d.failed += getattr(st, "failed", None) or 0
            created = epoch(job.metadata.creation_timestamp)
            if created is not None and (entry.created_at is None or created < entry.created_at):
                entry.created_at = created
        return list(by_cell.values())
