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
  pod's log is followed (one ``follow=true`` stream per container, ``k8s_logs``) and
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

This module holds the lifecycle against the API (provision, submit, poll, collect, teardown,
creating and deleting Jobs). What it inherits lives beside it, each a mixin re-exported here:
``k8s_job_manifest`` (the Job bodies and their labels), ``k8s_job_pods`` (classifying a Job's
pods, log spools, the snapshot), ``k8s_job_setup`` (the setup Job) and ``k8s_job_inventory``
(the janitor's listing).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
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
)
from accelmatrix.backends.k8s_job_inventory import JobInventory
from accelmatrix.backends.k8s_job_manifest import (
    CONTAINER,
    GKE_ACCELERATOR,
    GPU_TAINT,
    JOB_LABEL,
    KIND_LABEL,
    RESOURCE_ANNOTATION,
    ROLE_LABEL,
    TEARDOWN_KEYS,
    JobManifest,
)
from accelmatrix.backends.k8s_job_pods import (
    INDEX_LABEL,
    UID_LABEL,
    JobPods,
    _epoch,
    _index,
    _terminated,
)
from accelmatrix.backends.k8s_job_setup import SETUP_POLL_SECONDS, JobSetup
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.hooks.k8s import KubeClients, api_message, get_clients

logger = logging.getLogger(__name__)

ROTATED = ("output.log", "status.json")
DELETE_WAIT_SECONDS = 60.0
UNREACHABLE_GRACE_SECONDS = 120.0

_unreachable_since: dict[str, float] = {}
_state_lock = threading.Lock()


def _label_value(text: str) -> str:
    """A valid Kubernetes label value (the Google-label form, trimmed to alphanumeric ends)."""
    return tpu_names.label_value(text).strip("-_.")


