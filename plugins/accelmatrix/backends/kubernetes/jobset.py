"""KubernetesJobSetBackend: a multi-node cell as one JobSet (jobset.x-k8s.io/v1alpha2).

It is the ``k8s-job`` backend for everything a cell does before and after its workload
(provision checks, the setup Job, the artifacts volume, teardown of the setup Job) and
differs where a group of pods differs from one:

* **submit** creates the JobSet of ``jobset_manifest.JobSetManifest`` (name from the cell
  identity, short enough that every pod hostname is a DNS label). 409 reattaches, except to a JobSet that
  already ended for infrastructure reasons (then it is replaced, as a retry should).
* **poll** reads the JobSet, its pods and (with Kueue) its Workload; ``jobset_verdict``
  decides:
  suspended and never admitted = a capacity wait, an infrastructure failure after
  ``kueue.admission_timeout_seconds``; evicted or preempted by Kueue = an infrastructure
  failure; a pod Pending past ``scheduling_timeout_seconds`` = an infrastructure failure
  with the scheduler's reason; a JobSet failed by a workload exit = a test failure named by
  the *first* pod that failed (pod, exit code, its last log lines); a JobSet that used up
  its restarts on disruptions = an infrastructure failure.
* **read_logs** follows the leader (pod 0 of job 0) of the current restart attempt, from
  its log spool (``logs``: every pod's log is followed and appended to
  ``pods/<pod>.log`` as it is written, whole across kubelet rotations); after a restart it
  starts again at the new leader's first line.
* **collect** saves every pod's log (``pods/<pod>.log``), the leader's as ``output.log``,
  ``status.json`` with every pod's state, and the group's timing (seconds from the JobSet's
  start until all pods ran, and the spread of the pods' start times, i.e. how long the
  leader waited at the rendezvous) as ``runner.all_pods_running_s`` and
  ``runner.rendezvous_s`` metrics, which checks can bound (HyperPod's success indicators).
* **teardown/cancel** delete the JobSet with Foreground propagation (child Jobs, pods and
  the headless Service go with it), then any pod still labelled with the cell.

The pieces are the package's objects: ``JobSetManifest`` (its ``group_manifest``, which a
kind with other pods replaces), ``JobApi``, ``JobSetReader`` with ``jobset_verdict``,
``JobSetArtifacts`` and ``JobSetInventory``; what a JobSet cell shares with a Job cell
(provision checks, the setup Job, the artifacts volume) is ``KubernetesJobBackend``'s, its
only base.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from accelmatrix.backends import tpu_names
from accelmatrix.backends.base import (
    BackendError,
    CellContext,
    InfrastructureError,
    JobStatus,
    ManagedResource,
)
from accelmatrix.backends.kubernetes import jobset_verdict as verdict
from accelmatrix.backends.kubernetes.job import ROTATED, KubernetesJobBackend, rotate
from accelmatrix.backends.kubernetes.job_manifest import KIND_LABEL
from accelmatrix.backends.kubernetes.jobset_artifacts import JobSetArtifacts
from accelmatrix.backends.kubernetes.jobset_inventory import JobSetInventory
from accelmatrix.backends.kubernetes.jobset_manifest import JobSetManifest
from accelmatrix.backends.kubernetes.jobset_reader import JobSetReader
from accelmatrix.backends.kubernetes.pod_logs import PodLogs, log_forbidden
from accelmatrix.backends.kubernetes.unreachable import infra, is_unreachable, polled
from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine
from accelmatrix.contracts.machine_records import K8sHandle, K8sResource
from accelmatrix.hooks import jobset as jobset_api
from accelmatrix.hooks.k8s import KubeClients, api_message
from accelmatrix.metrics.resource_samples import FILE as RUNNER_FILE

logger = logging.getLogger(__name__)

OFFSET_BITS = 40  # read_logs: byte offsets below, the restart attempt above (see there)
SPOOL_SECONDS = 10.0  # how often poll saves every pod's log while the group runs
_spooled: dict[str, float] = {}
_spool_lock = threading.Lock()


class KubernetesJobSetBackend(KubernetesJobBackend):
    kind = "k8s-jobset"
    machine: KubernetesJobSetMachine

    def __init__(self, machine: KubernetesJobSetMachine):
        super().__init__(machine)
        self.group_manifest = self.group_manifest_for(self.machine)

    @staticmethod
    def group_manifest_for(machine: Any) -> JobSetManifest:
        """The JobSet manifest builder of this kind's machines (GKE TPU has its own)."""
        return JobSetManifest(machine)

    # -- names and provision ---------------------------------------------------------------
    def queue_wait_limit(self) -> float:
        kueue = self.machine.kueue
        return float(kueue.admission_timeout_seconds) if kueue else 0.0

    def jobset_name(self, ctx: CellContext) -> str:
        budget = self.machine.name_budget()
        return tpu_names.node_name(
            ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="amj", max_len=budget
        )

    def provision(self, ctx: CellContext) -> K8sResource:
        from kubernetes.client.exceptions import ApiException

        record = super().provision(ctx)
        clients = self.clients(record)
        ns = record.namespace
        try:
            jobset_api.list_jobsets(clients, ns)
        except ApiException as e:
            if e.status == 404:
                raise BackendError(
                    f"the cluster of connection {clients.conn_id!r} serves no JobSet API "
                    "(jobset.x-k8s.io/v1alpha2): install the JobSet controller, or use "
                    "backend k8s-job"
                ) from None
            if e.status in (401, 403):
                raise BackendError(
                    f"connection {clients.conn_id!r} cannot list JobSets in namespace {ns!r}: "
                    f"{e.status} {api_message(e)} (grant jobsets.jobset.x-k8s.io get, list, "
                    "create, delete; see docs/backends-kubernetes.md)"
                ) from None
            raise InfrastructureError(f"Kubernetes API error: {e.status} {api_message(e)}") from e
        name = self.jobset_name(ctx)
        record.job_name, record.name, record.backend = name, f"{ns}/{name}", self.kind
        # Marks the JobSet, its child Jobs, pods and the setup Job as this kind's (janitor).
        record.labels[KIND_LABEL] = self.kind
        return record

    # -- the JobSet --------------------------------------------------------------------------
    def workload_jobset(
        self, resource: K8sResource, argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The JobSet manifest submit creates (public: tests and docs render it)."""
        return self.group_manifest.workload_jobset(resource, argv, env)

    def submit(self, resource: K8sResource, argv: list[str], env: dict[str, str]) -> K8sHandle:
        clients = self.clients(resource)
        ns, name = resource.namespace, resource.job_name
        body = self.workload_jobset(resource, argv, env)
        kueue = self.machine.kueue
        handle = K8sHandle(
            backend=self.kind,
            kubernetes_conn_id=resource.kubernetes_conn_id,
            namespace=ns,
            job_name=name,
            artifacts_dir=resource.artifacts_dir,
            scheduling_timeout=float(self.machine.scheduling_timeout_seconds),
            creating_timeout=float(self.machine.container_creating_timeout_seconds),
            admission_timeout=float(kueue.admission_timeout_seconds) if kueue else None,
            queue=kueue.queue_name if kueue else None,
            nodes=self.machine.num_nodes * self.machine.replicas,
        )
        reader = JobSetReader(clients, ns)
        js, reattached = self.api(clients, ns).create_or_reattach_jobset(
            body,
            lambda old: reader.judge(
                handle.model_copy(update={"uid": old["metadata"]["uid"]}), old
            ),
        )
        if not reattached:  # a previous attempt's output is kept beside the new one
            rotate(Path(resource.artifacts_dir), (*ROTATED, RUNNER_FILE))
        handle.uid, handle.reattached = js["metadata"]["uid"], reattached
        return handle

    def poll(self, handle: K8sHandle) -> JobStatus:
        key = f"{handle.namespace}/{handle.job_name}"
        clients = self.clients(handle)
        ns, name = handle.namespace, handle.job_name

        def look() -> JobStatus:
            js = self.api(clients, ns).read_jobset(name)
            if js is None:
                return infra(
                    f"JobSet {key} disappeared (deleted outside accelmatrix, or its "
                    "ttlSecondsAfterFinished passed)"
                )
            status = JobSetReader(clients, ns).judge(handle, js)
            now = time.monotonic()
            with _spool_lock:
                due = now - _spooled.get(key, 0.0) >= SPOOL_SECONDS
                if due or status.done:
                    _spooled[key] = now
            artifacts = JobSetArtifacts(clients, ns)
            if due and not status.done:
                # Pods the cluster deletes (a restart, a failed group's peers) take their
                # logs with them: keep a recent copy of every pod's log meanwhile.
                artifacts.snapshot(name, handle.artifacts_dir, js, None)
            if status.done:
                artifacts.snapshot(name, handle.artifacts_dir, js, status)
            return status

        return polled(key, look)

    def read_logs(self, handle: K8sHandle, offset: int) -> tuple[list[str], int]:
        clients = self.clients(handle)
        ns = handle.namespace
        try:
            leader = verdict.leader(JobSetReader(clients, ns).pods(handle.job_name))
            if leader is None:
                return [], offset
            spool = PodLogs(clients, ns).spool(leader, Path(handle.artifacts_dir))
            if err := spool.error():
                raise log_forbidden(ns, leader.metadata.name, err)
        except BackendError:  # a missing permission: say so, no retry will fix it
            raise
        except Exception as e:  # the next call retries; poll decides about failures
            logger.warning("cannot read the log of %s: %s", handle.job_name, e)
            return [], offset
        # Offsets are opaque to callers (passed back untouched): the bits above OFFSET_BITS
        # carry the restart attempt the byte offset belongs to, so a new leader after a
        # restart is read from its first byte, not from the old leader's offset.
        attempt = verdict.attempt(leader.metadata.labels)
        seen_attempt, pos = divmod(offset, 1 << OFFSET_BITS)
        header: list[str] = []
        if attempt != seen_attempt:
            header = [f"--- leader pod {leader.metadata.name} (restart {attempt}) ---"]
            pos = 0
        base = attempt << OFFSET_BITS
        lines, pos = spool.read(pos)
        return header + lines, base + pos

    def cancel(self, handle: K8sHandle) -> None:
        clients = self.clients(handle)
        ns, name = handle.namespace, handle.job_name
        try:
            JobSetArtifacts(clients, ns).snapshot(name, handle.artifacts_dir)
        except Exception as e:  # stopping the workload matters more than its log
            logger.warning("could not save the logs of %s/%s before cancelling: %s", ns, name, e)
        api = self.api(clients, ns)
        api.delete_jobset(name)
        api.delete_pods(name)

    def save_outputs(self, clients: KubeClients, resource: K8sResource) -> None:
        """The group's snapshot (every pod's log, status.json, timing)."""
        JobSetArtifacts(clients, resource.namespace).snapshot(
            resource.job_name, resource.artifacts_dir
        )

    # -- teardown ------------------------------------------------------------------------------
    def teardown(self, resource: K8sResource) -> None:
        clients = self.clients(resource)
        ns, name = resource.namespace, resource.job_name
        self.save_outputs_unless_saved(clients, resource)
        api = self.api(clients, ns)
        errors: list[Exception] = []
        for step in (
            lambda: api.delete_jobset(name),
            lambda: api.delete_job(resource.setup_job_name),
            lambda: api.delete_pods(name),
        ):
            try:
                step()
            except Exception as e:  # delete what we may; report the rest
                errors.append(e)
        self.remove_local_work_dir(resource)
        if unanswered := [e for e in errors if is_unreachable(e)]:
            raise unanswered[0]  # as it is: the teardown step waits out an unreachable API
        if errors:
            said = [
                f"{e.status} {api_message(e)}" if hasattr(e, "status") else str(e) for e in errors
            ]
            raise BackendError(f"teardown of {resource.name} incomplete: " + "; ".join(said))

    def list_managed(self) -> list[ManagedResource]:
        clients = self.clients()
        return JobSetInventory(clients, self.namespace(clients), self.kind).list_managed()
