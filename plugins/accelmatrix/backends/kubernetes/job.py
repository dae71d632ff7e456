"""KubernetesJobBackend: each cell is a batch/v1 Job on a Kubernetes cluster (GKE or any).

Everything goes through the cncf-kubernetes provider's ``KubernetesHook`` clients (see
``accelmatrix.hooks.k8s``); nothing here speaks HTTP itself.

How the contract maps onto Kubernetes, and why:

* **provision** is light: it checks that the connection can list Jobs in the namespace
  (a missing RBAC grant fails here, clearly, not at submit) and returns a record naming the
  cell's Job. The Job *is* the machine and the workload at once, so it is created by submit.
* **Names** are deterministic from (dag, run, cell) (``tpu_names.node_name``: DNS-1123,
  <= 63 characters, hash suffix): a retried submit gets 409 AlreadyExists and reattaches to
  the Job its previous attempt created instead of starting a second one. An existing Job that
  failed for infrastructure reasons (image pull, unschedulable, eviction) is deleted and
  created afresh, since that is what a retry is for.
* **setup** runs the setup commands in a short *setup Job* on the same pod template (image,
  node selector, resources, volume): one init container per command and the last command as
  the main container, so they run in order and stop at the first failure, each with its own
  log, without a shell. Init containers of the workload's own Job would share its pod, but
  the contract calls setup() as its own step, before submit, with its own timeout and a
  setup failure of its own; a separate Job keeps that. The cost, stated plainly: setup and
  workload are two pods, so only what setup writes under the work dir survives into the run,
  and only when the machine has an ``artifacts_volume`` (a PVC). Without one, setup is a
  preflight check (drivers, data reachable) and installs belong in the image.
* **submit** creates the Job: ``command`` is the workload argv as a list (never ``sh -c``),
  env from the suite, ``backoffLimit: 0`` (Airflow, not Kubernetes, decides about retries),
  ``ttlSecondsAfterFinished`` and ``activeDeadlineSeconds`` as backstops for a dead
  triggerer (the workload timeout itself is enforced by the run step, which deletes the
  Job). GPUs are extended-resource limits (``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``)
  with a toleration for the ``nvidia.com/gpu`` taint GKE puts on GPU nodes and the
  ``cloud.google.com/gke-accelerator`` node selector; a CPU-only cell gets
  ``CUDA_VISIBLE_DEVICES=-1``. ``num_nodes`` > 1 is an Indexed Job (completions =
  parallelism = N, ``JOB_COMPLETION_INDEX`` in every pod); logs and the exit code come from
  index 0, and any index failing fails the cell.
* **poll** reads the Job and its pods (two GETs). Infrastructure failures, reported as such
  so the run step may retry them and nobody blames the test: pod Pending past
  ``scheduling_timeout_seconds`` (with the scheduler's reason from the PodScheduled
  condition), image pull errors (naming the image), container config errors, eviction, and
  a Job or pod that disappeared without an exit code. A container's non-zero exit code is a
  test failure.
* **read_logs** returns what lies after the byte offset in the index-0 pod's *spool*: each
  pod's log is followed (one ``follow=true`` stream per container, ``logs``) and
  appended to ``pods/<pod>.log`` in the artifacts as it is written, so a log the kubelet
  rotates (10 MiB) stays whole and a read costs O(new bytes).
* **collect** writes ``output.log`` (index-0 pod's spool) and ``status.json`` (from the
  container's terminated state) into the artifacts dir, exactly what evaluation reads for a
  local cell; poll does the same as soon as the workload ends, because evaluation may run
  before teardown when the run failed. Artifact globs are copied from the cell's work dir
  on the ``artifacts_volume`` PVC as the Airflow worker sees it (``local_path``): exec/cp into
  a finished pod is impossible (its containers are gone), and shipping files through the
  log would corrupt it. Without a volume, collect copies no files and says so.
* **teardown** deletes the Job with ``propagationPolicy: Background`` (the API's default
  for Jobs orphans the pods), the setup Job, then any pod still labelled with the cell's
  Job (orphans), and tolerates 404 everywhere.
* **list_managed** lists Jobs labelled ``managed-by=accelmatrix`` in the namespace.

This module holds the cell's lifecycle and wires the package's pieces together, one object
each, built per call from the cell's clients: ``JobManifest`` (the Job bodies), ``JobApi``
(creating and deleting), ``JobPods`` (the verdict), ``PodLogs`` (the spools),
``job_artifacts`` (output.log, status.json), ``SetupJob`` and ``JobInventory``.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.backends import tpu_names
from accelmatrix.backends.base import (
    Backend,
    BackendError,
    CellContext,
    InfrastructureError,
    JobStatus,
    LogFn,
    ManagedResource,
)
from accelmatrix.backends.kubernetes import job_artifacts
from accelmatrix.backends.kubernetes.job_api import JobApi
from accelmatrix.backends.kubernetes.job_inventory import JobInventory
from accelmatrix.backends.kubernetes.job_manifest import CONTAINER, JobManifest
from accelmatrix.backends.kubernetes.job_pods import JobPods
from accelmatrix.backends.kubernetes.job_setup import SetupJob
from accelmatrix.backends.kubernetes.pod_logs import PodLogs
from accelmatrix.backends.kubernetes.unreachable import infra, is_unreachable, polled
from accelmatrix.backends.local.collect import collect_globs
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.contracts.machine_records import K8sHandle, K8sResource
from accelmatrix.hooks.k8s import KubeClients, api_message, get_clients

logger = logging.getLogger(__name__)

__all__ = ["CONTAINER", "ROTATED", "KubernetesJobBackend", "label_value"]

ROTATED = ("output.log", "status.json")


def label_value(text: str) -> str:
    """A valid Kubernetes label value (the Google-label form, trimmed to alphanumeric ends)."""
    return tpu_names.label_value(text).strip("-_.")


class KubernetesJobBackend(Backend):
    kind = "k8s-job"
    machine: KubernetesJobMachine

    def __init__(self, machine: KubernetesJobMachine):
        super().__init__(machine)
        # The Job bodies: the workload Job here, the setup Job of every Kubernetes kind.
        self.manifest = JobManifest(self.machine)

    # -- clients and names -----------------------------------------------------------------
    def clients(self, record: K8sResource | K8sHandle | None = None) -> KubeClients:
        """The cluster's clients; a record or handle names its own connection (the machine
        spec may have been edited since the cell started)."""
        conn_id = (record.kubernetes_conn_id if record else None) or self.machine.kubernetes_conn_id
        return get_clients(conn_id)

    def namespace(self, clients: KubeClients) -> str:
        """The machine's namespace, else the connection's."""
        return self.machine.namespace or clients.namespace

    def api(self, clients: KubeClients, ns: str) -> JobApi:
        """Creating and deleting the cell's objects (cheap: one per call, no state)."""
        return JobApi(clients, ns)

    def pods(self, clients: KubeClients, ns: str) -> JobPods:
        """The verdict on a Job from its pods, with this machine's ContainerCreating limit."""
        return JobPods(clients, ns, float(self.machine.container_creating_timeout_seconds))

    @staticmethod
    def job_name(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="am")

    @staticmethod
    def setup_job_name(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="ams")

    # -- provision -------------------------------------------------------------------------
    def provision(self, ctx: CellContext) -> K8sResource:
        from kubernetes.client.exceptions import ApiException

        clients = self.clients()
        ns = self.namespace(clients)
        try:
            clients.batch.list_namespaced_job(ns, limit=1)
        except ApiException as e:
            if e.status in (401, 403, 404):
                raise BackendError(
                    f"connection {clients.conn_id!r} cannot list Jobs in namespace {ns!r}: "
                    f"{e.status} {api_message(e)} (check the namespace and the RBAC of the "
                    "connection's identity)"
                ) from None
            raise InfrastructureError(f"Kubernetes API error: {e.status} {api_message(e)}") from e
        except Exception as e:  # connection refused, DNS, TLS: the cluster, not the test
            raise InfrastructureError(f"cannot reach the Kubernetes API: {e}") from e
        now = time.time()
        labels = {
            k: label_value(v) if k != "ttl" else v
            for k, v in tpu_names.managed_labels(
                ctx.dag_id, ctx.run_id, ctx.cell_id, now + ctx.ttl_seconds, ctx.labels
            ).items()
        }
        subpath = "/".join(settings.safe_name(p) for p in (ctx.dag_id, ctx.run_id, ctx.cell_id))
        local_work_dir = None
        if self.machine.artifacts_volume:
            local = Path(self.machine.artifacts_volume.local_path) / subpath
            created = not local.exists()
            local.mkdir(parents=True, exist_ok=True)
            local_work_dir = str(local)
        try:
            ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
        except BaseException:
            # No teardown follows a failed provision: undo the work dir made above.
            if local_work_dir and created:
                shutil.rmtree(local_work_dir, ignore_errors=True)
            raise
        job = self.job_name(ctx)
        return K8sResource(
            backend=self.kind,
            name=f"{ns}/{job}",
            kubernetes_conn_id=clients.conn_id,
            namespace=ns,
            job_name=job,
            setup_job_name=self.setup_job_name(ctx),
            artifacts_dir=str(ctx.artifacts_dir),
            work_subpath=subpath,
            local_work_dir=local_work_dir,
            created_at=now,
            # The API refuses a deadline below 1 s (422): an already expired TTL gets 1 s.
            active_deadline_seconds=max(1, self.machine.active_deadline_seconds or ctx.ttl_seconds),
            labels=labels,
            annotations={
                "accelmatrix.io/dag-id": ctx.dag_id,
                "accelmatrix.io/run-id": ctx.run_id,
                "accelmatrix.io/cell-id": ctx.cell_id,
            },
        )

    def variables(self, resource: K8sResource) -> dict[str, str]:
        return {
            "work_dir": self.machine.work_dir,
            "include_dir": self.machine.include_dir,
            "python": self.machine.python,
        }

    def setup(
        self,
        resource: K8sResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        clients = self.clients(resource)
        ns = resource.namespace
        SetupJob(
            self.manifest,
            self.api(clients, ns),
            self.pods(clients, ns),
            PodLogs(clients, ns),
            float(self.machine.scheduling_timeout_seconds),
        ).run(resource, commands, env, timeout, log)

    # -- run -------------------------------------------------------------------------------
    def workload_job(
        self, resource: K8sResource, argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The Job manifest submit creates (public: tests and docs render it)."""
        return self.manifest.workload_job(resource, argv, env)

    def submit(self, resource: K8sResource, argv: list[str], env: dict[str, str]) -> K8sHandle:
        clients = self.clients(resource)
        ns = resource.namespace
        body = self.workload_job(resource, argv, env)
        timeout_s = float(self.machine.scheduling_timeout_seconds)
        art = Path(resource.artifacts_dir)
        pods = self.pods(clients, ns)
        job, reattached = self.api(clients, ns).create_or_reattach(
            body, lambda j: pods.inspect(j, timeout_s)[0]
        )
        if not reattached:  # a previous attempt's output is kept beside the new one
            rotate(art, ROTATED)
        return K8sHandle(
            backend=self.kind,
            kubernetes_conn_id=resource.kubernetes_conn_id,
            namespace=ns,
            job_name=resource.job_name,
            uid=job.metadata.uid,
            artifacts_dir=resource.artifacts_dir,
            scheduling_timeout=timeout_s,
            reattached=reattached,
        )

    def poll(self, handle: K8sHandle) -> JobStatus:
        key = f"{handle.namespace}/{handle.job_name}"
        clients = self.clients(handle)
        ns, art = handle.namespace, Path(handle.artifacts_dir)

        def look() -> JobStatus:
            job = self.api(clients, ns).read_job(handle.job_name)
            if job is None:
                return infra(
                    f"Job {key} disappeared (deleted outside accelmatrix, or its "
                    "ttlSecondsAfterFinished passed)"
                )
            status, pods = self.pods(clients, ns).inspect(job, float(handle.scheduling_timeout))
            logs = PodLogs(clients, ns)
            for pod in pods:  # every pod's log is followed while it runs (logs.ensure)
                logs.spool(pod, art)
            if status.done:
                job_artifacts.snapshot(logs, pods, art)
            return status

        return polled(key, look)

    def read_logs(self, handle: K8sHandle, offset: int) -> tuple[list[str], int]:
        clients = self.clients(handle)
        ns = handle.namespace
        try:
            pod = self.pods(clients, ns).pod0(handle.uid)
            if pod is None:
                return [], offset
            spool = PodLogs(clients, ns).spool(pod, Path(handle.artifacts_dir))
        except Exception as e:  # the next call retries; poll decides about failures
            logger.warning("cannot read the log of %s: %s", handle.job_name, e)
            return [], offset
        return spool.read(offset)

    def cancel(self, handle: K8sHandle) -> None:
        clients = self.clients(handle)
        ns, name = handle.namespace, handle.job_name
        try:
            pod = self.pods(clients, ns).pod0(handle.uid)
            job_artifacts.snapshot(
                PodLogs(clients, ns), [pod] if pod else [], Path(handle.artifacts_dir)
            )
        except Exception as e:  # stopping the workload matters more than its log
            logger.warning("could not save the log of %s/%s before cancelling: %s", ns, name, e)
        api = self.api(clients, ns)
        api.delete_job(name)
        api.delete_pods(name)

    def save_outputs(self, clients: KubeClients, resource: K8sResource) -> None:
        """Write what evaluation reads (output.log, status.json) from what the cluster holds."""
        ns = resource.namespace
        job = self.api(clients, ns).read_job(resource.job_name)
        if job is None:
            return
        pods = self.pods(clients, ns).of(job)
        job_artifacts.snapshot(PodLogs(clients, ns), pods, Path(resource.artifacts_dir))

    def collect(self, resource: K8sResource, globs: list[str], dest: Path) -> list[str]:
        self.save_outputs(self.clients(resource), resource)
        dest.mkdir(parents=True, exist_ok=True)
        local = resource.local_work_dir
        if not local:
            if globs:
                logger.warning(
                    "machine has no artifacts_volume: artifact globs %s cannot be copied "
                    "(only output.log and status.json are collected)",
                    globs,
                )
            return []
        return collect_globs(Path(local), globs, dest)

    # -- teardown --------------------------------------------------------------------------
    def save_outputs_unless_saved(self, clients: KubeClients, resource: K8sResource) -> None:
        """Before teardown deletes the pods: keep their logs, unless poll already did."""
        if job_artifacts.saved_exit(Path(resource.artifacts_dir)):
            return
        try:
            self.save_outputs(clients, resource)
        except Exception as e:  # releasing the cluster matters more
            logger.warning("could not save the logs of %s: %s", resource.name, e)

    def remove_local_work_dir(self, resource: K8sResource) -> None:
        """The cell's folder on the artifacts volume, as the worker sees it (only that one:
        exactly three levels under the volume's local path)."""
        local = resource.local_work_dir
        if local and self.machine.artifacts_volume:
            root = Path(self.machine.artifacts_volume.local_path).resolve()
            path = Path(local).resolve()
            if root in path.parents and len(path.relative_to(root).parts) == 3:
                shutil.rmtree(path, ignore_errors=True)

    def teardown(self, resource: K8sResource) -> None:
        clients = self.clients(resource)
        self.save_outputs_unless_saved(clients, resource)
        api = self.api(clients, resource.namespace)
        api.delete_job(resource.job_name)
        api.delete_job(resource.setup_job_name)
        api.delete_pods(resource.job_name)
        self.remove_local_work_dir(resource)

    def unreachable(self, error: BaseException) -> bool:
        return is_unreachable(error)

    def list_managed(self) -> list[ManagedResource]:
        clients = self.clients()
        return JobInventory(clients, self.namespace(clients), self.kind).list_managed()


def rotate(art: Path, names: tuple[str, ...]) -> None:
    """Keep a previous attempt's outputs beside the new one (``<name>.<ms>``), never overwrite."""
    stamp = int(time.time() * 1000)
    for name in names:
        if (art / name).exists():
            (art / name).rename(art / f"{name}.{stamp}")
