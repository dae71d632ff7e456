"""Kubernetes API clients for the ``k8s-job`` backend, one set per connection per process.

The clients come from the cncf-kubernetes provider's ``KubernetesHook``, so every way that
provider reads a connection (``kube_config`` JSON or YAML in the extra, ``kube_config_path``,
``in_cluster``, ``cluster_context``, ``namespace``, ``disable_verify_ssl``) works unchanged,
and the provider's request timeout wrapper applies. Building an API client parses a
kubeconfig and may run an exec credential plugin (gke-gcloud-auth-plugin): far too slow for
the triggerer, which polls every running cell about once a second, so the result is cached
per process and connection id (``forget`` drops one, e.g. after a credential rotation).

``kubernetes`` and the provider are imported lazily: the DAG file must stay light.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from accelmatrix.masking import mask_connection

DEFAULT_NAMESPACE = "default"

_lock = threading.Lock()
_cache: dict[str, KubeClients] = {}


@dataclass(frozen=True)
class KubeClients:
    """The typed clients the backend uses, plus the connection's default namespace."""

    conn_id: str
    batch: Any  # kubernetes.client.BatchV1Api
    core: Any  # kubernetes.client.CoreV1Api
    namespace: str
    custom: Any = None  # kubernetes.client.CustomObjectsApi (JobSets, Kueue Workloads)


def get_clients(conn_id: str) -> KubeClients:
    """Clients for the Airflow connection ``conn_id`` (cached per process)."""
    with _lock:
        cached = _cache.get(conn_id)
    if cached is not None:
        return cached
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    mask_connection(conn_id)
    hook = KubernetesHook(conn_id=conn_id)
    clients = KubeClients(
        conn_id=conn_id,
        batch=hook.batch_v1_client,
        core=hook.core_v1_client,
        namespace=hook.get_namespace() or DEFAULT_NAMESPACE,
        custom=hook.custom_object_client,
    )
    with _lock:
        return _cache.setdefault(conn_id, clients)


def forget(conn_id: str | None = None) -> None:
    """Drop cached clients (all of them without ``conn_id``)."""
    with _lock:
        if conn_id is None:
            _cache.clear()
        else:
            _cache.pop(conn_id, None)


def api_message(exc: BaseException) -> str:
    """The ``message`` of a Kubernetes Status body, else the exception text (short)."""
    import json

    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return str(data["message"])[:500]
        except (TypeError, ValueError):
            pass
    return str(exc).strip()[:500]
