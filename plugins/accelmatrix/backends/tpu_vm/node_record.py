"""A TPU node as a cell's resource record, and the cell context a record carries.

Pure mappings from what the Cloud TPU API returns (a node, its network endpoints) to the JSON
the other steps receive through XCom: the workers' addresses, the labels, when the node was
created. Kept apart from ``backend`` because they decide nothing and call no API; a refresh
after a preemption builds the same record again and compares.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from accelmatrix.backends.base import CellContext, InfrastructureError
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.tpu_vm.inventory import created_at_of
from accelmatrix.contracts.machine_records import (
    CellRecord,
    PendingProvision,
    TpuVmResource,
    TpuWorker,
)


def node_resource(
    kind: str,
    machine: TpuVmMachine,
    name: str,
    zone: str,
    node: dict[str, Any],
    pending: PendingProvision,
) -> TpuVmResource:
    """The cell's resource record for a READY ``node`` (its workers' addresses, labels and
    the provisioning record's context); raises InfrastructureError for a node without
    workers."""
    workers = []
    for i, ep in enumerate(node.get("networkEndpoints") or []):
        external = (ep.get("accessConfig") or {}).get("externalIp")
        workers.append(
            TpuWorker(
                index=i,
                internal_ip=ep.get("ipAddress"),
                external_ip=external,
                host=external or ep.get("ipAddress"),
            )
        )
    if not workers:
        raise InfrastructureError(f"TPU node {name} in {zone} reports no workers")
    full = node.get("name") or ""
    parts = full.split("/")
    return TpuVmResource(
        backend=kind,
        name=name,
        node_name=full,
        project=parts[1] if len(parts) > 1 else machine.project,
        zone=zone,
        queued_resource=name if pending.queued else None,
        accelerator_type=node.get("acceleratorType", machine.accelerator_type),
        runtime_version=node.get("runtimeVersion", machine.runtime_version),
        capacity=machine.capacity,
        state=node.get("state"),
        workers=workers,
        hosts=[w.host for w in workers],
        labels=dict(node.get("labels") or pending.labels or {}),
        created_at=created_at_of(node, pending.started_at or time.time()),
        artifacts_dir=pending.ctx.artifacts_dir,
        ctx=pending.ctx,
    )


def cell_context(c: CellRecord) -> CellContext:
    """The CellContext a pending record or resource carries (it crosses task boundaries)."""
    return CellContext(
        dag_id=c.dag_id,
        run_id=c.run_id,
        cell_id=c.cell_id,
        artifacts_dir=Path(c.artifacts_dir),
        ttl_seconds=c.ttl_seconds,
    )
