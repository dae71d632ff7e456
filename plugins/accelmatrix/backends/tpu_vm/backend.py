"""TpuVmBackend: one Cloud TPU VM (or multi-host slice) per cell, through gcloud and SSH.

Provisioning is get-or-create on a deterministic name (``tpu_names.node_name``), so a retried
task finds the node its previous attempt created instead of making a second one. It comes in
three steps so that the long wait for capacity holds no worker slot (see
``steps/provision/operator.py``, which defers between them to ``ProvisionTrigger``):

1. ``begin_provision``: ``describe`` the node; reuse it if it exists (a node found PREEMPTED
   or TERMINATED is deleted and the attempt fails as infrastructure, for the retry to start
   fresh). Otherwise ``tpu-vm create --async`` (on-demand / spot / preemptible / reserved),
   or, for ``capacity: queued``, a queued resource of the same name with
   ``--valid-until-duration``. The node's metadata carries ``ssh-keys`` with a key pair
   generated for this node (``tpu_vm/ssh_keys.py``).
2. ``check_provision`` (cheap, called by the trigger): READY yet? FAILED, stockout, past
   valid-until or the provision timeout -> an infrastructure failure.
3. ``finish_provision``: the workers' IPs from ``describe``, then each worker is prepared over
   SSH (work dir, include dir, the supervisor) with ``DirectSshBackend``.

Anything that fails half way is deleted before the error propagates (Airflow skips the
teardown of a failed setup task). ``provision`` runs the three steps in-line (CLI, tests).

Execution goes over SSH to every worker of the slice: setup and the workload run on all of
them (a JAX/PyTorch-XLA program on a multi-host slice must start on every host), the log of
worker 0 streams into the task log, artifacts come from worker 0 and each worker's own log is
kept as ``workers/<i>/output.log``. A worker that fails stops the others (a collective with a
dead peer would hang until the timeout). While the workload runs, ``poll`` looks at the node
every ``node_check_seconds``: a PREEMPTED node is an infrastructure failure (retried on a
fresh node), never a test failure.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from accelmatrix.backends import tpu_names
from accelmatrix.backends.base import (
    Backend,
    CellContext,
    InfrastructureError,
    JobStatus,
    LogFn,
    ManagedResource,
    ProvisionCheck,
)
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.tpu_vm import ssh_keys
from accelmatrix.backends.tpu_vm.inventory import (
    IDENTITY_METADATA,
    READY,
    TpuInventory,
    created_at_of,
)
from accelmatrix.backends.tpu_vm.node_record import cell_context, node_resource
from accelmatrix.backends.tpu_vm.workers import TpuWorkers, worker_artifacts_dir
from accelmatrix.contracts.machine_records import (
    CellRecord,
    PendingProvision,
    SshResource,
    TpuVmHandle,
    TpuVmResource,
)
from accelmatrix.hooks.ssh import DirectTarget, forget_direct_hosts
from accelmatrix.hooks.tpu import (
    TpuAlreadyExists,
    TpuError,
    TpuUnreachable,
    TpuVmHook,
    queued_resource_error,
    queued_resource_state,
)

log = logging.getLogger(__name__)

# Node states from which a node never becomes READY by itself.
DEAD_NODE_STATES = ("PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN")
QR_DEAD_STATES = ("FAILED", "SUSPENDING", "SUSPENDED", "DELETING")
QR_GRACE_SECONDS = 120  # after valid-until, how long we still wait for the service to say so
SSH_READY_SECONDS = 300  # a READY node's sshd and guest agent may need a moment


class TpuVmBackend(Backend):
    kind = "tpu-vm"

    machine: TpuVmMachine

    def __init__(
        self,
        machine: TpuVmMachine,
        *,
        hook: TpuVmHook | None = None,
        poll_interval: float = 15.0,
    ) -> None:
        super().__init__(machine)
        self.hook = hook or TpuVmHook(
            gcp_conn_id=self.machine.gcp_conn_id, project_id=self.machine.project
        )
        self.poll_interval = poll_interval
        self.workers = TpuWorkers(self.machine, self.kind, self.hook)

    # -- naming ------------------------------------------------------------------------------
    @staticmethod
    def name_for(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id)

    def node_metadata(self, name: str, ctx: CellContext | None = None) -> dict[str, str]:
        """VM metadata of a new node: the suite's, the node's own login key and the exact
        (dag, run, cell) it belongs to: labels only hold a lossy, lowercased form of them,
        and the janitor needs the real ids to ask Airflow about the owning run."""
        _, public = ssh_keys.ensure_key(name, comment=f"accelmatrix-{name}")
        meta = {**self.machine.metadata, "ssh-keys": f"{self.machine.ssh_user}:{public}"}
        if ctx is not None:
            meta[IDENTITY_METADATA] = json.dumps(
                {"dag_id": ctx.dag_id, "run_id": ctx.run_id, "cell_id": ctx.cell_id},
                separators=(",", ":"),
            )
        return meta

    # -- provisioning ------------------------------------------------------------------------
    def provision(self, ctx: CellContext) -> TpuVmResource:
        """All three provisioning steps in-line (the DAG defers between them instead)."""
        record = self.begin_provision(ctx)
        while isinstance(record, PendingProvision):
            check = self.check_provision(record)
            if check.failed:
                self.abandon_provision(record, check.failed)
                raise InfrastructureError(check.failed)
            if check.ready:
                return self.finish_provision(record)
            time.sleep(self.poll_interval)
        return record

    def begin_provision(self, ctx: CellContext) -> TpuVmResource | PendingProvision:
        m = self.machine
        name, zone = self.name_for(ctx), m.zone
        now = time.time()
        labels = tpu_names.managed_labels(
            ctx.dag_id, ctx.run_id, ctx.cell_id, now + ctx.ttl_seconds, ctx.labels
        )
        queued = m.capacity == "queued"
        pending = PendingProvision(
            backend=self.kind,
            name=name,
            zone=zone,
            queued=queued,
            labels=labels,
            started_at=now,
            deadline=now + m.provision_timeout_seconds,
            ctx=CellRecord(
                dag_id=ctx.dag_id,
                run_id=ctx.run_id,
                cell_id=ctx.cell_id,
                artifacts_dir=str(ctx.artifacts_dir),
                ttl_seconds=ctx.ttl_seconds,
            ),
        )
        made: set[str] = set()  # what this call created: undone if it fails
        with self.hook.authorized():
            try:
                node = self.hook.get_node(name, zone)
                if node is not None and node.get("state") in DEAD_NODE_STATES:
                    made.update(("node", "queued resource") if queued else ("node",))
                    raise InfrastructureError(
                        f"TPU node {name} found in state {node.get('state')}; deleting it so a "
                        "retry starts fresh"
                    )
                if node is not None and node.get("state") == READY:
                    return self.finish_provision(pending)
                if node is None and queued:
                    made.add("queued resource")
                    qr = self._create_queued(name, zone, labels, ctx)
                    if qr is None:
                        made.discard("queued resource")  # a retry: the request exists
                        qr = self.hook.describe_queued_resource(name, zone)
                    pending.deadline = (
                        (created_at_of(qr, now) or now)
                        + int(m.valid_until_seconds or 0)
                        + QR_GRACE_SECONDS
                        + m.provision_timeout_seconds
                    )
                elif node is None:
                    made.add("node")
                    self._create_node(name, zone, labels, ctx)
            except BaseException as exc:
                self._undo(name, zone, made, exc)
                if made:
                    ssh_keys.remove_key(name)
                raise
        log.info("TPU %s in %s requested; waiting for it (deferred)", name, zone)
        return pending

    def _create_node(
        self, name: str, zone: str, labels: dict[str, str], ctx: CellContext | None = None
    ) -> None:
        m = self.machine
        try:
            self.hook.create_node(
                name,
                zone,
                m.accelerator_type,
                m.runtime_version,
                labels=labels,
                spot=m.capacity == "spot",
                preemptible=m.capacity == "preemptible",
                reserved=m.capacity == "reserved",
                metadata=self.node_metadata(name, ctx),
                network=m.network,
                subnetwork=m.subnetwork,
                internal_ips=m.internal_ips,
                wait=False,
                timeout=300,
            )
        except TpuAlreadyExists:  # a concurrent attempt won the race: wait for its node
            pass

    def _create_queued(
        self, name: str, zone: str, labels: dict[str, str], ctx: CellContext | None = None
    ) -> dict | None:
        """The new queued resource, or None if it already existed (a retry)."""
        m = self.machine
        try:
            return self.hook.create_queued_resource(
                name,
                zone,
                m.accelerator_type,
                m.runtime_version,
                node_id=name,
                labels=labels,
                metadata=self.node_metadata(name, ctx),
                valid_until_duration=int(m.valid_until_seconds or 0),
                network=m.network,
                subnetwork=m.subnetwork,
                internal_ips=m.internal_ips,
            )
        except TpuAlreadyExists:
            return None

    def check_provision(self, pending: PendingProvision) -> ProvisionCheck:
        """One look at the node (or its queued resource); never blocks on capacity."""
        name, zone = pending.name, pending.zone
        late = time.time() > pending.deadline
        with self.hook.authorized():
            if pending.queued:
                qr = self.hook.get_queued_resource(name, zone)
                if qr is None:
                    return ProvisionCheck(failed=f"queued resource {name} in {zone} vanished")
                state = queued_resource_state(qr)
                if state in QR_DEAD_STATES:
                    reason = queued_resource_error(qr) or "no reason given"
                    return ProvisionCheck(
                        failed=f"queued resource {name} in {zone} is {state}: {reason}"
                    )
                if state != "ACTIVE":
                    if late:
                        return ProvisionCheck(
                            failed=f"queued resource {name} in {zone} still {state} after its "
                            f"valid-until duration ({self.machine.valid_until_seconds} s)"
                        )
                    return ProvisionCheck(detail=f"queued resource {state}")
            node = self.hook.get_node(name, zone)
        state = (node or {}).get("state")
        if node is None:
            return ProvisionCheck(
                failed=f"TPU node {name} in {zone} vanished while being created (no "
                "capacity in the zone, or deleted by someone else)"
            )
        if state == READY:
            return ProvisionCheck(ready=True, detail=READY)
        if state in DEAD_NODE_STATES:
            return ProvisionCheck(failed=f"TPU node {name} in {zone} became {state}")
        if late:
            return ProvisionCheck(
                failed=f"TPU node {name} in {zone} not READY after "
                f"{self.machine.provision_timeout_seconds} s (state {state})"
            )
        return ProvisionCheck(detail=f"node {state}")

    def finish_provision(self, pending: PendingProvision) -> TpuVmResource:
        """The READY node as a resource, every worker prepared over SSH.

        A failure here (a worker unreachable) deletes the node: no teardown follows a failed
        provision.
        """
        name, zone = pending.name, pending.zone
        ctx = cell_context(pending.ctx)
        try:
            with self.hook.authorized():
                node = self.hook.describe_node(name, zone)
            if node.get("state") != READY:
                raise InfrastructureError(f"TPU node {name} in {zone} is {node.get('state')}")
            resource = node_resource(self.kind, self.machine, name, zone, node, pending)
            resource.worker_resources = self._prepare_workers(resource, ctx)
            return resource
        except BaseException as exc:
            self.abandon_provision(pending, str(exc))
            raise

    def resource_problem(self, resource: TpuVmResource) -> str | None:
        with self.hook.authorized():
            node = self.hook.get_node(resource.name, resource.zone or self.machine.zone)
        if node is None:
            return f"TPU node {resource.name} no longer exists"
        if node.get("state") != READY:
            return f"TPU node {resource.name} is {node.get('state')}"
        return None

    def refresh(self, resource: TpuVmResource) -> TpuVmResource:
        """The node as it is now: a retry may have replaced it (same name, new addresses)."""
        zone = resource.zone or self.machine.zone
        with self.hook.authorized():
            node = self.hook.get_node(resource.name, zone)
        if node is None or node.get("state") != READY or resource.ctx is None:
            return resource
        pending = PendingProvision(
            backend=self.kind,
            name=resource.name,
            zone=zone,
            queued=bool(resource.queued_resource),
            labels=resource.labels,
            started_at=resource.created_at or time.time(),
            deadline=0.0,
            ctx=resource.ctx,
        )
        fresh = node_resource(self.kind, self.machine, resource.name, zone, node, pending)
        if fresh.hosts == resource.hosts and created_at_of(node, None) == resource.created_at:
            return resource  # the very node provision returned
        fresh.worker_resources = self._prepare_workers(fresh, cell_context(resource.ctx))
        return fresh

    def abandon_provision(self, pending: PendingProvision, reason: str) -> None:
        """Delete whatever exists under the cell's name (it is ours and unusable) and its key."""
        name, zone = pending.name, pending.zone
        log.warning("giving up on TPU %s: %s", name, reason)
        error = InfrastructureError(reason)
        with self.hook.authorized():
            made = {"node", "queued resource"} if pending.queued else {"node"}
            self._undo(name, zone, made, error)
        ssh_keys.remove_key(name)
        for note in getattr(error, "__notes__", []):
            log.error("%s", note)

    def _prepare_workers(self, resource: TpuVmResource, ctx: CellContext) -> list[SshResource]:
        """Work dir, include dir and supervisor on every worker, in parallel."""
        key = str(ssh_keys.key_path(resource.name))
        n = len(resource.workers)

        def prepare(i: int) -> SshResource:
            w = resource.workers[i]
            target = DirectTarget(
                host=w.host or "",
                port=self.machine.ssh_port,
                user=self.machine.ssh_user,
                key_path=key,
            )
            backend = self.workers.backend_for(target)
            worker_ctx = CellContext(
                dag_id=ctx.dag_id,
                run_id=ctx.run_id,
                # Distinct dirs per worker: on a real slice each worker is its own host; on
                # a loopback test they share one.
                cell_id=ctx.cell_id if n == 1 else f"{ctx.cell_id}.worker{i}",
                artifacts_dir=worker_artifacts_dir(ctx.artifacts_dir, i),
                ttl_seconds=ctx.ttl_seconds,
                labels={"tpu-node": resource.name, "worker": str(i)},
            )
            deadline = time.monotonic() + SSH_READY_SECONDS
            while True:
                try:
                    return backend.provision(worker_ctx)
                except (OSError, EOFError, ConnectionError) as e:
                    if time.monotonic() > deadline:
                        raise InfrastructureError(
                            f"TPU worker {i} ({w.host}) of {resource.name} not reachable "
                            f"over SSH for {SSH_READY_SECONDS} s: {e}"
                        ) from e
                    time.sleep(min(10.0, max(1.0, self.poll_interval)))

        with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
            return list(pool.map(prepare, range(n)))

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

    # -- execution on the workers (TpuWorkers) and the janitor's listing ---------------------
    def variables(self, resource: TpuVmResource) -> dict[str, str]:
        return self.workers.variables(resource)

    def setup(
        self,
        resource: TpuVmResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        self.workers.setup(resource, commands, env, timeout, log)

    def submit(self, resource: TpuVmResource, argv: list[str], env: dict[str, str]) -> TpuVmHandle:
        return self.workers.submit(resource, argv, env)

    def poll(self, handle: TpuVmHandle) -> JobStatus:
        return self.workers.poll(handle)

    def read_logs(self, handle: TpuVmHandle, offset: int) -> tuple[list[str], int]:
        return self.workers.read_logs(handle, offset)

    def cancel(self, handle: TpuVmHandle) -> None:
        self.workers.cancel(handle)

    def collect(self, resource: TpuVmResource, globs: list[str], dest: Path) -> list[str]:
        return self.workers.collect(resource, globs, dest)

    def list_managed(self) -> list[ManagedResource]:
        return TpuInventory(self.machine, self.kind, self.hook).list_managed()

    def teardown(self, resource: TpuVmResource) -> None:
        name = resource.name
        zone = resource.zone or self.machine.zone
        with self.hook.authorized():
            node = self.hook.get_node(name, zone)
            if node is not None and node.get("state") == READY:
                # Stop the workload and keep the logs before the node goes; deleting the node
                # alone would do on a real slice, but this also frees a shared test host.
                for i, (b, r) in enumerate(self.workers.of(resource.worker_resources)):
                    try:
                        b.teardown(r)
                    except Exception as e:  # releasing the TPU matters more than its logs
                        log.warning("worker %d of %s: %s", i, name, e)
            qr = resource.queued_resource
            deleted = False
            if qr or self.machine.capacity == "queued":
                # --force also deletes the node; without a queued resource, delete the node.
                deleted = self.hook.delete_queued_resource(qr or name, zone, force=True)
            if not deleted and node is not None:
                self.hook.delete_node(name, zone)
        ssh_keys.remove_key(name)
        forget_direct_hosts(str(ssh_keys.key_path(name)))

    def unreachable(self, error: BaseException) -> bool:
        return isinstance(error, TpuUnreachable)


__all__ = ["TpuVmBackend", "TpuError"]
