"""KubernetesJobSetBackend: a multi-node cell as one JobSet (jobset.x-k8s.io/v1alpha2).

It is the ``k8s-job`` backend for everything a cell does before and after its workload
(provision checks, the setup Job, the artifacts volume, teardown of the setup Job) and
differs where a group of pods differs from one:

* **submit** creates the JobSet of ``jobset_manifest`` (name from the cell identity, short
  enough that every pod hostname is a DNS label). 409 reattaches, except to a JobSet that
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
  its log spool (``k8s_logs``: every pod's log is followed and appended to
  ``pods/<pod>.log`` as it is written, whole across kubelet rotations); after a restart it
  starts again at the new leader's first line.
* **collect** saves every pod's log (``pods/<pod>.log``), the leader's as ``output.log``,
  ``status.json`` with every pod's state, and the group's timing (seconds from the JobSet's
  start until all pods ran, and the spread of the pods' start times, i.e. how long the
  leader waited at the rendezvous) as ``runner.all_pods_running_s`` and
  ``runner.rendezvous_s`` metrics, which checks can bound (HyperPod's success indicators).
* **teardown/cancel** delete the JobSet with Foreground propagation (child Jobs, pods and
  the headless Service go with it), then any pod still labelled with the cell.

The snapshot of the group (``k8s_jobset_artifacts``) and the janitor's listing
(``k8s_jobset_inventory``) live beside this module as mixins the backend inherits.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from accelmatrix.backends import jobset_verdict as verdict
from accelmatrix.backends import tpu_names
from accelmatrix.backends.base import (
    BackendError,
    CellContext,
    InfrastructureError,
    JobStatus,
)
from accelmatrix.backends.jobset_manifest import (
    CONTAINER,
    JOBSET_NAME_LABEL,
    child_job_spec,
    jobset_body,
    rendezvous_env,
)
from accelmatrix.backends.k8s_job import (
    KIND_LABEL,
    ROTATED,
    KubernetesJobBackend,
)
from accelmatrix.backends.k8s_jobset_artifacts import JobSetArtifacts
from accelmatrix.backends.k8s_jobset_inventory import JobSetInventory
from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine
from accelmatrix.hooks import jobset as jobset_api
from accelmatrix.hooks.k8s import KubeClients, api_message
from accelmatrix.metrics.resources import FILE as RUNNER_FILE

logger = logging.getLogger(__name__)

TAIL_LINES = 20
OFFSET_BITS = 40  # read_logs: byte offsets below, the restart attempt above (see there)
SPOOL_SECONDS = 10.0  # how often poll saves every pod's log while the group runs
_spooled: dict[str, float] = {}
_spool_lock = threading.Lock()


class KubernetesJobSetBackend(JobSetArtifacts, JobSetInventory, KubernetesJobBackend):
    kind = "k8s-jobset"

    def __init__(self, machine_spec: dict[str, Any]):
        self.machine_spec = machine_spec
        self.machine = self.machine_model().model_validate(machine_spec)

    @staticmethod
    def machine_model() -> type[KubernetesJobSetMachine]:
        return KubernetesJobSetMachine

    # -- names and provision ---------------------------------------------------------------
    def queue_wait_limit(self) -> float:
        kueue = self.machine.kueue
        return float(kueue.admission_timeout_seconds) if kueue else 0.0

    def jobset_name(self, ctx: CellContext) -> str:
        budget = self.machine.name_budget()
        return tpu_names.node_name(
            ctx.dag_id, ctx.run_id, ctx.cell_id, prefix="amj", max_len=budget
        )

    def provision(self, ctx: CellContext) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        record = super().provision(ctx)
        clients = self._clients(record)
        ns = record["namespace"]
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
        record.update(job_name=name, name=f"{ns}/{name}", backend=self.kind)
        # Marks the JobSet, its child Jobs, pods and the setup Job as this kind's (janitor).
        record["labels"][KIND_LABEL] = self.kind
        return record

    # -- the JobSet --------------------------------------------------------------------------
    def workload_jobset(
        self, resource: dict[str, Any], argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        """The JobSet manifest submit creates (public: tests and docs render it)."""
        m = self.machine
        name = resource["job_name"]
        container = self._container(CONTAINER, argv, env)
        container["env"] += self.group_env(name)
        container["ports"] = [
            {"name": "rendezvous", "containerPort": m.rendezvous_port},
            {"name": "jax-coord", "containerPort": m.jax_coordinator_port},
        ]
        job = self._job_body(resource, name, "workload", [container], nodes=m.num_nodes)
        pod_template = job["spec"]["template"]
        self.adjust_pod_template(pod_template)
        spec = child_job_spec(
            pod_template,
            m.num_nodes,
            int(resource["active_deadline_seconds"]),
            m.restart_on_exit_codes,
        )
        meta = job["metadata"]
        return jobset_body(
            name=name,
            namespace=resource["namespace"],
            labels=meta["labels"],
            annotations=meta["annotations"],
            replicated_job=m.replicated_job,
            replicas=m.replicas,
            job_spec=spec,
            max_restarts=m.max_restarts,
            ttl_seconds_after_finished=m.ttl_seconds_after_finished,
            queue_name=m.kueue.queue_name if m.kueue else None,
            priority_class=m.kueue.priority_class if m.kueue else None,
        )

    def group_env(self, name: str) -> list[dict[str, Any]]:
        m = self.machine
        return rendezvous_env(
            name, m.replicated_job, m.num_nodes, m.rendezvous_port, m.jax_coordinator_port
        )

    def adjust_pod_template(self, template: dict[str, Any]) -> None:
        """Hook for machine kinds that add to every pod (GKE TPU selectors)."""

    def submit(
        self, resource: dict[str, Any], argv: list[str], env: dict[str, str]
    ) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        clients = self._clients(resource)
        ns, name = resource["namespace"], resource["job_name"]
        body = self.workload_jobset(resource, argv, env)
        handle = {
            "backend": self.kind,
            "kubernetes_conn_id": resource.get("kubernetes_conn_id"),
            "namespace": ns,
            "job_name": name,
            "artifacts_dir": resource["artifacts_dir"],
            "scheduling_timeout": float(self.machine.scheduling_timeout_seconds),
            "creating_timeout": float(self.machine.container_creating_timeout_seconds),
            "admission_timeout": (
                float(self.machine.kueue.admission_timeout_seconds) if self.machine.kueue else None
            ),
            "queue": self.machine.kueue.queue_name if self.machine.kueue else None,
            "nodes": self.machine.num_nodes * self.machine.replicas,
        }
        for _ in range(2):
            try:
                js = jobset_api.create_jobset(clients, ns, body)
                reattached = False
            except ApiException as e:
                if e.status == 422:
                    raise BackendError(
                        f"Kubernetes rejected JobSet {name}: {api_message(e)}"
                    ) from None
                if e.status != 409:
                    raise InfrastructureError(
                        f"cannot create JobSet {ns}/{name}: {e.status} {api_message(e)}"
                    ) from e
                try:
                    js = jobset_api.get_jobset(clients, ns, name)
                except ApiException as e2:
                    if e2.status == 404:
                        continue
                    raise
                reattached = True
                status = self._classify(clients, {**handle, "uid": js["metadata"]["uid"]}, js)
                if status.done and status.infrastructure_failure:
                    logger.warning(
                        "JobSet %s/%s failed before (%s): recreating", ns, name, status.detail
                    )
                    self._delete_jobset(clients, ns, name, wait=True)
                    continue
            break
        else:
            raise InfrastructureError(f"could not create JobSet {ns}/{name} (it keeps coming back)")
        art = Path(resource["artifacts_dir"])
        if not reattached:  # a previous attempt's output is kept beside the new one
            stamp = int(time.time() * 1000)
            for fname in (*ROTATED, RUNNER_FILE):
                if (art / fname).exists():
                    (art / fname).rename(art / f"{fname}.{stamp}")
        handle.update(uid=js["metadata"]["uid"], reattached=reattached)
        return handle

    def _delete_jobset(self, clients: KubeClients, ns: str, name: str, wait: bool = False) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            jobset_api.delete_jobset(clients, ns, name)
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        deadline = time.monotonic() + 60
        while wait and time.monotonic() < deadline:
            try:
                jobset_api.get_jobset(clients, ns, name)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.2)
        return True

    # -- inspection --------------------------------------------------------------------------
    def _group_pods(self, clients: KubeClients, ns: str, name: str) -> list[Any]:
        pods = clients.core.list_namespaced_pod(ns, label_selector=f"{JOBSET_NAME_LABEL}={name}")
        return verdict.sort_pods(pods.items)

    def _tail(self, clients: KubeClients, ns: str, pod: str) -> list[str]:
        data = self._read_log(clients, ns, pod, CONTAINER) or b""
        return data.decode("utf-8", "replace").splitlines()[-TAIL_LINES:]

    def _kueue_state(self, clients: KubeClients, handle: dict[str, Any]) -> tuple[str, str]:
        try:
            workloads = jobset_api.list_workloads(clients, handle["namespace"], handle["uid"])
        except Exception as e:  # no Kueue API, or no permission: say so, don't guess
            return "unknown", f"cannot read Kueue Workloads: {e}"[:300]
        return verdict.kueue_state(workloads)

    def _classify(
        self, clients: KubeClients, handle: dict[str, Any], js: dict[str, Any]
    ) -> JobStatus:
        ns = handle["namespace"]
        return verdict.judge(
            js,
            self._group_pods(clients, ns, handle["job_name"]),
            now=time.time(),
            handle=handle,
            kueue=lambda: self._kueue_state(clients, handle),
            tail=lambda pod: self._tail(clients, ns, pod),
        )

    def poll(self, handle: dict[str, Any]) -> JobStatus:
        from kubernetes.client.exceptions import ApiException

        key = f"{handle.get('namespace')}/{handle.get('job_name')}"
        clients = self._clients(handle)
        try:
            try:
                js = jobset_api.get_jobset(clients, handle["namespace"], handle["job_name"])
            except ApiException as e:
                if e.status != 404:
                    raise
                return self._infra(
                    f"JobSet {key} disappeared (deleted outside accelmatrix, or its "
                    "ttlSecondsAfterFinished passed)"
                )
            status = self._classify(clients, handle, js)
            now = time.monotonic()
            with _spool_lock:
                due = now - _spooled.get(key, 0.0) >= SPOOL_SECONDS
                if due or status.done:
                    _spooled[key] = now
            if due and not status.done:
                # Pods the cluster deletes (a restart, a failed group's peers) take their
                # logs with them: keep a recent copy of every pod's log meanwhile.
                self._snapshot_group(
                    clients,
                    handle["namespace"],
                    handle["job_name"],
                    handle["artifacts_dir"],
                    js,
                    None,
                )
            if status.done:
                self._snapshot_group(
                    clients,
                    handle["namespace"],
                    handle["job_name"],
                    handle["artifacts_dir"],
                    js,
                    status,
                )
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
        return status

    def read_logs(self, handle: dict[str, Any], offset: int) -> tuple[list[str], int]:
        clients = self._clients(handle)
        try:
            leader = verdict.leader(
                self._group_pods(clients, handle["namespace"], handle["job_name"])
            )
            if leader is None:
                return [], offset
            spool = self._spool(clients, handle["namespace"], leader, Path(handle["artifacts_dir"]))
            if err := spool.error():
                raise self._log_forbidden(handle["namespace"], leader.metadata.name, err)
        except BackendError:  # a missing permission: say so, no retry will fix it
            raise
        except Exception as e:  # the next call retries; poll decides about failures
            logger.warning("cannot read the log of %s: %s", handle.get("job_name"), e)
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

    def cancel(self, handle: dict[str, Any]) -> None:
        clients = self._clients(handle)
        ns, name = handle["namespace"], handle["job_name"]
        try:
            self._snapshot_group(clients, ns, name, handle["artifacts_dir"], None, None)
        except Exception as e:  # stopping the workload matters more than its log
            logger.warning("could not save the logs of %s/%s before cancelling: %s", ns, name, e)
        self._delete_jobset(clients, ns, name)
        self._delete_pods(clients, ns, name)

    # -- teardown ------------------------------------------------------------------------------
    def teardown(self, resource: dict[str, Any]) -> None:
        clients = self._clients(resource)
        ns, name = resource["namespace"], resource["job_name"]
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
        errors = []
        for step in (
            lambda: self._delete_jobset(clients, ns, name),
            lambda: self._delete_job(clients, ns, resource["setup_job_name"]),
            lambda: self._delete_pods(clients, ns, name),
        ):
            try:
                step()
            except Exception as e:  # delete what we may; report the rest
                errors.append(f"{e.status} {api_message(e)}" if hasattr(e, "status") else str(e))
        super_local = resource.get("local_work_dir")
        if super_local and self.machine.artifacts_volume:
            import shutil

            root = Path(self.machine.artifacts_volume.local_path).resolve()
            path = Path(super_local).resolve()
            if root in path.parents and len(path.relative_to(root).parts) == 3:
                shutil.rmtree(path, ignore_errors=True)
        if errors:
            raise BackendError(f"teardown of {resource['name']} incomplete: " + "; ".join(errors))
