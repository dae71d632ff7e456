"""A real BigQuery emulator on loopback for the warehouse tests and bench: ``bqemulator``
(PyPI; BigQuery's REST API over DuckDB), in a venv of its own.

Its own venv because its pins conflict with Airflow's (fastapi, grpcio-tools); it is made on
first use from tests/bqemulator-requirements.txt (python3.11 -m venv, then uv), under a file
lock so parallel test workers make it once, and made again when that file changes.

``BigQueryEmulator`` runs it persistent (a DuckDB file in its own directory) on free ports
of 127.0.0.1, so a test can stop it (an outage) and start it again on the same port with
the same tables. Stopped by PID, SIGKILL after a grace period. ``HOME`` points into its
directory: DuckDB writes nothing to the real home.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from accelmatrix_testkit.airflow_stack import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-bqemulator"
REQUIREMENTS = ROOT / "tests" / "bqemulator-requirements.txt"
MAIN = Path(__file__).with_name("bqemulator_main.py")
PROJECT = "accelmatrix-test"

__all__ = ["BigQueryEmulator", "EmulatorVenvError", "ensure_venv", "PROJECT"]


class EmulatorVenvError(RuntimeError):
    """The emulator's venv could not be made (no python3.11, no package index)."""


def ensure_venv() -> Path:
    """The emulator venv's python, made (or remade) when missing or out of date."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements-sha256"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    lock_path = ROOT / ".venv-bqemulator.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == want:
            return python
        base = shutil.which("python3.11")
        if base is None:
            raise EmulatorVenvError("python3.11 not found (the emulator's venv needs it)")
        shutil.rmtree(VENV, ignore_errors=True)
        steps = [
            [base, "-m", "venv", str(VENV)],
            [str(python), "-m", "pip", "install", "-q", "uv==0.13.9"],
            [str(VENV / "bin" / "uv"), "pip", "install", "-q", "-r", str(REQUIREMENTS)],
        ]
        env = {**os.environ, "VIRTUAL_ENV": str(VENV)}
        for argv in steps:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)  # noqa: S603
            if done.returncode != 0:
                raise EmulatorVenvError(f"{' '.join(argv[:4])} failed:\n{done.stderr[-3000:]}")
        stamp.write_text(want)
        return python


class BigQueryEmulator:
    """``with BigQueryEmulator() as bq: bq.endpoint`` -> ``http://127.0.0.1:PORT``."""

    def __init__(self, *, startup_timeout: float = 60.0, stop_grace: float = 10.0):
        self.python = ensure_venv()
        self.dir = Path(tempfile.mkdtemp(prefix="bqemu-"))
        self.rest_port = free_port()
        self.grpc_port = free_port()
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "emulator.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def start(self) -> BigQueryEmulator:
        if self.proc is not None and self.proc.poll() is None:
            return self
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        argv = [
            str(self.python), str(MAIN), "start",
            "--rest-host", "127.0.0.1", "--rest-port", str(self.rest_port),
            "--grpc-host", "127.0.0.1", "--grpc-port", str(self.grpc_port),
            "--persistent", "--data-dir", str(data), "--project", PROJECT,
            "--log-level", "warning", "--log-format", "console",
        ]  # fmt: skip
        env = {**os.environ, "HOME": str(self.dir)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"bqemulator exited:\n{self.log.read_text(errors='replace')[-4000:]}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.endpoint}/healthz", timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"bqemulator did not answer on {self.endpoint} in {self.startup_timeout} s"
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGKILL: an outage, no goodbye); the data directory stays."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=self.stop_grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BigQueryEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
