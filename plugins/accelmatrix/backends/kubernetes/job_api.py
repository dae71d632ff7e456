"""Creating, reattaching to and deleting a cell's Jobs and JobSets (and orphaned pods).

Names are deterministic from the cell, so a retried submit meets the object its previous
attempt created (409): it reattaches, unless that object already ended for infrastructure
reasons (image pull, unschedulable, eviction), which is what a retry is for: it is deleted
and created afresh. Deletes tolerate 404 everywhere (teardown is idempotent) and use
Background/Foreground propagation, because the API's default for Jobs orphans the pods.
How an existing object is judged is the caller's (``judge``): this module only talks to the API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from accelmatrix.backends.base import BackendError, InfrastructureError, JobStatus
from accelmatrix.backends.kubernetes.job_manifest import JOB_LABEL
from accelmatrix.hooks import jobset as jobset_api
from accelmatrix.hooks.k8s import KubeClients, api_message

logger = logging.getLogger(__name__)

DELETE_WAIT_SECONDS = 60.0


class JobApi:
    """The workload objects of cells in one namespace."""

    def __init__(self, clients: KubeClients, ns: str):
        self.clients = clients
        self.ns = ns

    # -- Jobs ------------------------------------------------------------------------------
    def create_or_reattach(
        self, body: dict[str, Any], judge: Callable[[Any], JobStatus]
    ) -> tuple[Any, bool]:
        """Create the Job; on 409 reuse it, unless ``judge`` finds it failed for
        infrastructure reasons. Returns (the Job, whether it was reattached to)."""
        from kubernetes.client.exceptions import ApiException

        ns = self.ns
        name = body["metadata"]["name"]
        for _ in range(2):
            try:
                return self.clients.batch.create_namespaced_job(ns, body), False
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
                job = self.clients.batch.read_namespaced_job(name, ns)
            except ApiException as e:
                if e.status == 404:  # deleted between the 409 and the read: create again
                    continue
                raise
            status = judge(job)
            if not (status.done and status.infrastructure_failure):
                return job, True
            logger.warning("Job %s/%s failed before (%s): recreating it", ns, name, status.detail)
            self.delete_job(name, wait=True)
        raise InfrastructureError(f"could not create Job {ns}/{name} (it keeps coming back)")

    def read_job(self, name: str) -> Any:
        """The Job, or None if it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.clients.batch.read_namespaced_job(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_job(self, name: str, wait: bool = False) -> bool:
        """Delete a Job and its pods; True if it existed. ``wait``: until it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.clients.batch.delete_namespaced_job(name, self.ns, propagation_policy="Background")
            existed = True
        except ApiException as e:
            if e.status != 404:
                raise
            existed = False
        deadline = time.monotonic() + DELETE_WAIT_SECONDS
        while wait and existed and time.monotonic() < deadline:
            try:
                self.clients.batch.read_namespaced_job(name, self.ns)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.2)
        return existed

    def delete_pods(self, job_name: str) -> None:
        """Delete every pod still labelled with the cell's Job (orphans of a deleted Job)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.clients.core.delete_collection_namespaced_pod(
                self.ns, label_selector=f"{JOB_LABEL}={job_name}"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    # -- JobSets ---------------------------------------------------------------------------
    def create_or_reattach_jobset(
        self, body: dict[str, Any], judge: Callable[[dict[str, Any]], JobStatus]
    ) -> tuple[dict[str, Any], bool]:
        """Create the JobSet; on 409 reuse it, unless ``judge`` finds it failed for
        infrastructure reasons. Returns (the JobSet, whether it was reattached to)."""
        from kubernetes.client.exceptions import ApiException

        ns = self.ns
        name = body["metadata"]["name"]
        for _ in range(2):
            try:
                return jobset_api.create_jobset(self.clients, ns, body), False
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
                js = jobset_api.get_jobset(self.clients, ns, name)
            except ApiException as e2:
                if e2.status == 404:
                    continue
                raise
            status = judge(js)
            if not (status.done and status.infrastructure_failure):
                return js, True
            logger.warning("JobSet %s/%s failed before (%s): recreating", ns, name, status.detail)
            self.delete_jobset(name, wait=True)
        raise InfrastructureError(f"could not create JobSet {ns}/{name} (it keeps coming back)")

    def read_jobset(self, name: str) -> dict[str, Any] | None:
        """The JobSet, or None if it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return jobset_api.get_jobset(self.clients, self.ns, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_jobset(self, name: str, wait: bool = False) -> bool:
        """Delete a JobSet (its child Jobs, pods and Service go with it); True if it existed."""
        from kubernetes.client.exceptions import ApiException

        try:
            jobset_api.delete_jobset(self.clients, self.ns, name)
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        deadline = time.monotonic() + DELETE_WAIT_SECONDS
        while wait and time.monotonic() < deadline:
            try:
                jobset_api.get_jobset(self.clients, self.ns, name)
            except ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.2)
        return True
