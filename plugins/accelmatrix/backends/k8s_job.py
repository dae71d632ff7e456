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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.backends import k8s_logs, k8s_pods, tpu_names
from accelmatrix.backends.base import (
    MANAGED_BY,
    Backend,
    BackendError,
    CellContext,
    InfrastructureError,
    JobStatus,
    LogFn,
    ManagedResource,
    SetupFailed,
)
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.hooks.k8s import KubeClients, api_message, get_clients

logger = logging.getLogger(__name__)

CONTAINER = "workload"
RESOURCE_ANNOTATION = "accelmatrix.io/resource"
TEARDOWN_KEYS = (
    "backend",
    "name",
    "kubernetes_conn_id",
    "namespace",
    "job_name",
    "setup_job_name",
    "artifacts_dir",
    "work_subpath",
    "local_work_dir",
)
JOB_LABEL = "accelmatrix.io/job"
KIND_LABEL = "accelmatrix.io/backend"  # set by other Kubernetes kinds (k8s-jobset, gke-tpu)
ROLE_LABEL = "accelmatrix.io/role"
UID_LABEL = "batch.kubernetes.io/controller-uid"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
GPU_TAINT = "nvidia.com/gpu"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
ROTATED = ("output.log", "status.json")
DELETE_WAIT_SECONDS = 60.0
UNREACHABLE_GRACE_SECONDS = 120.0
SETUP_POLL_SECONDS = (0.2, 2.0)  # first and longest wait between setup Job polls

_unreachable_since: dict[str, float] = {}
_state_lock = threading.Lock()


def _label_value(text: str) -> str:
    """A valid Kubernetes label value (the Google-label form, trimmed to alphanumeric ends)."""
    return tpu_names.label_value(text).strip("-_.")


def _epoch(ts: Any) -> float | None:
    if ts is None:
        return None
    if isinstance(ts, datetime):
        return ts.timestamp()
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _index(pod: Any) -> int:
    labels = pod.metadata.labels or {}
    try:
        return int(labels.get(INDEX_LABEL, 0))
    except ValueError:
        return 0


def _terminated(pod: Any, container: str = CONTAINER) -> Any:
    for cs in pod.status.container_statuses or []:
        if cs.name == container and cs.state and cs.state.terminated:
            return cs.state.terminated
    return None


