"""Setup commands of the Kubernetes backends: a short setup Job, streamed, replaced on retry.

The contract runs setup as its own step before submit, with its own timeout and failure, so
the commands run in a Job of their own on the workload's pod template: one init container
per command and the last as the main container, in order, stopping at the first failure.
While it runs each container's log is streamed to the task log and ``setup.log``; a setup
Job an earlier attempt left behind is deleted first. ``SetupJob`` is given what it works
with: the manifest that renders the Job, the API that creates and deletes it, the pods that
judge it and the logs it streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from accelmatrix.backends.base import InfrastructureError, LogFn, SetupFailed
from accelmatrix.backends.kubernetes.job_api import JobApi
from accelmatrix.backends.kubernetes.job_manifest import JobManifest
from accelmatrix.backends.kubernetes.job_pods import JobPods
from accelmatrix.backends.kubernetes.pod_logs import PodLogs
from accelmatrix.contracts.machine_records import K8sResource

SETUP_POLL_SECONDS = (0.2, 2.0)  # first and longest wait between setup Job polls


class SetupJob:
    """The setup step of one cell (its resource record names the Job and namespace)."""

    def __init__(
        self,
        manifest: JobManifest,
        api: JobApi,
        pods: JobPods,
        logs: PodLogs,
        scheduling_timeout: float,
    ):
        self.manifest = manifest
        self.api = api
        self.pods = pods
        self.logs = logs
        self.scheduling_timeout = scheduling_timeout

    def run(
        self,
        resource: K8sResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        """Run ``commands`` in order; raise SetupFailed on the first failure."""
        if not commands:
            return
        clients = self.api.clients
        ns, name = resource.namespace, resource.setup_job_name
        names = [f"setup-{i}" for i in range(len(commands))]
        containers = [
            self.manifest.container(n, argv, env) for n, argv in zip(names, commands, strict=True)
        ]
        body = self.manifest.job_body(resource, name, "setup", containers[-1:], containers[:-1])
        timeout_s = self.scheduling_timeout
        # A setup Job left by an earlier attempt (its task was killed or timed out) may be
        # the very thing that hung: replace it, as the local and SSH backends stop theirs.
        # Setup commands run again on every attempt anyway; the run Job is reattached to.
        if self.api.delete_job(name, wait=True):
            log(f"deleted setup Job {ns}/{name} left by an earlier attempt")
        job, reattached = self.api.create_or_reattach(
            body, lambda j: self.pods.inspect(j, timeout_s)[0]
        )
        log(f"{'reattached to' if reattached else 'created'} setup Job {ns}/{name}")
        log_path = Path(resource.artifacts_dir) / "setup.log"
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
                        data = self.logs.read(pods[0].metadata.name, cname)
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
                    status, pods = self.pods.inspect(job, timeout_s, names)
                    stream(pods)
                    if status.done:
                        break
                    if time.monotonic() >= deadline:
                        raise SetupFailed(f"setup timed out after {timeout}s (Job {ns}/{name})")
                    time.sleep(pause)
                    pause = min(pause * 1.5, SETUP_POLL_SECONDS[1])
        except BaseException:
            self.api.delete_job(name)
            raise
        self.api.delete_job(name)
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
