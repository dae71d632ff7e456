"""What a TPU node of ours looks like from the API, and the janitor's listing of them.

A node carries its owner twice: lossy, lowercased labels (``managed-by``, dag, run, cell)
and the exact ids as JSON under the ``accelmatrix-identity`` metadata key. This module reads
both back (``_identity``, ``created_at_of``) and lists the nodes and the queued resources
still waiting for capacity for the janitor (``TpuInventory.list_managed``). The janitor's
sweep is its own concern, apart from a cell's provisioning and execution (``backend``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from accelmatrix.backends.base import MANAGED_BY, ManagedResource
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.contracts.machine_records import CellIdentity, ManagedDetail, TpuVmResource
from accelmatrix.hooks.tpu import TpuVmHook, queued_resource_state

READY = "READY"
IDENTITY_METADATA = "accelmatrix-identity"  # node metadata key: exact dag/run/cell ids


class TpuInventory:
    """The managed TPU nodes and queued resources in the machine's zone."""

    def __init__(self, machine: TpuVmMachine, kind: str, hook: TpuVmHook):
        self.machine = machine
        self.kind = kind
        self.hook = hook

    def list_managed(self) -> list[ManagedResource]:
        zone = self.machine.zone
        out: list[ManagedResource] = []
        with self.hook.authorized():
            nodes = self.hook.list_nodes(zone, labels={"managed-by": MANAGED_BY})
            seen = set()
            for n in nodes:
                labels = n.get("labels") or {}
                if labels.get("managed-by") != MANAGED_BY:
                    continue
                short = n["name"].rsplit("/", 1)[-1]
                seen.add(short)
                qr = (n.get("queuedResource") or "").rsplit("/", 1)[-1] or None
                out.append(
                    ManagedResource(
                        backend=self.kind,
                        name=short,
                        labels=dict(labels),
                        created_at=created_at_of(n, None),
                        detail=ManagedDetail(
                            kind="node",
                            zone=zone,
                            state=n.get("state"),
                            node_name=n["name"],
                            identity=_identity(n.get("metadata")),
                            resource=TpuVmResource(
                                backend=self.kind, name=short, zone=zone, queued_resource=qr
                            ),
                        ),
                    )
                )
            # Queued resources still waiting for capacity have no node yet.
            for qr in self.hook.list_queued_resources(zone):
                short = qr.get("name", "").rsplit("/", 1)[-1]
                specs = (qr.get("tpu") or {}).get("nodeSpec") or []
                node_spec = (specs[0].get("node") or {}) if specs else {}
                labels = node_spec.get("labels") or {}
                if labels.get("managed-by") != MANAGED_BY or short in seen:
                    continue
                out.append(
                    ManagedResource(
                        backend=self.kind,
                        name=short,
                        labels=dict(labels),
                        created_at=created_at_of(qr, None),
                        detail=ManagedDetail(
                            kind="queued-resource",
                            zone=zone,
                            state=queued_resource_state(qr),
                            identity=_identity(node_spec.get("metadata")),
                            resource=TpuVmResource(
                                backend=self.kind, name=short, zone=zone, queued_resource=short
                            ),
                        ),
                    )
                )
        return out


def _identity(metadata: Any) -> CellIdentity | None:
    """The exact (dag, run, cell) ids a node was created for, from its metadata, or None."""
    try:
        data = json.loads((metadata or {}).get(IDENTITY_METADATA) or "null")
    except (TypeError, ValueError, AttributeError):
        return None
    if not isinstance(data, dict):
        return None
    ident = {k: data.get(k) for k in ("dag_id", "run_id", "cell_id")}
    if not all(isinstance(v, str) and v for v in ident.values()):
        return None
    return CellIdentity.model_validate(ident)


def created_at_of(obj: dict[str, Any], default: float | None) -> float | None:
    text = obj.get("createTime")
    if not text:
        return default
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default
