"""A real OpenSSH server on 127.0.0.1 for the SSH backend tests.

Why a real sshd and not a mock: the backend's contract with the host is shell quoting,
setsid/nohup detaching, process groups, /proc and SFTP semantics. Only the real server
(and the real login shell it spawns) shows whether those hold.

Key-only auth with freshly generated keys, all files in a temp dir, the server on a free
loopback port, stopped by its PID. The Airflow connection the backend uses is defined the
way an operator would: an ``AIRFLOW_CONN_<ID>`` variable in JSON, with the private key and
the server's host key (so host key checking is on, as it should be in production).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from needs import missing

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
CONN_ID = "accelmatrix_test_ssh"
SKIP_REASON = (
    f"{SSHD} is missing: install the OpenSSH server (apt-get install -y openssh-server) "
    "to run the SSH backend tests"
)


@dataclass
class SshServer:
    port: int
    user: str
    client_key: Path
    private_key: str
    host_public_key: str
    pid: int
    log_path: Path
    authorized_keys: Path
    conn_id: str = CONN_ID

    def connection(self, *, key_file: bool = False) -> dict:
        """An Airflow SSH connection (JSON form) to this server."""
        extra: dict = {
            "host_key": self.host_public_key,
            "look_for_keys": "false",
            "conn_timeout": 10,
        }
        if key_file:
            extra["key_file"] = str(self.client_key)
        else:
            extra["private_key"] = self.private_key
        return {
            "conn_type": "ssh",
            "host": "127.0.0.1",
            "port": self.port,
            "login": self.user,
            "extra": extra,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(  # noqa: S603 (fixed argv)
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "accelmatrix-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@contextmanager
def running_sshd(tmp: Path) -> Iterator[SshServer]:
    """Start sshd in the foreground (-D) with a private config; stop it by PID on exit."""
    if not os.path.exists(SSHD):
        missing("ssh", SKIP_REASON)
    tmp.mkdir(parents=True, exist_ok=True)
    host_key, client_key = tmp / "ssh_host_ed25519_key", tmp / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = tmp / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    if os.geteuid() == 0:
        # Privilege separation needs this directory; a fresh container may not have it.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log_path = tmp / "sshd.log"
    proc = None
    for _attempt in range(5):  # another test run may grab the free port before sshd does
        port = _free_port()
        config = tmp / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {tmp / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "Subsystem sftp internal-sftp",
                    "MaxSessions 50",
                    "MaxStartups 50:30:100",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        log_file = open(log_path, "ab")  # noqa: SIM115 (kept open for the server's lifetime)
        proc = subprocess.Popen(  # noqa: S603 (fixed argv)
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        log_file.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None and not _banner(port):
            time.sleep(0.05)
        if proc.poll() is None and _banner(port):
            break
        _stop(proc)
        proc = None
    if proc is None:
        pytest.fail(f"sshd did not start; its log:\n{log_path.read_text(errors='replace')}")
    server = SshServer(
        port=port,
        user=getpass.getuser(),
        client_key=client_key,
        private_key=client_key.read_text(),
        host_public_key=" ".join(host_key.with_suffix(".pub").read_text().split()[:2]),
        pid=proc.pid,
        log_path=log_path,
        authorized_keys=authorized,
    )
    try:
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # by PID: only the server we started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running sshd plus ``AIRFLOW_CONN_ACCELMATRIX_TEST_SSH`` pointing at it."""
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        var = f"AIRFLOW_CONN_{CONN_ID.upper()}"
        old = os.environ.get(var)
        os.environ[var] = json.dumps(server.connection())
        try:
            yield server
        finally:
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
