"""SshBackend: cells run on a host reached through an Airflow SSH connection.

The remote side mirrors LocalBackend so that both behave alike: the "machine" is a work dir
on the host, ``<work_root>/<dag>/<run>/<cell>``, holding a resource record (resource.json,
with the labels the janitor reads) and an internal ``.accelmatrix/`` dir with the same
stdlib-only runner (``backends/runner/supervise.py``) that supervises local workloads, its
logs and a copy of the include dir. The runner is started in its own session, so the
workload survives both the run task (which defers) and the SSH channel that started it.

Why these choices:

* Credentials only ever come from the Airflow connection (``ssh_conn_id``), never from the
  suite YAML, and no credential is written to a record, a handle or a log.
* A shell sees exactly one thing we send: a script on the channel's stdin, in which every
  argv element and env value is quoted (``shlex``). Nothing of it is on the remote command
  line either, so env values (tokens) do not show in ``ps`` on the host.
* poll/read_logs are single SFTP reads on a connection cached per process (see
  ``accelmatrix.hooks.ssh``): the triggerer calls them about once a second per cell.
* Processes are identified by their process group *and* by ``ACCELMATRIX_WORK_DIR=<work dir>``
  in their environment, so a recycled PID on a long-lived host is never killed by mistake.
* Logs live on the host until collect/teardown copy them into the local artifacts dir, where
  evaluation reads output.log and status.json exactly as for local cells.
* Workloads get the host's login environment plus the suite's env: nothing of the Airflow
  worker's environment (its secrets included) is forwarded.

Remote requirements: Linux with /proc, a POSIX sh, util-linux ``setsid``, ``nohup``, ``rm``,
and Python >= 3.10 as the machine's ``python`` (the runner runs on it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import shlex
import stat
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
from pydantic import BaseModel

from accelmatrix import settings
from accelmatrix.backends.base import (
    MANAGED_BY,
    Backend,
    BackendError,
    CellContext,
    InfrastructureError,
    JobStatus,
    LogFn,
    ManagedResource,
)
from accelmatrix.backends.local.record import exact_identity
from accelmatrix.backends.machines.ssh import SshMachine
from accelmatrix.backends.runner import RUNNER
from accelmatrix.backends.runner import status as runner_status
from accelmatrix.backends.ssh.remote import (
    _GLOB_PY,
    DEFAULT_WORK_ROOT,
    INTERNAL_DIR,
    READ_CHUNK,
    RECORD,
    ROTATED_LOGS,
    SUBMIT_WAIT_SECONDS,
    Remote,
    _argv,
    _checked_work_dir,
    _env_lines,
    _last_line,
    expand_work_root,
)
from accelmatrix.backends.ssh.setup import RemoteSetup
from accelmatrix.contracts.machine_records import ManagedDetail, SshHandle, SshResource, SshTarget
from accelmatrix.hooks.ssh import (
    DirectTarget,
    RemoteHost,
    get_direct_host,
    get_host,
)

logger = logging.getLogger(__name__)
# How long poll() keeps saying "running" while the host cannot be reached before it gives
# up with an infrastructure failure (a reboot or a network blip should not fail a cell).
UNREACHABLE_GRACE_SECONDS = 120.0

_unreachable_since: dict[str, float] = {}
_unreachable_lock = threading.Lock()


class SshBackend(Backend):
    kind = "ssh"

    machine: SshMachine

    def __init__(self, machine: SshMachine):
        super().__init__(machine)
        if not machine.ssh_conn_id:
            raise BackendError("an ssh machine needs ssh_conn_id (an Airflow connection id)")
        self.conn_id: str = machine.ssh_conn_id
        self.python: str = machine.python or "python3"
        self.work_root: str = machine.work_root or DEFAULT_WORK_ROOT

    # -- helpers ----------------------------------------------------------------------------
    def host(self, resource_or_handle: SshResource | SshHandle | None = None) -> RemoteHost:
        # A record or handle names its own connection: a janitor or a later task may hold a
        # machine spec that was edited since, and must still reach the host the cell used.
        if resource_or_handle is None:
            return get_host(self.conn_id)
        if resource_or_handle.ssh_target:  # a machine we provisioned (DirectSshBackend)
            return get_direct_host(direct_target(resource_or_handle.ssh_target))
        return get_host(resource_or_handle.ssh_conn_id or self.conn_id)

    def remote(self, host: RemoteHost) -> Remote:
        """The primitives on ``host`` (reads, liveness, killing a group, logs)."""
        return Remote(host, self.python)

    def _root(self, host: RemoteHost) -> str:
        return expand_work_root(self.work_root, host.home() if "~" in self.work_root else "")

    # -- lifecycle ------------------------------------------------------------------------
    def work_dir_for(self, host: RemoteHost, ctx: CellContext) -> str:
        return posixpath.join(
            self._root(host),
            settings.safe_name(ctx.dag_id),
            settings.safe_name(ctx.run_id),
            settings.safe_name(ctx.cell_id),
        )

    def provision(self, ctx: CellContext) -> SshResource:
        host = self.host()
        work_dir = _checked_work_dir(self.work_dir_for(host, ctx))
        record_path = f"{work_dir}/{RECORD}"
        existing = self.remote(host).read_json(record_path)
        if existing is not None:  # a retry finds the resource it created before
            ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
            return SshResource.model_validate(existing)
        created = not host.exists(work_dir)
        internal = f"{work_dir}/{INTERNAL_DIR}"
        try:
            self.remote(host).check_python()
            host.makedirs(f"{internal}/logs")
            ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
            include_dir = self.remote(host).upload_include(f"{internal}/include")
            now = time.time()
            resource = SshResource(
                backend=self.kind,
                name=f"{self.conn_id}:{work_dir}",
                ssh_conn_id=self.conn_id,
                host=host.hostname,
                work_dir=work_dir,
                internal_dir=internal,
                log_dir=f"{internal}/logs",
                include_dir=include_dir,
                artifacts_dir=str(ctx.artifacts_dir),
                created_at=now,
                labels={
                    "managed-by": MANAGED_BY,
                    "dag": ctx.dag_id,
                    "run": ctx.run_id,
                    "cell": ctx.cell_id,
                    "ttl": str(int(now + ctx.ttl_seconds)),
                    "host": host.hostname,
                    **ctx.labels,
                },
            )
            host.write_atomic(record_path, json.dumps(resource.to_json()).encode())
            return resource
        except BaseException:
            # Airflow skips a teardown whose setup task failed: undo what we created here.
            if created:
                try:
                    host.execute(shlex.join(["rm", "-rf", "--", work_dir]), timeout=120)
                except Exception as e:  # the original error matters more than this one
                    logger.warning("could not remove %s after a failed provision: %s", work_dir, e)
            raise

    def variables(self, resource: SshResource) -> dict[str, str]:
        return {
            "work_dir": resource.work_dir,
            "include_dir": resource.include_dir,
            "python": self.python,
            "num_workers": "1",
        }

    def setup(
        self,
        resource: SshResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        RemoteSetup(self.remote(self.host(resource))).run(resource, commands, env, timeout, log)

    def submit(self, resource: SshResource, argv: list[str], env: dict[str, str]) -> SshHandle:
        host = self.host(resource)
        work_dir = _checked_work_dir(resource.work_dir)
        log_dir = resource.log_dir
        runner = f"{resource.internal_dir}/runner.py"
        status_path = f"{log_dir}/status.json"

        def handle(pid: int, pgid: int, reattached: bool) -> SshHandle:
            return SshHandle(
                backend=self.kind,
                ssh_conn_id=resource.ssh_conn_id or self.conn_id,
                ssh_target=resource.ssh_target,
                host=resource.host,
                work_dir=work_dir,
                log_dir=log_dir,
                log_path=f"{log_dir}/output.log",
                status_path=status_path,
                artifacts_dir=resource.artifacts_dir,
                pid=pid,
                pgid=pgid,
                reattached=reattached,
            )

        status = self.remote(host).read_json(status_path)
        if (
            status
            and status.get("exit_code") is None
            and isinstance(status.get("pid"), int)
            and self.remote(host).alive(status["pid"], work_dir)
        ):
            return handle(status["pid"], status["pgid"], reattached=True)
        command = _argv(argv)
        if status and status.get("exit_code") is None and isinstance(status.get("pgid"), int):
            # The runner died without a status (OOM killer, reboot of a container...): its
            # workload may live on in the group. Never run two copies side by side.
            self.remote(host).kill_group(status["pgid"], work_dir)
        host.makedirs(log_dir)
        stamp = int(time.time() * 1000)

        def rotate(s: Any) -> None:
            # A previous attempt's output is kept beside the new one, never overwritten.
            for name in ROTATED_LOGS:
                try:
                    s.posix_rename(f"{log_dir}/{name}", f"{log_dir}/{name}.{stamp}")
                except FileNotFoundError:
                    pass

        host.sftp(rotate)
        host.write_atomic(runner, RUNNER.read_bytes())
        runner_argv = [self.python, runner, "--log-dir", log_dir, "--cwd", work_dir, "--"]
        script = "\n".join(
            [
                f"cd -- {shlex.quote(work_dir)} || exit 126",
                *_env_lines(env, work_dir),
                f"setsid nohup {shlex.join(runner_argv)} {command} < /dev/null"
                f" >> {shlex.quote(log_dir + '/runner.log')} 2>&1 &",
                "printf '%s\\n' \"$!\"",
                "",
            ]
        )
        result = host.execute("exec sh -s", stdin=script.encode(), timeout=60)
        if result.exit_code != 0:
            raise InfrastructureError(
                f"could not start the workload on {host.hostname}: exit {result.exit_code}: "
                + result.text().strip()[-500:]
            )
        last = _last_line(result.stdout).strip()
        if not last.isdigit():
            raise InfrastructureError(
                f"starting the workload on {host.hostname} printed no PID: {result.text()[-500:]}"
            )
        bg_pid = int(last)
        deadline = time.monotonic() + SUBMIT_WAIT_SECONDS
        # Wait briefly for the runner's first status so poll() never sees "no status yet"
        # as a vanished runner.
        while time.monotonic() < deadline:
            status = self.remote(host).read_json(status_path)
            if status:
                return handle(status["pid"], status["pgid"], reattached=False)
            if not self.remote(host).alive(bg_pid, work_dir, verify=False):
                break
            time.sleep(0.05)
        status = self.remote(host).read_json(status_path)
        if status:
            return handle(status["pid"], status["pgid"], reattached=False)
        if self.remote(host).alive(bg_pid, work_dir, verify=False):  # slow host: still starting
            return handle(bg_pid, bg_pid, reattached=False)
        runner_log = (host.read(f"{log_dir}/runner.log") or b"").decode(errors="replace")
        raise InfrastructureError(
            f"the workload runner on {host.hostname} exited without a status: "
            + runner_log.strip()[-1000:]
        )

    def poll(self, handle: SshHandle) -> JobStatus:
        key = f"{handle.ssh_conn_id}:{handle.status_path}"
        try:
            status = self._poll(handle)
        except (OSError, EOFError, paramiko.SSHException) as e:
            return self._unreachable(key, handle, e)
        with _unreachable_lock:
            _unreachable_since.pop(key, None)
        return status

    def _unreachable(self, key: str, handle: SshHandle, e: BaseException) -> JobStatus:
        now = time.monotonic()
        with _unreachable_lock:
            since = _unreachable_since.setdefault(key, now)
        if now - since >= UNREACHABLE_GRACE_SECONDS:
            with _unreachable_lock:
                _unreachable_since.pop(key, None)
            return JobStatus(
                done=True,
                exit_code=None,
                detail=f"host {handle.host} unreachable for {now - since:.0f} s: {e}",
                infrastructure_failure=True,
            )
        logger.warning("cannot reach %s (will retry): %s", handle.host, e)
        return JobStatus(done=False, detail=f"host unreachable: {e}")

    def _poll(self, handle: SshHandle) -> JobStatus:
        remote = self.remote(self.host(handle))
        return runner_status.judge(
            lambda: remote.read_json(handle.status_path),
            lambda: remote.alive(handle.pid, handle.work_dir),
        )

    def read_logs(self, handle: SshHandle, offset: int) -> tuple[list[str], int]:
        try:
            chunk = self.host(handle).read(handle.log_path, offset, READ_CHUNK)
        except (OSError, EOFError, paramiko.SSHException) as e:  # a blip: retried next call
            logger.warning("cannot read the log on %s (will retry): %s", handle.host, e)
            return [], offset
        if not chunk:
            return [], offset
        end = chunk.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = chunk[: end + 1]
        return chunk.decode("utf-8", errors="replace").splitlines(), offset + len(chunk)

    def cancel(self, handle: SshHandle) -> None:
        if not handle.pgid:
            return
        self.remote(self.host(handle)).kill_group(handle.pgid, handle.work_dir)

    def collect(self, resource: SshResource, globs: list[str], dest: Path) -> list[str]:
        host = self.host(resource)
        work_dir = _checked_work_dir(resource.work_dir)
        self.remote(host).fetch_logs(resource)
        dest.mkdir(parents=True, exist_ok=True)
        if not globs:
            return []
        result = host.execute(
            shlex.join([self.python, "-", work_dir, INTERNAL_DIR, json.dumps(globs)]),
            stdin=_GLOB_PY.encode(),
            timeout=300,
        )
        if result.exit_code != 0:
            raise BackendError(
                f"listing artifacts on {host.hostname} failed: exit {result.exit_code}: "
                + result.text().strip()[-500:]
            )
        listing = json.loads(_last_line(result.stdout))
        for rel in listing["refused"]:
            logger.warning("not collected (outside the work dir): %s", rel)
        root = dest.resolve()
        copied = []
        with host.bulk_sftp() as sftp:
            for rel, real in sorted(listing["found"].items()):
                target = (dest / rel).resolve()
                if not target.is_relative_to(root):
                    logger.warning("not collected (would land outside %s): %s", dest, rel)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                sftp.get(real, str(target))
                st = sftp.stat(real)
                if st.st_mtime is not None:
                    os.utime(target, (st.st_atime or st.st_mtime, st.st_mtime))
                copied.append(rel)
        return sorted(set(copied))

    def teardown(self, resource: SshResource) -> None:
        host = self.host(resource)
        work_dir = _checked_work_dir(resource.work_dir)
        if not host.exists(work_dir):
            return
        status = self.remote(host).read_json(f"{resource.log_dir}/status.json")
        if status and status.get("exit_code") is None and status.get("pgid"):
            self.remote(host).kill_group(int(status["pgid"]), work_dir)
        RemoteSetup(self.remote(host)).stop_earlier(resource, work_dir, logger.info)
        try:
            self.remote(host).fetch_logs(resource)
        except OSError as e:  # the artifacts are a courtesy here; releasing the host is not
            logger.warning("could not copy the logs of %s: %s", work_dir, e)
        result = host.execute(shlex.join(["rm", "-rf", "--", work_dir]), timeout=300)
        if result.exit_code != 0:
            raise BackendError(
                f"could not remove {work_dir} on {host.hostname}: {result.text().strip()[-500:]}"
            )

    def list_managed(self) -> list[ManagedResource]:
        host = self.host()
        root = self._root(host)

        def op(s: Any) -> list[tuple[str, bytes]]:
            out: list[tuple[str, bytes]] = []

            def subdirs(path: str) -> list[str]:
                try:
                    entries = s.listdir_attr(path)
                except FileNotFoundError:
                    return []
                return [
                    f"{path}/{e.filename}"
                    for e in entries
                    if stat.S_ISDIR(e.st_mode or 0) and e.filename not in (".", "..")
                ]

            for dag in subdirs(root):
                for run in subdirs(dag):
                    for cell in subdirs(run):
                        try:
                            with s.open(f"{cell}/{RECORD}", "rb") as f:
                                out.append((cell, f.read()))
                        except FileNotFoundError:
                            continue
            return out

        managed = []
        for work_dir, raw in host.sftp(op):
            try:
                data = json.loads(raw)
                record = SshResource.model_validate(data)
            except ValueError:  # pydantic's ValidationError is one too
                continue
            managed.append(
                ManagedResource(
                    backend=self.kind,
                    name=data.get("name", f"{self.conn_id}:{work_dir}"),
                    labels=data.get("labels", {}),
                    created_at=data.get("created_at"),
                    detail=ManagedDetail(
                        work_dir=work_dir,
                        ssh_conn_id=self.conn_id,
                        identity=exact_identity(data.get("labels") or {}),
                        resource=record,
                    ),
                )
            )
        return managed


class DirectSshBackend(SshBackend):
    """The SSH machinery for a host accelmatrix provisioned itself (a TPU VM worker).

    Same remote layout, runner and process-group handling as SshBackend; only the way in
    differs: the worker's IP and the key generated for its node (``DirectTarget``) instead
    of an Airflow connection. The host key is pinned at provision (trust on first use) and
    travels in the resource and every handle as ``ssh_target``.
    """

    def __init__(
        self, target: DirectTarget, machine: BaseModel, *, python: str, work_root: str, kind: str
    ):
        # ``machine``: the machine the worker belongs to (a TPU VM's), for the record only.
        Backend.__init__(self, machine)
        self.kind = kind  # type: ignore[misc]  # resources and handles say which machine
        self.target = target
        self.conn_id = target.cache_key
        self.python = python
        self.work_root = work_root

    def host(self, resource_or_handle: SshResource | SshHandle | None = None) -> RemoteHost:
        t = resource_or_handle.ssh_target if resource_or_handle is not None else None
        return get_direct_host(direct_target(t) if t else self.target)

    def provision(self, ctx: CellContext) -> SshResource:
        host = self.host()
        pinned = self.target.host_key or host.server_host_key()
        resource = super().provision(ctx)
        resource.ssh_target = SshTarget.model_validate(
            dataclasses.asdict(dataclasses.replace(self.target, host_key=pinned))
        )
        return resource


def direct_target(target: SshTarget) -> DirectTarget:
    """The hook's address of a worker from the record's."""
    return DirectTarget(**target.model_dump())