class KubernetesJobBackend(Backend):
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

    # -- the Job ---------------------------------------------------------------------------
    def _env(self, env: dict[str, str]) -> list[dict[str, str]]:
        m = self.machine
        values = dict(env)
        values["ACCELMATRIX_WORK_DIR"] = m.work_dir
        values["ACCELMATRIX_NUM_NODES"] = str(m.num_nodes)
        if m.accelerator_resource is None:
            values.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # CPU-only: no GPU even if present
        return [{"name": k, "value": v} for k, v in values.items()]

    def _container(self, name: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
            raise BackendError(f"invalid argv {argv!r}: empty, not strings or containing NUL")
        m = self.machine
        requests = {k: v for k, v in (("cpu", m.cpu), ("memory", m.memory)) if v}
        limits: dict[str, str] = {}
        if m.accelerator_resource:
            limits[m.accelerator_resource] = str(m.gpus or 1)
        resources: dict[str, Any] = {}
        if requests:
            resources["requests"] = requests
        if limits:
            resources["limits"] = limits
        return {
            "name": name,
            "image": m.image,
            "imagePullPolicy": m.image_pull_policy,
            # Exec form: no shell ever sees an argument. But the kubelet itself expands
            # `$(VAR)` in command and args from the container's env; `$$` is its escape, so
            # every `$` is doubled and each argument reaches the process exactly as written.
            "command": [a.replace("$", "$$") for a in argv],
            "workingDir": m.work_dir,
            "env": self._env(env),
            "resources": resources,
            "volumeMounts": [{"name": "work", "mountPath": m.work_dir}],
        }

    def _job_body(
        self,
        resource: dict[str, Any],
        name: str,
        role: str,
        containers: list[dict[str, Any]],
        init_containers: list[dict[str, Any]] | None = None,
        nodes: int = 1,
    ) -> dict[str, Any]:
        m = self.machine
        if m.artifacts_volume:
            volume = {
                "name": "work",
                "persistentVolumeClaim": {"claimName": m.artifacts_volume.claim_name},
            }
            for c in containers + (init_containers or []):
                c["volumeMounts"][0]["subPath"] = resource["work_subpath"]
        else:
            volume = {"name": "work", "emptyDir": {}}
        node_selector = dict(m.node_selector)
        if m.accelerator:
            node_selector[GKE_ACCELERATOR] = m.accelerator
        tolerations = [t.model_dump(exclude_none=True) for t in m.tolerations]
        if m.accelerator_resource and not any(t.get("key") == GPU_TAINT for t in tolerations):
            tolerations.append({"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"})
        labels = dict(resource["labels"])
        pod_labels = {**labels, JOB_LABEL: resource["job_name"], ROLE_LABEL: role}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": containers,
            "volumes": [volume],
        }
        if init_containers:
            pod_spec["initContainers"] = init_containers
        if m.service_account:
            pod_spec["serviceAccountName"] = m.service_account
        if node_selector:
            pod_spec["nodeSelector"] = node_selector
        if tolerations:
            pod_spec["tolerations"] = tolerations
        spec: dict[str, Any] = {
            "backoffLimit": 0,
            "completions": nodes,
            "parallelism": nodes,
            "ttlSecondsAfterFinished": m.ttl_seconds_after_finished,
            "activeDeadlineSeconds": int(resource["active_deadline_seconds"]),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        }
        if nodes > 1:
            spec["completionMode"] = "Indexed"
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": resource["namespace"],
                "labels": {**labels, JOB_LABEL: resource["job_name"], ROLE_LABEL: role},
                "annotations": {
                    **dict(resource.get("annotations") or {}),
                    # What teardown needs, so a janitor can release a Job it finds orphaned.
                    RESOURCE_ANNOTATION: json.dumps(
                        {k: resource.get(k) for k in TEARDOWN_KEYS}, separators=(",", ":")
                    ),
                },
            },
            "spec": spec,
        }

    def workload_job(
        self, resource: dict[str, Any], argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The Job manifest submit creates (public: tests and docs render it)."""
        return self._job_body(
            resource,
            resource["job_name"],
            "workload",
            [self._container(CONTAINER, argv, env)],
            nodes=self.machine.num_nodes,
        )

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

    # -- inspection ------------------------------------------------------------------------
    def _pods(self, clients: KubeClients, ns: str, job: Any) -> list[Any]:
        selector = f"{UID_LABEL}={job.metadata.uid}"
        pods = clients.core.list_namespaced_pod(ns, label_selector=selector).items
        return sorted(pods, key=lambda p: (_index(p), _epoch(p.metadata.creation_timestamp) or 0))

    def _inspect(
        self,
        clients: KubeClients,
        ns: str,
        job: Any,
        scheduling_timeout: float,
        containers: list[str] | None = None,
    ) -> tuple[JobStatus, list[Any]]:
        """Classify a Job: running, exited (with the exit code) or an infrastructure failure."""
        name = job.metadata.name
        pods = self._pods(clients, ns, job)
        conditions = {c.type: c for c in (job.status.conditions or []) if c.status == "True"}
        now = time.time()
        for pod in pods:
            problem = k8s_pods.pod_problem(
                pod,
                now=now,
                scheduling_timeout=scheduling_timeout,
                creating_timeout=float(self.machine.container_creating_timeout_seconds),
            )
            if problem:  # before any exit code: a pod the cluster stopped exits 143/137
                return self._infra(problem), pods
        if "Complete" in conditions:
            term = _terminated(pods[0]) if pods else None
            code = term.exit_code if term else 0
            return JobStatus(done=True, exit_code=code, detail=f"Job {name} complete"), pods
        if "Failed" in conditions:
            cond = conditions["Failed"]
            for pod in pods:
                for cname in containers or [CONTAINER]:
                    term = _terminated(pod, cname)
                    if term is None:
                        term = next(
                            (
                                cs.state.terminated
                                for cs in pod.status.init_container_statuses or []
                                if cs.name == cname and cs.state and cs.state.terminated
                            ),
                            None,
                        )
                    if term is not None and term.exit_code != 0:
                        return JobStatus(
                            done=True,
                            exit_code=term.exit_code,
                            detail=f"pod {pod.metadata.name} container {cname} exited with "
                            f"{term.exit_code} ({term.reason})",
                        ), pods
            if cond.reason == "DeadlineExceeded":
                return JobStatus(
                    done=True,
                    exit_code=None,
                    detail=f"Job {name} passed activeDeadlineSeconds and was stopped",
                ), pods
            return self._infra(
                f"Job {name} failed ({cond.reason}: {cond.message}) without a container exit "
                "code: its pod was deleted or evicted"
            ), pods
        if not pods:
            age = now - (_epoch(job.metadata.creation_timestamp) or now)
            if age > scheduling_timeout:
                return self._infra(
                    f"Job {name} created no pod in {age:.0f} s (quota, admission webhook or "
                    "a missing service account?)"
                ), pods
            return JobStatus(done=False, detail="waiting for a pod"), pods
        phases = ",".join(sorted({p.status.phase for p in pods}))
        return JobStatus(done=False, detail=f"pods {phases}"), pods

    @staticmethod
    def _infra(detail: str) -> JobStatus:
        return JobStatus(done=True, exit_code=None, detail=detail, infrastructure_failure=True)

    def _spool(
        self, clients: KubeClients, ns: str, pod: Any, art: Path, container: str = CONTAINER
    ) -> k8s_logs.Spool:
        """The pod's log spool (``<artifacts>/pods/<pod>.log``), followed from now on."""
        from kubernetes.client.exceptions import ApiException

        name = pod.metadata.name
        spool = k8s_logs.Spool(art / "pods" / f"{name}.log")

        def open_stream(since: str | None) -> Any:
            query = [("container", container), ("follow", "true"), ("timestamps", "true")]
            if since:
                query.append(("sinceTime", since))  # the generated client cannot send it
            return clients.core.api_client.call_api(
                "/api/v1/namespaces/{namespace}/pods/{name}/log",
                "GET",
                path_params={"namespace": ns, "name": name},
                query_params=query,
                header_params={"Accept": "*/*"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )

        def finished() -> bool | None:
            try:
                p = clients.core.read_namespaced_pod(name, ns)
            except ApiException as e:
                return True if e.status == 404 else None
            return p.status.phase in ("Succeeded", "Failed") or (
                k8s_pods.terminated(p, container) is not None
            )

        k8s_logs.ensure(spool, open_stream, finished)
        return spool

    @staticmethod
    def _log_forbidden(ns: str, pod: str, detail: str) -> BackendError:
        return BackendError(
            f"cannot read the log of pod {ns}/{pod}: {detail}. The Role bound to the "
            "connection's identity needs verb `get` on resource `pods/log` (see the minimal "
            "Role in docs/backends-kubernetes.md)"
        )

    def _spooled_log(
        self, clients: KubeClients, ns: str, pod: Any, art: Path, target: Path | None = None
    ) -> k8s_logs.Spool:
        """Follow the pod's log; once its container exited, wait until the spool is whole;
        show it as ``target`` too (a hard link)."""
        spool = self._spool(clients, ns, pod, art)
        done = pod.status.phase in ("Succeeded", "Failed") or _terminated(pod) is not None
        if done:
            k8s_logs.settle(spool)
        if err := spool.error():
            raise self._log_forbidden(ns, pod.metadata.name, err)
        if target is not None and spool.path.exists():
            k8s_logs.link_or_copy(spool.path, target)
        return spool

    def _read_log(self, clients: KubeClients, ns: str, pod: str, container: str) -> bytes | None:
        """The whole log of a container; None while it has not started or the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = clients.core.read_namespaced_pod_log(
                pod, ns, container=container, _preload_content=False
            )
        except ApiException as e:
            if e.status in (400, 404):
                return None
            if e.status == 403:
                raise self._log_forbidden(ns, pod, f"403 {api_message(e)}") from None
            raise
        return resp.data

    # -- setup -----------------------------------------------------------------------------
    def setup(
        self,
        resource: dict[str, Any],
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        if not commands:
            return
        clients = self._clients(resource)
        ns, name = resource["namespace"], resource["setup_job_name"]
        names = [f"setup-{i}" for i in range(len(commands))]
        containers = [
            self._container(n, argv, env) for n, argv in zip(names, commands, strict=True)
        ]
        body = self._job_body(resource, name, "setup", containers[-1:], containers[:-1])
        timeout_s = float(self.machine.scheduling_timeout_seconds)
        # A setup Job left by an earlier attempt (its task was killed or timed out) may be
        # the very thing that hung: replace it, as the local and SSH backends stop theirs.
        # Setup commands run again on every attempt anyway; the run Job is reattached to.
        if self._delete_job(clients, ns, name, wait=True):
            log(f"deleted setup Job {ns}/{name} left by an earlier attempt")
        job, reattached = self._create_or_reattach(clients, ns, body, timeout_s)
        log(f"{'reattached to' if reattached else 'created'} setup Job {ns}/{name}")
        log_path = Path(resource["artifacts_dir"]) / "setup.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offsets = dict.fromkeys(names, 0)
        tails: dict[str, list[str]] = {n: [] for n in names}
        deadline = time.monotonic() + timeout
        try:
            with open(log_path, "a", encoding="utf-8") as setup_log:

                def stream(pods: list[Any]) -> None:
                    if not pods:
                        return
                    for cname in names:
                        data = self._read_log(clients, ns, pods[0].metadata.name, cname)
                        if data is None or len(data) <= offsets[cname]:
                            continue
                        chunk = data[offsets[cname] :]
                        offsets[cname] = len(data)
                        for line in chunk.decode("utf-8", "replace").splitlines():
                            log(f"[{cname}] {line}")
                            setup_log.write(f"[{cname}] {line}\n")
                            tails[cname] = (tails[cname] + [line])[-20:]

                pause = SETUP_POLL_SECONDS[0]
                while True:
                    job = clients.batch.read_namespaced_job(name, ns)
                    status, pods = self._inspect(clients, ns, job, timeout_s, names)
                    stream(pods)
                    if status.done:
                        break
                    if time.monotonic() >= deadline:
                        raise SetupFailed(f"setup timed out after {timeout}s (Job {ns}/{name})")
                    time.sleep(pause)
                    pause = min(pause * 1.5, SETUP_POLL_SECONDS[1])
        except BaseException:
            self._delete_job(clients, ns, name)
            raise
        self._delete_job(clients, ns, name)
        if status.infrastructure_failure:
            raise InfrastructureError(f"setup Job {ns}/{name}: {status.detail}")
        if status.exit_code:
            failed = next((n for n in names if f"container {n} exited" in status.detail), names[-1])
            i = names.index(failed)
            raise SetupFailed(
                f"setup[{i}] {commands[i]} exited with {status.exit_code}; last lines:\n"
                + "\n".join(tails[failed])
            )
        if status.exit_code is None:
            raise SetupFailed(f"setup Job {ns}/{name} ended without an exit code: {status.detail}")

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

    # -- artifacts -------------------------------------------------------------------------
    def _snapshot(self, clients: KubeClients, ns: str, pods: list[Any], art: Path) -> None:
        """Write output.log and status.json (what evaluation reads) from the pods' state."""
        if not pods:
            return
        art.mkdir(parents=True, exist_ok=True)
        pods = sorted(pods, key=_index)
        pod0 = pods[0]
        for pod in pods:
            i = _index(pod)
            target = art / ("output.log" if i == 0 else f"output-{i}.log")
            self._spooled_log(clients, ns, pod, art, target)
        term = _terminated(pod0)
        running = next(
            (
                cs.state.running
                for cs in pod0.status.container_statuses or []
                if cs.name == CONTAINER and cs.state and cs.state.running
            ),
            None,
        )
        status = {
            "exit_code": term.exit_code if term else None,
            "started_at": _epoch(term.started_at if term else running and running.started_at),
            "ended_at": _epoch(term.finished_at) if term else None,
            "pid": None,
            "pod": pod0.metadata.name,
            "node": pod0.spec.node_name,
            "reason": (term.reason if term else None) or pod0.status.reason,
        }
        tmp = art / ".status.json.part"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, art / "status.json")

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

    def list_managed(self) -> list[ManagedResource]:
        """One entry per cell (its setup and workload Jobs share the cell's job label)."""
        clients = self._clients()
        ns = self._namespace(clients)
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
            ident = {
                "dag_id": annotations.get("accelmatrix.io/dag-id"),
                "run_id": annotations.get("accelmatrix.io/run-id"),
                "cell_id": annotations.get("accelmatrix.io/cell-id"),
            }
            entry = by_cell.get(cell_job)
            if entry is None:
                entry = by_cell[cell_job] = ManagedResource(
                    backend=self.kind,
                    name=f"{ns}/{cell_job}",
                    labels={k: v for k, v in labels.items() if k != ROLE_LABEL},
                    created_at=_epoch(job.metadata.creation_timestamp),
                    detail={
                        "namespace": ns,
                        "jobs": [],
                        "identity": ident if all(ident.values()) else None,
                        "annotations": annotations,
                        "resource": record,
                        "active": 0,
                        "succeeded": 0,
                        "failed": 0,
                    },
                )
            entry.detail["jobs"].append(job.metadata.name)
            for k in ("active", "succeeded", "failed"):
                entry.detail[k] += getattr(st, k, None) or 0
            created = _epoch(job.metadata.creation_timestamp)
            if created is not None and (entry.created_at is None or created < entry.created_at):
                entry.created_at = created
        return list(by_cell.values())
