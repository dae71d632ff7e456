"""The log follower of the Kubernetes backends: each pod's log spooled whole, read back.

``PodLogs`` opens the ``follow`` stream of a pod's container and hands it to ``logs`` (the
spool: one follower thread per container and host, resumable, whole across kubelet
rotations); it reads a short container log whole (the setup Job, a failed rank's tail), and
turns a missing ``pods/log`` grant into one clear error instead of an empty log. Job and
JobSet backends share it: a pod's log is the same whoever owns the pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelmatrix.backends.base import BackendError
from accelmatrix.backends.kubernetes import logs as k8s_logs
from accelmatrix.backends.kubernetes import pods as k8s_pods
from accelmatrix.backends.kubernetes.job_manifest import CONTAINER
from accelmatrix.hooks.k8s import KubeClients, api_message


def log_forbidden(ns: str, pod: str, detail: str) -> BackendError:
    """The error for a log the connection may not read (no retry fixes it)."""
    return BackendError(
        f"cannot read the log of pod {ns}/{pod}: {detail}. The Role bound to the "
        "connection's identity needs verb `get` on resource `pods/log` (see the minimal "
        "Role in docs/backends-kubernetes.md)"
    )


class PodLogs:
    """Pod logs in one namespace: followed into spools under a cell's artifacts dir."""

    def __init__(self, clients: KubeClients, ns: str):
        self.clients = clients
        self.ns = ns

    def spool(self, pod: Any, art: Path, container: str = CONTAINER) -> k8s_logs.Spool:
        """The pod's log spool (``<artifacts>/pods/<pod>.log``), followed from now on."""
        from kubernetes.client.exceptions import ApiException

        clients, ns = self.clients, self.ns
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

    def spooled(self, pod: Any, art: Path, target: Path | None = None) -> k8s_logs.Spool:
        """Follow the pod's log; once its container exited, wait until the spool is whole;
        show it as ``target`` too (a hard link)."""
        spool = self.spool(pod, art)
        done = (
            pod.status.phase in ("Succeeded", "Failed")
            or k8s_pods.terminated(pod, CONTAINER) is not None
        )
        if done:
            k8s_logs.settle(spool)
        if err := spool.error():
            raise log_forbidden(self.ns, pod.metadata.name, err)
        if target is not None and spool.path.exists():
            k8s_logs.link_or_copy(spool.path, target)
        return spool

    def read(self, pod: str, container: str) -> bytes | None:
        """The whole log of a container; None while it has not started or the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.clients.core.read_namespaced_pod_log(
                pod, self.ns, container=container, _preload_content=False
            )
        except ApiException as e:
            if e.status in (400, 404):
                return None
            if e.status == 403:
                raise log_forbidden(self.ns, pod, f"403 {api_message(e)}") from None
            raise
        return resp.data