class KubernetesJobBackend(JobSetup, JobManifest, JobPods, JobInventory, Backend):
    kind = "k8s-job"

    def __init__(self, machine_spec: dict[str, Any]):
        super().__init__(machine_spec)
        self.machine = KubernetesJobMachine.model_validate(machine_spec)

    # -- clients and names -----------------------------------------------------------------
    def _clients(self, record: dict[str, Any] | None = None) -> KubeClients:
        # A record or handle names its own connection: the machine spec may have been edited.
        conn_id = (record or {}).get("kubernetes_conn_id") or self.machine.kubernetes_conn_id
        return get_clients(conn_id)

    def _namespace(self, clients: KubeClients) -> str:
        return self.machine.namespace or clients.namespace

    @staticmethod
    def job_name(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="am")

    @staticmethod
    def setup_job_name(ctx: CellContext) -> str:
        return tpu_names.node_name(ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="ams")

    # -- provision -------------------------------------------------------------------------
    def provision(self, ctx: CellContext) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        clients = self._clients()
        ns = self._namespace(clients)
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
            k: _label_value(v) if k != "ttl" else v
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
        return {
            "backend": self.kind,
            "name": f"{ns}/{job}",
            "kubernetes_conn_id": clients.conn_id,
            "namespace": ns,
            "job_name": job,
            "setup_job_name": self.setup_job_name(ctx),
            "artifacts_dir": str(ctx.artifacts_dir),
            "work_subpath": subpath,
            "local_work_dir": local_work_dir,
            "created_at": now,
            # The API refuses a deadline below 1 s (422): an already expired TTL gets 1 s.
            "active_deadline_seconds": max(
                1, self.machine.active_deadline_seconds or ctx.ttl_seconds
            ),
            "labels": labels,
            "annotations": {
                "accelmatrix.io/dag-id": ctx.dag_id,
                "accelmatrix.io/run-id": ctx.run_id,
                "accelmatrix.io/cell-id": ctx.cell_id,
            },
        }

    def variables(self, resource: dict[str, Any]) -> dict[str, str]:
        return {
            "work_dir": self.machine.work_dir,
            "include_dir": self.machine.include_dir,
            "python": self.machine.python,
        }

    def _create_or_reattach(
        self, clients: KubeClients, ns: str, body: dict[str, Any], scheduling_timeout: float
    ) -> tuple[Any, bool]:
        """Create the Job; on 409 reuse it, unless it failed for infrastructure reasons."""
        from kubernetes.client.exceptions import ApiException

        name = body["metadata"]["name"]
        for _ in range(2):
            try:
                return clients.batch.create_namespaced_job(ns, body), False
            except ApiException as e:
                if e.status == 422:
                    raise BackendError(
                        f"Kubernetes rejected Job {name}: {api_message(e)}"
                    ) from None
                if e.status != 409:
                    raise InfrastructureError(
                        f"cannot create Job {ns}/{name}: {e.status} {api_message(e)}"
                    ) from e
            try:
                job = clients.batch.read_namespaced_job(name, ns)
            except ApiException as e:
                if e.status == 404:  # deleted between the 409 and the read: create again
                    continue
                raise
            status, _ = self._inspect(clients, ns, job, scheduling_timeout)
            if not (status.done and status.infrastructure_failure):
                return job, True
            logger.warning("Job %s/%s failed before (%s): recreating it", ns, name, status.detail)
            self._delete_job(clients, ns, name, wait=True)
        raise InfrastructureError(f"could not create Job {ns}/{name} (it keeps coming back)")

    def _delete_job(self, clients: KubeClients, ns: str, name: str, wait: bool = False) -> bool:
        """Delete a Job and its pods; True if it existed. ``wait``: until it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            clients.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
            existed = True
        except ApiException as e:
            if e.status != 404:
                raise
            existed = False
        deadline = time.monotonic() + DELETE_WAIT_SECONDS
        while wait and existed and time.monotonic() < deadline:
            try:
                clients.batch.read_namespaced_job(name, ns)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.2)
        return existed

    # -- run -------------------------------------------------------------------------------
    def submit(
        self, resource: dict[str, Any], argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        clients = self._clients(resource)
        ns = resource["namespace"]
        body = self.workload_job(resource, argv, env)
        timeout_s = float(self.machine.scheduling_timeout_seconds)
        art = Path(resource["artifacts_dir"])
        job, reattached = self._create_or_reattach(clients, ns, body, timeout_s)
        if not reattached:  # a previous attempt's output is kept beside the new one
            stamp = int(time.time() * 1000)
            for name in ROTATED:
                if (art / name).exists():
                    (art / name).rename(art / f"{name}.{stamp}")
        return {
            "backend": self.kind,
            "kubernetes_conn_id": resource.get("kubernetes_conn_id"),
            "namespace": ns,
            "job_name": resource["job_name"],
            "uid": job.metadata.uid,
            "artifacts_dir": resource["artifacts_dir"],
            "scheduling_timeout": timeout_s,
            "reattached": reattached,
        }

    def poll(self, handle: dict[str, Any]) -> JobStatus:
        from kubernetes.client.exceptions import ApiException

        key = f"{handle.get('namespace')}/{handle.get('job_name')}"
        clients = self._clients(handle)
        try:
            try:
                job = clients.batch.read_namespaced_job(handle["job_name"], handle["namespace"])
            except ApiException as e:
                if e.status != 404:
                    raise
                return self._infra(
                    f"Job {key} disappeared (deleted outside accelmatrix, or its "
                    "ttlSecondsAfterFinished passed)"
                )
            status, pods = self._inspect(
                clients, handle["namespace"], job, float(handle["scheduling_timeout"])
            )
            for pod in pods:  # every pod's log is followed while it runs (k8s_logs)
                self._spool(clients, handle["namespace"], pod, Path(handle["artifacts_dir"]))
            if status.done:
                self._snapshot(clients, handle["namespace"], pods, Path(handle["artifacts_dir"]))
        except ApiException as e:
            if e.status is not None and 400 <= e.status < 500 and e.status != 429:
                raise
            return self._unreachable(key, e)
        except (OSError, ConnectionError) as e:
            return self._unreachable(key, e)
        except Exception as e:  # urllib3 errors do not derive from OSError
            if type(e).__module__.startswith("urllib3"):
                return self._unreachable(key, e)
            raise
        with _state_lock:
            _unreachable_since.pop(key, None)
        return status

    def _unreachable(self, key: str, e: BaseException) -> JobStatus:
        now = time.monotonic()
        with _state_lock:
            since = _unreachable_since.setdefault(key, now)
        if now - since >= UNREACHABLE_GRACE_SECONDS:
            with _state_lock:
                _unreachable_since.pop(key, None)
            return self._infra(f"Kubernetes API unreachable for {now - since:.0f} s: {e}")
        logger.warning("cannot reach the Kubernetes API for %s (will retry): %s", key, e)
        return JobStatus(done=False, detail=f"API unreachable: {e}")

    def _pod0(self, clients: KubeClients, handle: dict[str, Any]) -> Any:
        selector = f"{UID_LABEL}={handle['uid']}"
        pods = clients.core.list_namespaced_pod(handle["namespace"], label_selector=selector).items
        pods = [p for p in pods if _index(p) == 0]
        pods.sort(key=lambda p: _epoch(p.metadata.creation_timestamp) or 0)
        return pods[-1] if pods else None

    def read_logs(self, handle: dict[str, Any], offset: int) -> tuple[list[str], int]:
        clients = self._clients(handle)
        try:
            pod = self._pod0(clients, handle)
            if pod is None:
                return [], offset
            spool = self._spool(clients, handle["namespace"], pod, Path(handle["artifacts_dir"]))
        except Exception as e:  # the next call retries; poll decides about failures
            logger.warning("cannot read the log of %s: %s", handle.get("job_name"), e)
            return [], offset
        return spool.read(offset)

    def cancel(self, handle: dict[str, Any]) -> None:
        clients = self._clients(handle)
        ns, name = handle["namespace"], handle["job_name"]
        try:
            pod = self._pod0(clients, handle)
            self._snapshot(clients, ns, [pod] if pod else [], Path(handle["artifacts_dir"]))
        except Exception as e:  # stopping the workload matters more than its log
            logger.warning("could not save the log of %s/%s before cancelling: %s", ns, name, e)
        self._delete_job(clients, ns, name)
        self._delete_pods(clients, ns, name)

    def _snapshot_resource(self, clients: KubeClients, resource: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        ns = resource["namespace"]
        try:
            job = clients.batch.read_namespaced_job(resource["job_name"], ns)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        self._snapshot(clients, ns, self._pods(clients, ns, job), Path(resource["artifacts_dir"]))

    def collect(self, resource: dict[str, Any], globs: list[str], dest: Path) -> list[str]:
        self._snapshot_resource(self._clients(resource), resource)
        dest.mkdir(parents=True, exist_ok=True)
        local = resource.get("local_work_dir")
        if not local:
            if globs:
                logger.warning(
                    "machine has no artifacts_volume: artifact globs %s cannot be copied "
                    "(only output.log and status.json are collected)",
                    globs,
                )
            return []
        from accelmatrix.backends.local import LocalBackend

        return LocalBackend({"backend": "local"}).collect({"work_dir": local}, globs, dest)

    # -- teardown --------------------------------------------------------------------------
    def _delete_pods(self, clients: KubeClients, ns: str, job_name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            clients.core.delete_collection_namespaced_pod(
                ns, label_selector=f"{JOB_LABEL}={job_name}"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def teardown(self, resource: dict[str, Any]) -> None:
        clients = self._clients(resource)
        ns = resource["namespace"]
        status_path = Path(resource["artifacts_dir"]) / "status.json"
        try:
            saved = json.loads(status_path.read_text()).get("exit_code") is not None
        except (OSError, ValueError):
            saved = False
        if not saved:
            try:
                self._snapshot_resource(clients, resource)
            except Exception as e:  # releasing the cluster matters more
                logger.warning("could not save the logs of %s: %s", resource["name"], e)
        self._delete_job(clients, ns, resource["job_name"])
        self._delete_job(clients, ns, resource["setup_job_name"])
        self._delete_pods(clients, ns, resource["job_name"])
        local = resource.get("local_work_dir")
        if local and self.machine.artifacts_volume:
            root = Path(self.machine.artifacts_volume.local_path).resolve()
            path = Path(local).resolve()
            if root in path.parents and len(path.relative_to(root).parts) == 3:
                shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "CONTAINER",
    "GKE_ACCELERATOR",
    "GPU_TAINT",
    "INDEX_LABEL",
    "JOB_LABEL",
    "KIND_LABEL",
    "RESOURCE_ANNOTATION",
    "ROLE_LABEL",
    "ROTATED",
    "SETUP_POLL_SECONDS",
    "TEARDOWN_KEYS",
    "UID_LABEL",
    "KubernetesJobBackend",
    "_epoch",
    "_index",
    "_terminated",
]
