"""Start a workload service as a local process and wait until it answers.

A service is its own concept beside the cell lifecycle (``backend``). It runs in its
own session (own process group), so it outlives the setup task that started it and the
teardown can stop it and everything it spawned with one killpg.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from accelmatrix.backends.base import SetupFailed
from accelmatrix.backends.local.processes import pid_alive
from accelmatrix.contracts.machine_records import LocalResource, ServiceSpec, StartedService

POLL_SECONDS = 0.1


def start_service(resource: LocalResource, svc: ServiceSpec, env: dict[str, str]) -> StartedService:
    """Popen the service detached; its output goes to service-<name>.log in the artifacts."""
    log_path = Path(resource.artifacts_dir) / f"service-{svc.name}.log"
    port_file = Path(resource.work_dir) / svc.ready.port_file
    port_file.unlink(missing_ok=True)  # a stale port from an earlier attempt is not readiness
    with open(log_path, "ab") as out:
        try:
            proc = subprocess.Popen(  # noqa: S603 (argv list from a validated suite, no shell)
                svc.run,
                cwd=resource.work_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise SetupFailed(f"service {svc.name}: cannot start {svc.run[:1]}: {e}") from None
    return StartedService(
        name=svc.name,
        pid=proc.pid,
        pgid=proc.pid,
        log_path=str(log_path),
        started_at=time.time(),
    )


def wait_ready(resource: LocalResource, svc: ServiceSpec, info: StartedService) -> int:
    """Block until the port file holds a port and GET http_path answers 2xx; return the port."""
    ready = svc.ready
    port_file = Path(resource.work_dir) / ready.port_file
    deadline = time.monotonic() + ready.timeout
    last = "no port file yet"
    while time.monotonic() < deadline:
        if not pid_alive(info.pid):
            raise SetupFailed(
                f"service {svc.name} exited before it was ready; last lines of "
                f"{info.log_path}:\n{_tail(Path(info.log_path))}"
            )
        port = _read_port(port_file)
        if port is not None:
            url = f"http://127.0.0.1:{port}{ready.http_path}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (loopback)
                    if 200 <= resp.status < 300:
                        return port
                    last = f"GET {url} answered {resp.status}"
            except (urllib.error.URLError, OSError) as e:
                last = f"GET {url}: {e}"
        time.sleep(POLL_SECONDS)
    raise SetupFailed(
        f"service {svc.name} not ready after {ready.timeout} s ({last}); last lines of "
        f"{info.log_path}:\n{_tail(Path(info.log_path))}"
    )


def _read_port(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
