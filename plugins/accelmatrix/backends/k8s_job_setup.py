"""Setup commands of the k8s-job backend: a short setup Job, streamed, replaced on retry.

The contract runs setup as its own step before submit, with its own timeout and failure, so
the commands run in a Job of their own on the workload's pod template: one init container
per command and the last as the main container, in order, stopping at the first failure.
While it runs each container's log is streamed to the task log and ``setup.log``; a setup
Job an earlier attempt left behind is deleted first. That is its own protocol, hence its own
module; ``JobSetup`` is a mixin of ``KubernetesJobBackend`` and uses its Job primitives
(``_create_or_reattach``, ``_delete_job``) and those of ``JobManifest`` and ``JobPods``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from accelmatrix.backends.base import InfrastructureError, LogFn, SetupFailed
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine

SETUP_POLL_SECONDS = (0.2, 2.0)  # first and longest wait between setup Job polls


class JobSetup:
    """``setup`` of KubernetesJobBackend (a mixin)."""

    machine: KubernetesJobMachine

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
