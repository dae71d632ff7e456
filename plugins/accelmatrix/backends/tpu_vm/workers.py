"""Execution on a TPU VM's workers: setup, the workload, its logs and artifacts, over SSH.

A slice has one or more workers, each reached with ``DirectSshBackend`` (the SSH machinery of
``accelmatrix.backends.ssh`` with the node's own key). ``TpuWorkers`` fans every step out to
all of them, swaps worker 0's paths for each worker's, and while the workload runs looks at
the node every ``node_check_seconds`` so a preemption is an infrastructure failure, not a
test failure. It is apart from ``backend`` (the node's provisioning, teardown and naming
through the Cloud TPU API) because it talks to the workers, not to the API; the backend
hands it the machine, its kind and the hook it asks about the node.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from accelmatrix.backends.base import (
    BackendError,
    InfrastructureError,
    JobStatus,
    LogFn,
    SetupFailed,
)
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.ssh.backend import DirectSshBackend, direct_target
from accelmatrix.backends.tpu_vm.inventory import READY
from accelmatrix.contracts.machine_records import (
    SshHandle,
    SshResource,
    TpuVmHandle,
    TpuVmResource,
)
from accelmatrix.hooks.ssh import DirectTarget
from accelmatrix.hooks.tpu import TpuError, TpuVmHook

# A worker's record: its resource, or the handle of its part of the workload.
R = TypeVar("R", SshResource, SshHandle)

log = logging.getLogger("accelmatrix.backends.tpu_vm")

# When poll last looked at each node (the triggerer polls every cell about once a second;
# the node's state costs a gcloud run, so it is looked at every node_check_seconds).
_node_checked: dict[str, float] = {}
_node_checked_lock = threading.Lock()


class TpuWorkers:
    """The steps of a TPU VM cell that run on the slice's workers."""

    def __init__(self, machine: TpuVmMachine, kind: str, hook: TpuVmHook):
        self.machine = machine
        self.kind = kind
        self.hook = hook

    def backend_for(self, target: DirectTarget) -> DirectSshBackend:
        """The SSH backend of one worker (reached at ``target`` with the node's key)."""
        return DirectSshBackend(
            target,
            self.machine,
            python=self.machine.python,
            work_root=self.machine.work_root,
            kind=self.kind,
        )

    def of(self, records: list[R]) -> list[tuple[DirectSshBackend, R]]:
        """(worker backend, its record) for each worker's resource or handle."""
        out = []
        for r in records:
            if r.ssh_target is None:
                raise BackendError(f"TPU worker record {r.work_dir} names no SSH target")
            out.append((self.backend_for(direct_target(r.ssh_target)), r))
        return out

    # -- execution on the workers (over SSH) -------------------------------------------------
    def variables(self, resource: TpuVmResource) -> dict[str, str]:
        (b0, r0), *_ = self.of(resource.worker_resources)
        return {**b0.variables(r0), "num_workers": str(len(resource.workers))}

    def _for_worker(self, resource: TpuVmResource, i: int, value: Any) -> Any:
        """``value`` (argv, env) with worker 0's paths swapped for worker ``i``'s.

        Placeholders are rendered once, with worker 0's variables. On a real slice every
        worker has the same paths and this changes nothing; when several workers share one
        host (loopback tests), each has its own work dir and gets its own paths.
        """
        rs = resource.worker_resources
        swaps = [
            (getattr(rs[0], k), getattr(rs[i], k))
            for k in ("work_dir", "include_dir")
            if getattr(rs[0], k) != getattr(rs[i], k)
        ]
        if not swaps:
            return value
        if isinstance(value, str):
            for old, new in swaps:
                value = value.replace(old, new)
            return value
        if isinstance(value, list):
            return [self._for_worker(resource, i, v) for v in value]
        if isinstance(value, dict):
            return {k: self._for_worker(resource, i, v) for k, v in value.items()}
        return value

    def setup(
        self,
        resource: TpuVmResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        workers = self.of(resource.worker_resources)

        def run(i: int) -> None:
            b, r = workers[i]
            prefix = f"[worker {i}] " if len(workers) > 1 else ""
            b.setup(
                r,
                self._for_worker(resource, i, commands),
                self._for_worker(resource, i, env),
                timeout,
                lambda line: log(prefix + line),
            )

        errors = _in_parallel(run, len(workers))
        if errors:
            infra = [e for _, e in errors if isinstance(e, InfrastructureError)]
            text = "\n".join(f"worker {i}: {e}" for i, e in errors)
            if infra:
                raise InfrastructureError(f"setup lost TPU workers:\n{text}")
            raise SetupFailed(f"setup failed on {len(errors)} of {len(workers)} worker(s):\n{text}")

    def submit(self, resource: TpuVmResource, argv: list[str], env: dict[str, str]) -> TpuVmHandle:
        handles = []
        for i, (b, r) in enumerate(self.of(resource.worker_resources)):
            handles.append(
                b.submit(r, self._for_worker(resource, i, argv), self._for_worker(resource, i, env))
            )
        return TpuVmHandle(
            backend=self.kind,
            name=resource.name,
            zone=resource.zone or self.machine.zone,
            workers=handles,
            reattached=all(h.reattached for h in handles),
            node_check_seconds=self.machine.node_check_seconds,
        )

    def poll(self, handle: TpuVmHandle) -> JobStatus:
        workers = self.of(handle.workers)
        statuses = [b.poll(h) for b, h in workers]
        # A worker that died (non-zero exit, killed, unreachable) may have died with its
        # node: look at the node now, not at the next periodic check, or a preemption that
        # killed the workload would be recorded as a test failure instead of being retried.
        died = any(st.done and (st.exit_code != 0 or st.infrastructure_failure) for st in statuses)
        lost = self._node_lost(handle, force=died)
        if lost:
            self._cancel_quietly(handle)
            return JobStatus(done=True, detail=lost, infrastructure_failure=True)
        for i, st in enumerate(statuses):
            if st.done and st.infrastructure_failure:
                self._cancel_quietly(handle)
                return JobStatus(
                    done=True, detail=f"worker {i}: {st.detail}", infrastructure_failure=True
                )
        for i, st in enumerate(statuses):
            if st.done and st.exit_code != 0:
                if not all(s.done for s in statuses):
                    self._cancel_quietly(handle)  # its peers would wait for it forever
                return JobStatus(
                    done=True, exit_code=st.exit_code, detail=f"worker {i}: {st.detail}"
                )
        if all(st.done for st in statuses):
            return JobStatus(
                done=True, exit_code=0, detail=f"all {len(statuses)} worker(s) exited 0"
            )
        return JobStatus(done=False, detail="running")

    def _node_lost(self, handle: TpuVmHandle, force: bool = False) -> str | None:
        """Every node_check_seconds (at once when ``force``): a message if the node is no
        longer READY."""
        name, zone = handle.name, handle.zone
        now = time.monotonic()
        with _node_checked_lock:
            last = _node_checked.get(name)
            recent = last is not None and now - last < float(handle.node_check_seconds or 60)
            if recent and not force:
                return None
            _node_checked[name] = now
        try:
            with self.hook.authorized():
                node = self.hook.get_node(name, zone)
        except TpuError as e:  # the API is unreachable: not proof that the node is gone
            log.warning("could not check TPU node %s: %s", name, e)
            return None
        if node is None:
            return f"TPU node {name} in {zone} disappeared while the workload ran"
        if node.get("state") != READY:
            return f"TPU node {name} in {zone} was {node.get('state')} while the workload ran"
        return None

    def _cancel_quietly(self, handle: TpuVmHandle) -> None:
        try:
            self.cancel(handle)
        except Exception as e:  # the node may be gone with its processes
            log.warning("could not stop the workload on %s: %s", handle.name, e)

    def read_logs(self, handle: TpuVmHandle, offset: int) -> tuple[list[str], int]:
        (b0, h0), *_ = self.of(handle.workers)
        return b0.read_logs(h0, offset)

    def cancel(self, handle: TpuVmHandle) -> None:
        workers = self.of(handle.workers)
        errors = _in_parallel(lambda i: workers[i][0].cancel(workers[i][1]), len(workers))
        if errors:
            raise BackendError("; ".join(f"worker {i}: {e}" for i, e in errors))

    def collect(self, resource: TpuVmResource, globs: list[str], dest: Path) -> list[str]:
        workers = self.of(resource.worker_resources)
        for b, r in workers[1:]:  # each worker's own log, beside worker 0's
            b.remote(b.host(r)).fetch_logs(r)
        b0, r0 = workers[0]
        return b0.collect(r0, globs, dest)


def worker_artifacts_dir(artifacts_dir: Path, i: int) -> Path:
    return artifacts_dir if i == 0 else artifacts_dir / "workers" / str(i)


def _in_parallel(fn: Any, n: int) -> list[tuple[int, BaseException]]:
    """Run ``fn(i)`` for every worker; the errors, by worker index."""
    errors: list[tuple[int, BaseException]] = []

    def guarded(i: int) -> None:
        try:
            fn(i)
        except Exception as e:
            errors.append((i, e))

    with ThreadPoolExecutor(max_workers=max(1, min(n, 16))) as pool:
        list(pool.map(guarded, range(n)))
    return sorted(errors, key=lambda x: x[0])
