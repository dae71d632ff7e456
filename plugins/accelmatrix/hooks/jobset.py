"""JobSet (``jobset.x-k8s.io/v1alpha2``) and Kueue Workload calls, on the provider's clients.

The ``kubernetes`` client has no typed API for custom resources: these wrap its
``CustomObjectsApi`` (built by the cncf-kubernetes ``KubernetesHook``, see ``hooks.k8s``) so
the backend names what it does (``create_jobset``) instead of repeating group, version and
plural at every call. They return the API's JSON dicts; errors stay ``ApiException`` so the
caller decides what a 404 or 409 means for it.
"""

from __future__ import annotations

from typing import Any

from accelmatrix.hooks.k8s import KubeClients

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
# Kueue labels the Workload it makes for a job with the job's uid.
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def create_jobset(clients: KubeClients, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return clients.custom.create_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, body
    )


def get_jobset(clients: KubeClients, ns: str, name: str) -> dict[str, Any]:
    return clients.custom.get_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, name
    )


def list_jobsets(clients: KubeClients, ns: str, label_selector: str = "") -> list[dict[str, Any]]:
    out = clients.custom.list_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, label_selector=label_selector
    )
    return list(out.get("items") or [])


def delete_jobset(clients: KubeClients, ns: str, name: str) -> dict[str, Any]:
    """Delete with ``Foreground`` propagation: child Jobs, pods and the Service go with it."""
    return clients.custom.delete_namespaced_custom_object(
        JOBSET_GROUP,
        JOBSET_VERSION,
        ns,
        JOBSET_PLURAL,
        name,
        propagation_policy="Foreground",
    )


def list_workloads(clients: KubeClients, ns: str, job_uid: str) -> list[dict[str, Any]]:
    """Kueue's Workload objects of one JobSet (by uid): where admission and eviction show."""
    out = clients.custom.list_namespaced_custom_object(
        KUEUE_GROUP,
        KUEUE_VERSION,
        ns,
        WORKLOAD_PLURAL,
        label_selector=f"{KUEUE_JOB_UID_LABEL}={job_uid}",
    )
    return list(out.get("items") or [])
