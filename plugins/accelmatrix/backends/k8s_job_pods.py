"""What a k8s-job cell's Job and pods say: the verdict, the log spools, the snapshot.

``JobPods`` reads a Job and its pods and classifies them (running, exited with a code, or an
infrastructure failure the run step may retry), follows every pod's log into its spool
(``k8s_logs``) and writes ``output.log`` and ``status.json`` from the pods' state. It is
separate from ``accelmatrix.backends.k8s_job`` because it observes what the cluster reports,
while that module creates and deletes; ``KubernetesJobBackend`` (and the JobSet backends
after it, for the log spools) inherit it unchanged, and ``k8s_job`` re-exports the helpers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from accelmatrix.backends import k8s_logs, k8s_pods
from accelmatrix.backends.base import BackendError, JobStatus
from accelmatrix.backends.k8s_job_manifest import CONTAINER
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.hooks.k8s import KubeClients, api_message

UID_LABEL = "batch.kubernetes.io/controller-uid"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


# Kept under its old name: k8s_job re-exports it and the inventory imports it.
_epoch = k8s_pods.epoch


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


class JobPods:
    """The inspection, log and snapshot steps of KubernetesJobBackend (a mixin)."""

    machine: KubernetesJobMachine

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
