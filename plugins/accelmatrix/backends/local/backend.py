"""LocalBackend: cells run as processes on the Airflow worker host.

The embedded default: a fresh machine with no cloud account runs every example suite. The
"machine" is an isolated work dir plus a resource record (resource.json) carrying the same
labels a cloud resource would, so the janitor treats it like any other backend's resource.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from accelmatrix import settings
from accelmatrix.backends.base import (
    MANAGED_BY,
    Backend,
    CellContext,
    JobStatus,
    LogFn,
    ManagedResource,
    SetupFailed,
)
from accelmatrix.backends.local.collect import collect_globs
from accelmatrix.backends.local.processes import kill_process_group, pgid_alive, pid_alive
from accelmatrix.backends.local.record import (
    RECORD,
    exact_identity,
    make_work_dir,
    read_json,
    remove_empty_parents,
    update_record,
)
from accelmatrix.backends.local.service_process import start_service, wait_ready
from accelmatrix.backends.runner import RUNNER
from accelmatrix.backends.runner import status as runner_status
from accelmatrix.contracts.machine_records import (
    LocalHandle,
    LocalResource,
    ManagedDetail,
    ServiceSpec,
    StartedService,
)


class LocalBackend(Backend):
    kind = "local"

    # -- naming ------------------------------------------------------------------------------
    @staticmethod
    def work_dir_for(ctx: CellContext) -> Path:
        return (
            settings.work_root()
            / settings.safe_name(ctx.dag_id)
            / settings.safe_name(ctx.run_id)
            / settings.safe_name(ctx.cell_id)
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def provision(self, ctx: CellContext) -> LocalResource:
        work_dir = self.work_dir_for(ctx)
        record_path = work_dir / RECORD
        if record_path.exists():  # a retry finds the resource it created before
            return LocalResource.model_validate_json(record_path.read_text())
        created = not work_dir.exists()
        try:
            make_work_dir(work_dir)
            ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
            now = time.time()
            resource = LocalResource(
                name=str(work_dir),
                work_dir=str(work_dir),
                artifacts_dir=str(ctx.artifacts_dir),
                created_at=now,
                labels={
                    "managed-by": MANAGED_BY,
                    "dag": ctx.dag_id,
                    "run": ctx.run_id,
                    "cell": ctx.cell_id,
                    "ttl": str(int(now + ctx.ttl_seconds)),
                    **ctx.labels,
                },
            )
            tmp = record_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(resource.to_json()))
            os.replace(tmp, record_path)
            return resource
        except BaseException:
            # Airflow skips a teardown whose setup task failed: undo what we created here.
            if created:
                shutil.rmtree(work_dir, ignore_errors=True)
            raise

    def variables(self, resource: LocalResource) -> dict[str, str]:
        return {
            "work_dir": resource.work_dir,
            "include_dir": str(settings.include_dir()),
            "python": sys.executable,
            "num_workers": "1",
        }

    def _env(self, resource: LocalResource, env: dict[str, str]) -> dict[str, str]:
        # The worker's environment minus Airflow's own variables: a workload that echoes its
        # environment must not print the metadata DB URL, a JWT secret or a connection, nor
        # learn where airflow.cfg lives (AIRFLOW_HOME, AIRFLOW_CONFIG). Only the task context
        # (AIRFLOW_CTX_*: dag, run, task ids) is passed on.
        base = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith(("AIRFLOW", "_AIRFLOW")) and not k.startswith("AIRFLOW_CTX_"))
            and k not in ("ACCELMATRIX_RESULTS_URL",)
        }
        base.update(env)
        base["ACCELMATRIX_WORK_DIR"] = resource.work_dir
        return base

    def setup(
        self,
        resource: LocalResource,
        commands: list[list[str]],
        env: dict[str, str],
        timeout: int,
        log: LogFn,
    ) -> None:
        log_path = Path(resource.artifacts_dir) / "setup.log"
        record_path = Path(resource.work_dir) / RECORD
        # The setup commands run in groups of their own: when the task process is killed
        # (OOM, SIGKILL, a lost worker) a command lives on. Its group is recorded while it
        # runs, so a retried setup or the teardown stops it instead of leaking it.
        _stop_earlier_setup(record_path)
        deadline = time.monotonic() + timeout
        with open(log_path, "a", encoding="utf-8") as setup_log:
            for i, argv in enumerate(commands):
                log(f"setup[{i}]: {argv}")
                setup_log.write(f"$ {argv}\n")
                try:
                    proc = subprocess.Popen(  # noqa: S603 (argv list, no shell)
                        argv,
                        cwd=resource.work_dir,
                        env=self._env(resource, env),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        text=True,
                        errors="replace",
                    )
                except OSError as e:
                    raise SetupFailed(f"setup[{i}] {argv[:1]} could not start: {e}") from None
                update_record(record_path, setup_pgid=proc.pid)
                timer = threading.Timer(
                    max(0.0, deadline - time.monotonic()), kill_process_group, (proc.pid, 2.0)
                )
                timer.start()
                tail: list[str] = []
                try:
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        line = line.rstrip("\n")
                        log(line)
                        setup_log.write(line + "\n")
                        tail = (tail + [line])[-20:]
                    code = proc.wait()
                finally:
                    timer.cancel()
                update_record(record_path, setup_pgid=None)
                if time.monotonic() >= deadline and code != 0:
                    raise SetupFailed(f"setup[{i}] {argv} timed out after {timeout}s")
                if code != 0:
                    raise SetupFailed(
                        f"setup[{i}] {argv} exited with {code}; last lines:\n" + "\n".join(tail)
                    )

    def start_services(
        self,
        resource: LocalResource,
        services: list[ServiceSpec],
        env: dict[str, str],
        log: LogFn,
    ) -> list[StartedService]:
        record_path = Path(resource.work_dir) / RECORD
        # A retried setup stops what the earlier attempt started instead of leaking it.
        for old in (read_json(record_path) or {}).get("services", []):
            if old.get("pgid") and pgid_alive(old["pgid"]):
                kill_process_group(old["pgid"], 2.0)
        started: list[StartedService] = []
        for svc in services:
            info = start_service(resource, svc, self._env(resource, env))
            started.append(info)
            # Recorded before waiting, so a teardown after a crash here still stops it.
            update_record(record_path, services=[s.to_json() for s in started])
            log(f"service {svc.name}: started pid {info.pid}: {svc.run}")
            try:
                port = wait_ready(resource, svc, info)
            except SetupFailed:
                for s in started:
                    if pgid_alive(s.pgid):
                        kill_process_group(s.pgid, 2.0)
                raise
            info.port = port
            update_record(record_path, services=[s.to_json() for s in started])
            log(f"service {svc.name}: ready on 127.0.0.1:{port}")
        return started

    def submit(self, resource: LocalResource, argv: list[str], env: dict[str, str]) -> LocalHandle:
        log_dir = Path(resource.artifacts_dir)
        status_path = log_dir / "status.json"

        def handle(pid: int, pgid: int, reattached: bool) -> LocalHandle:
            return LocalHandle(
                work_dir=resource.work_dir,
                log_path=str(log_dir / "output.log"),
                status_path=str(status_path),
                pid=pid,
                pgid=pgid,
                reattached=reattached,
            )

        status = read_json(status_path)
        if status and status.get("exit_code") is None and pid_alive(status["pid"]):
            return handle(status["pid"], status["pgid"], reattached=True)
        # A previous attempt's output is kept beside the new one, never overwritten.
        for name in ("output.log", "stdout.log", "stderr.log", "status.json", "resources.jsonl"):
            p = log_dir / name
            if p.exists():
                p.rename(log_dir / f"{name}.{int(time.time() * 1000)}")
        proc = subprocess.Popen(  # noqa: S603 (argv list, no shell)
            [sys.executable, str(RUNNER), "--log-dir", str(log_dir), "--cwd", resource.work_dir]
            + ["--", *argv],
            cwd=resource.work_dir,
            env=self._env(resource, env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(log_dir / "runner.log", "ab"),  # noqa: SIM115
            start_new_session=True,  # own process group: survives the task, killable as one
            close_fds=True,
        )
        # Wait briefly for the runner's first status so poll() never sees "no status yet" as
        # a vanished runner.
        for _ in range(100):
            if status_path.exists():
                break
            time.sleep(0.02)
        return handle(proc.pid, proc.pid, reattached=False)

    def poll(self, handle: LocalHandle) -> JobStatus:
        status_path = Path(handle.status_path)
        return runner_status.judge(lambda: read_json(status_path), lambda: pid_alive(handle.pid))

    def read_logs(self, handle: LocalHandle, offset: int) -> tuple[list[str], int]:
        try:
            with open(handle.log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read(1 << 20)
        except FileNotFoundError:
            return [], offset
        end = chunk.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = chunk[: end + 1]
        lines = chunk.decode("utf-8", errors="replace").splitlines()
        return lines, offset + len(chunk)

    def cancel(self, handle: LocalHandle) -> None:
        pgid = handle.pgid
        if pgid and pgid_alive(pgid):
            kill_process_group(pgid)

    def collect(self, resource: LocalResource, globs: list[str], dest: Path) -> list[str]:
        return collect_globs(Path(resource.work_dir), globs, dest)

    def teardown(self, resource: LocalResource) -> None:
        status = read_json(Path(resource.artifacts_dir) / "status.json")
        if status and status.get("exit_code") is None and status.get("pgid"):
            if pgid_alive(status["pgid"]):
                kill_process_group(status["pgid"])
        # Services are read from the record on disk, not from the XCom copy of the resource:
        # they were started after provision returned it.
        _stop_earlier_setup(Path(resource.work_dir) / RECORD)
        record = read_json(Path(resource.work_dir) / RECORD) or {}
        for svc in record.get("services", []):
            if svc.get("pgid") and pgid_alive(svc["pgid"]):
                kill_process_group(svc["pgid"])
        shutil.rmtree(resource.work_dir, ignore_errors=True)
        remove_empty_parents(Path(resource.work_dir))

    def list_managed(self) -> list[ManagedResource]:
        out = []
        root = settings.work_root()
        if not root.exists():
            return out
        for record in root.glob(f"*/*/*/{RECORD}"):
            try:
                data = json.loads(record.read_text())
                # The record is what teardown needs; its labels hold the exact ids.
                resource = LocalResource.model_validate(
                    {
                        "name": str(record.parent),
                        **data,
                        "backend": self.kind,
                        "work_dir": str(record.parent),
                        "artifacts_dir": data.get("artifacts_dir")
                        or str(record.parent / ".orphan-artifacts"),
                    }
                )
            except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
                continue
            out.append(
                ManagedResource(
                    backend=self.kind,
                    name=data.get("name", str(record.parent)),
                    labels=data.get("labels", {}),
                    created_at=data.get("created_at"),
                    detail=ManagedDetail(
                        work_dir=str(record.parent),
                        identity=exact_identity(data.get("labels") or {}),
                        resource=resource,
                    ),
                )
            )
        return out


def _stop_earlier_setup(record_path: Path) -> None:
    """Kill a setup command an earlier (killed) setup task left running."""
    pgid = (read_json(record_path) or {}).get("setup_pgid")
    if isinstance(pgid, int) and pgid_alive(pgid):
        kill_process_group(pgid, 2.0)
        update_record(record_path, setup_pgid=None)
