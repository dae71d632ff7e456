"""TpuVmBackend: one Cloud TPU VM (or multi-host slice) per cell, through gcloud.

This is the provisioning half: ``provision`` / ``teardown`` / ``list_managed``. Running the
workload on the node's workers goes over SSH (``backends/ssh.py``); those methods raise
``NotImplementedError`` here.

provision(ctx) is get-or-create on a deterministic name (``tpu_names.node_name``), so a
retried task finds the node its previous attempt created:

1. ``describe`` the node; if it exists it is reused (waiting for READY if still CREATING).
2. Otherwise ``tpu-vm create`` (on-demand / spot / preemptible / reserved), or, for
   ``capacity: queued``, a queued resource of the same name with ``--valid-until-duration``,
   polled until ACTIVE.
3. Wait until the node is READY, then return a JSON resource with the workers' IPs.

Anything that fails half way is deleted before the error propagates (Airflow skips the
teardown of a failed setup task). Capacity problems (quota, stockout, a queued resource that
FAILED or outlived valid-until, preemption, not READY in time) raise ``InfrastructureError``.

The waits block the worker slot for now (a trigger would be the better home for them).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from accelmatrix.backends import tpu_names
from accelmatrix.backends.base import (
    MANAGED_BY,
    Backend,
    CellContext,
    InfrastructureError,
    JobStatus,
    LogFn,
    ManagedResource,
)
from accelmatrix.hooks.tpu import (
    TpuAlreadyExists,
    TpuError,
    TpuVmHook,
    queued_resource_error,
    queued_resource_state,
)
from accelmatrix.spec.machine_tpu import TpuVmMachine

log = logging.getLogger(__name__)

EXECUTION = "execution over SSH: see backends/ssh.py"
READY = "READY"
# Node states from which a node never becomes READY by itself.
DEAD_NODE_STATES = ("PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN")
QR_DEAD_STATES = ("FAILED", "SUSPENDING", "SUSPENDED", "DELETING")
QR_GRACE_SECONDS = 120  # after valid-until, how long we still wait for the service to say so


class TpuVmBackend(Backend):
    kind = "tpu-vm"

    def __init__(
        self,
        machine_spec: dict[str, Any],
        *,
        hook: TpuVmHook | None = None,
        poll_interval: float = 15.0,
    ) -> None:
        super().__init__(machine_spec)
        self.machine = TpuVmMachine.model_validate(machine_spec)
        self.hook = hook or TpuVmHook(
            gcp_conn_id=self.machine.gcp_conn_id, project_id=self.machine.project
        )
        self.poll_interval = poll_interval

    # -- naming ------------------------------------------------------------------------------
    @staticmethod
    def name_for(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id)

    def node_metadata(self, ctx: CellContext) -> dict[str, str]:
        """VM metadata of a new node (the SSH side adds ``ssh-keys`` here)."""
        return dict(self.machine.metadata)

    # -- lifecycle ---------------------------------------------------------------------------
    def provision(self, ctx: CellContext) -> dict[str, Any]:
        m = self.machine
        name, zone = self.name_for(ctx), m.zone
        now = time.time()
        labels = tpu_names.managed_labels(
            ctx.dag_id, ctx.run_id, ctx.cell_id, now + ctx.ttl_seconds, ctx.labels
        )
        queued = m.capacity == "queued"
        made: set[str] = set()  # what this call tried to create: undone on failure
        with self.hook.authorized():
            try:
                node = self.hook.get_node(name, zone)
                if node is not None and node.get("state") in DEAD_NODE_STATES:
                    raise InfrastructureError(
                        f"TPU node {name} found in state {node.get('state')}; deleting it so a "
                        "retry starts fresh"
                    )
                if node is None and queued:
                    node = self._provision_queued(name, zone, labels, ctx, made)
                elif node is None:
                    made.add("node")
                    node = self._create_node(name, zone, labels, ctx)
                node = self._wait_ready(name, zone, node)
            except BaseException as exc:
                # What this call created, and anything unusable (InfrastructureError), is
                # deleted: Airflow does not run the teardown of a failed setup task. A node
                # found healthy survives other errors, for the retry to reuse.
                if isinstance(exc, InfrastructureError):
                    made.update(("node", "queued resource") if queued else ("node",))
                self._undo(name, zone, made, exc)
                raise
        return self._resource(name, zone, node, labels, queued, now)

    def _create_node(
        self, name: str, zone: str, labels: dict[str, str], ctx: CellContext
    ) -> dict[str, Any]:
        m = self.machine
        try:
            return self.hook.create_node(
                name,
                zone,
                m.accelerator_type,
                m.runtime_version,
                labels=labels,
                spot=m.capacity == "spot",
                preemptible=m.capacity == "preemptible",
                reserved=m.capacity == "reserved",
                metadata=self.node_metadata(ctx),
                network=m.network,
                subnetwork=m.subnetwork,
                internal_ips=m.internal_ips,
                timeout=m.provision_timeout_seconds,
            )
        except TpuAlreadyExists:  # a concurrent attempt won the race: use its node
            return self.hook.describe_node(name, zone)

    def _provision_queued(
        self, name: str, zone: str, labels: dict[str, str], ctx: CellContext, made: set[str]
    ) -> dict[str, Any]:
        """Create (or, on a retry, find) the queued resource; wait until it is ACTIVE."""
        m = self.machine
        valid = int(m.valid_until_seconds or 0)
        made.add("queued resource")
        try:
            qr = self.hook.create_queued_resource(
                name,
                zone,
                m.accelerator_type,
                m.runtime_version,
                node_id=name,
                labels=labels,
                metadata=self.node_metadata(ctx),
                valid_until_duration=valid,
                network=m.network,
                subnetwork=m.subnetwork,
                internal_ips=m.internal_ips,
            )
        except TpuAlreadyExists:  # a retry: the earlier attempt's request is still queued
            made.discard("queued resource")
            qr = self.hook.describe_queued_resource(name, zone)
        deadline = _created_at(qr, time.time()) + valid + QR_GRACE_SECONDS
        while True:
            state = queued_resource_state(qr)
            if state == "ACTIVE":
                return self.hook.describe_node(name, zone)
            if state in QR_DEAD_STATES:
                reason = queued_resource_error(qr) or "no reason given"
                raise InfrastructureError(f"queued resource {name} in {zone} is {state}: {reason}")
            if time.time() > deadline:
                raise InfrastructureError(
                    f"queued resource {name} in {zone} still {state} {valid}s after its "
                    "valid-until duration"
                )
            time.sleep(self.poll_interval)
            qr = self.hook.describe_queued_resource(name, zone)

    def _wait_ready(self, name: str, zone: str, node: dict[str, Any]) -> dict[str, Any]:
        deadline = time.time() + self.machine.provision_timeout_seconds
        while True:
            state = node.get("state")
            if state == READY:
                return node
            if state in DEAD_NODE_STATES:
                raise InfrastructureError(f"TPU node {name} in {zone} became {state}")
            if time.time() > deadline:
                raise InfrastructureError(
                    f"TPU node {name} in {zone} not READY after "
                    f"{self.machine.provision_timeout_seconds}s (state {state})"
                )
            time.sleep(self.poll_interval)
            node = self.hook.describe_node(name, zone)

    def _undo(self, name: str, zone: str, made: set[str], exc: BaseException) -> None:
        """Delete what provision created or found unusable; never masks ``exc``."""
        if not made:
            return
        log.warning("provision of %s failed (%s); deleting %s", name, exc, sorted(made))
        # Deleting the queued resource with --force deletes its node too.
        if "queued resource" in made and self._try_delete("queued resource", name, zone, exc):
            return
        if "node" in made or "queued resource" in made:
            self._try_delete("node", name, zone, exc)

    def _try_delete(self, what: str, name: str, zone: str, exc: BaseException) -> bool:
        try:
            if what == "node":
                return self.hook.delete_node(name, zone)
            return self.hook.delete_queued_resource(name, zone, force=True)
        except Exception as e:  # keep the original error; say what may be left behind
            log.error("could not delete %s %s in %s: %s", what, name, zone, e)
            exc.add_note(f"cleanup: could not delete {what} {name} in {zone}: {e}")
            return False

    def _resource(
        self,
        name: str,
        zone: str,
        node: dict[str, Any],
        labels: dict[str, str],
        queued: bool,
        now: float,
    ) -> dict[str, Any]:
        workers = []
        for i, ep in enumerate(node.get("networkEndpoints") or []):
            external = (ep.get("accessConfig") or {}).get("externalIp")
            workers.append(
                {
                    "index": i,
                    "internal_ip": ep.get("ipAddress"),
                    "external_ip": external,
                    "host": external or ep.get("ipAddress"),
                }
            )
        full = node.get("name") or ""
        parts = full.split("/")
        return {
            "backend": self.kind,
            "name": name,
            "node_name": full,
            "project": parts[1] if len(parts) > 1 else self.machine.project,
            "zone": zone,
            "queued_resource": name if queued else None,
            "accelerator_type": node.get("acceleratorType", self.machine.accelerator_type),
            "runtime_version": node.get("runtimeVersion", self.machine.runtime_version),
            "capacity": self.machine.capacity,
            "state": node.get("state"),
            "workers": workers,
            "hosts": [w["host"] for w in workers],
            "labels": dict(node.get("labels") or labels),
            "created_at": _created_at(node, now),
        }

    def teardown(self, resource: dict[str, Any]) -> None:
        name, zone = resource["name"], resource.get("zone") or self.machine.zone
        with self.hook.authorized():
            qr = resource.get("queued_resource")
            if qr or self.machine.capacity == "queued":
                # --force also deletes the node; without a queued resource, delete the node.
                if self.hook.delete_queued_resource(qr or name, zone, force=True):
                    return
            self.hook.delete_node(name, zone)

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
                        created_at=_created_at(n, None),
                        detail={
                            "kind": "node",
                            "zone": zone,
                            "state": n.get("state"),
                            "node_name": n["name"],
                            "resource": {"name": short, "zone": zone, "queued_resource": qr},
                        },
                    )
                )
            # Queued resources still waiting for capacity have no node yet.
            for qr in self.hook.list_queued_resources(zone):
                short = qr.get("name", "").rsplit("/", 1)[-1]
                specs = (qr.get("tpu") or {}).get("nodeSpec") or []
                labels = ((specs[0].get("node") or {}).get("labels") or {}) if specs else {}
                if labels.get("managed-by") != MANAGED_BY or short in seen:
                    continue
                out.append(
                    ManagedResource(
                        backend=self.kind,
                        name=short,
                        labels=dict(labels),
                        created_at=_created_at(qr, None),
                        detail={
                            "kind": "queued-resource",
                            "zone": zone,
                            "state": queued_resource_state(qr),
                            "resource": {"name": short, "zone": zone, "queued_resource": short},
                        },
                    )
                )
        return out

    # -- execution: over SSH (backends/ssh.py) -----------------------------------------------
    def variables(self, resource: dict[str, Any]) -> dict[str, str]:
        raise NotImplementedError(EXECUTION)

    def setup(
        self,
        resource: dict[str, Any],
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        raise NotImplementedError(EXECUTION)

    def submit(
        self, resource: dict[str, Any], argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        raise NotImplementedError(EXECUTION)

    def poll(self, handle: dict[str, Any]) -> JobStatus:
        raise NotImplementedError(EXECUTION)

    def read_logs(self, handle: dict[str, Any], offset: int) -> tuple[list[str], int]:
        raise NotImplementedError(EXECUTION)

    def cancel(self, handle: dict[str, Any]) -> None:
        raise NotImplementedError(EXECUTION)

    def collect(self, resource: dict[str, Any], globs: list[str], dest: Path) -> list[str]:
        raise NotImplementedError(EXECUTION)


def _created_at(obj: dict[str, Any], default: float | None) -> float | None:
    text = obj.get("createTime")
    if not text:
        return default
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


__all__ = ["TpuVmBackend", "TpuError"]
