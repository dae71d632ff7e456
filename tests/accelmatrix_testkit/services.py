"""PostgreSQL and Redis servers for tests and benches: Debian's binaries, loopback only.

The CeleryExecutor deployment (docker-compose.yaml) keeps Airflow's metadata and accelmatrix's
results in PostgreSQL and queues tasks through Redis. ``PostgresServer`` and ``RedisServer``
start the same kinds of server from the distribution's packages, each in a temporary
directory, on 127.0.0.1 and a free port, and stop them by PID (SIGKILL after a grace
period). Nothing is ever written outside their directory, nothing persists::

    with PostgresServer() as pg, RedisServer() as redis:
        pg.url("airflow")          # postgresql+psycopg2://airflow:<pw>@127.0.0.1:<port>/airflow
        redis.url                  # redis://127.0.0.1:<port>/0

PostgreSQL refuses to run as root. Under root the cluster directory is owned by the
``postgres`` system user and ``initdb``/``postgres`` run as that user through ``setpriv``,
which ``exec``s (no intermediate process: the PID we hold is the postmaster's). The
superuser is ``airflow`` with a random password (scram on TCP); the Unix socket lives in the
private directory. Durability is switched off (fsync, synchronous_commit): these databases
live for one test.

When a binary is missing the constructors raise ``ServiceUnavailable`` (tests turn it into
``pytest.skip``; ``.ci/run`` installs the packages).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from accelmatrix_testkit.airflow_stack import free_port

PG_BIN_DIRS = tuple(f"/usr/lib/postgresql/{v}/bin" for v in (17, 16, 15, 14, 13))
REDIS_SERVER = "redis-server"


class ServiceUnavailable(RuntimeError):
    """A server's binary is not installed (the caller skips)."""


def find_pg_bin() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``: $PG_BIN, PATH, then Debian's layout."""
    candidates = [os.environ.get("PG_BIN", "")]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    candidates.extend(PG_BIN_DIRS)
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "postgres").is_file():
            return Path(c)
    return None


def _stop_pid(proc: subprocess.Popen, first: int, grace: float) -> list[str]:
    """Signal ``proc`` (ours) with ``first``, SIGKILL it and its children after ``grace``."""
    killed: list[str] = []
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(first)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            killed.append(f"pid {proc.pid}")
            proc.kill()
            proc.wait(timeout=10)
    # A postmaster's backends leave by themselves once it is gone; a SIGKILLed one may not.
    for c in children:
        with contextlib.suppress(psutil.Error):
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                killed.append(f"pid {c.pid}")
                c.kill()
    return killed


def _wait_port(proc: subprocess.Popen, port: int, timeout: float, log: Path, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in {timeout} s")


class PostgresServer:
    """A throw-away PostgreSQL cluster on 127.0.0.1 with the given databases."""

    user = "airflow"

    def __init__(
        self,
        databases: tuple[str, ...] = ("airflow", "accelmatrix"),
        *,
        max_connections: int = 300,
        stop_grace: float = 10.0,
        startup_timeout: float = 60.0,
    ):
        self.bin = find_pg_bin()
        if self.bin is None:
            raise ServiceUnavailable(
                "PostgreSQL server binaries (initdb, postgres) not found: "
                "apt-get install -y postgresql, or set PG_BIN"
            )
        self.databases = databases
        self.max_connections = max_connections
        self.stop_grace = stop_grace
        self.startup_timeout = startup_timeout
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.killed: list[str] = []

    # The postgres binaries refuse uid 0: drop to the ``postgres`` system user.
    def _as_owner(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam("postgres")
        except KeyError as e:
            raise ServiceUnavailable("running as root and there is no 'postgres' user") from e
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]

    def url(self, database: str = "airflow", driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        prefix = self._as_owner()
        self.dir = Path(tempfile.mkdtemp(prefix="accelmatrix-pg-"))
        if prefix:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data, sock = self.dir / "data", self.dir / "sock"
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if prefix:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        pwfile.chmod(0o600)
        init = subprocess.run(  # noqa: S603 (argv list)
            [
                *prefix,
                str(self.bin / "initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        pwfile.unlink()
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        (sock).mkdir()
        if prefix:
            os.chown(sock, pw.pw_uid, pw.pw_gid)
        for _attempt in range(3):  # the free port may be taken before postgres binds it
            self.port = free_port()
            if self._spawn():
                break
        if self.proc is None:
            log = self.dir / "postgres.log"
            raise RuntimeError(f"postgres did not start:\n{log.read_text(errors='replace')}")
        self._create_databases()

    def _spawn(self) -> bool:
        """Start postgres on ``self.port`` over the existing data dir; whether it listens."""
        assert self.dir is not None
        log = self.dir / "postgres.log"
        out = open(log, "ab")  # noqa: SIM115 (the child keeps its own descriptor)
        self.proc = subprocess.Popen(  # noqa: S603 (argv list)
            [
                *self._as_owner(),
                str(self.bin / "postgres"),
                "-D",
                str(self.dir / "data"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.dir / "sock"),
                "-c",
                f"max_connections={self.max_connections}",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        try:
            _wait_port(self.proc, self.port, self.startup_timeout, log, "postgres")
        except RuntimeError:
            self.killed += _stop_pid(self.proc, signal.SIGINT, self.stop_grace)
            self.proc = None
            return False
        return True

    def take_down(self) -> None:
        """Stop the server as an outage would (fast shutdown: clients are disconnected, new
        connections refused), keeping its data and port for ``bring_up()``."""
        if self.proc is not None:
            self.killed += _stop_pid(self.proc, signal.SIGINT, self.stop_grace)
            self.proc = None

    def bring_up(self) -> None:
        """Start the server ``take_down()`` stopped, on the same port, with the same data;
        returns once it accepts connections."""
        import psycopg2  # noqa: PLC0415

        if self.proc is not None:
            return
        if not self._spawn():
            raise RuntimeError(f"postgres did not start again on port {self.port}")
        deadline = time.monotonic() + self.startup_timeout
        while True:  # listening is not accepting: it may still be recovering
            try:
                psycopg2.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=self.user,
                    password=self.password,
                    dbname="postgres",
                    connect_timeout=5,
                ).close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _create_databases(self) -> None:
        import psycopg2  # noqa: PLC0415 (only tests with PostgreSQL need the driver)

        deadline = time.monotonic() + self.startup_timeout
        while True:  # listening is not accepting: it may still be starting up
            try:
                conn = psycopg2.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=self.user,
                    password=self.password,
                    dbname="postgres",
                    connect_timeout=5,
                )
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for db in self.databases:
                    cur.execute(f'CREATE DATABASE "{db}"')
        finally:
            conn.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnects clients), SIGKILL after the grace; rm the dir."""
        if self.proc is not None:
            self.killed += _stop_pid(self.proc, signal.SIGINT, self.stop_grace)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class RedisServer:
    """redis-server on 127.0.0.1 and a free port, no persistence (the compose broker)."""

    def __init__(self, *, stop_grace: float = 10.0, startup_timeout: float = 30.0):
        self.bin = shutil.which(REDIS_SERVER)
        if self.bin is None:
            raise ServiceUnavailable("redis-server not found: apt-get install -y redis-server")
        self.stop_grace = stop_grace
        self.startup_timeout = startup_timeout
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.killed: list[str] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="accelmatrix-redis-"))
        log = self.dir / "redis.log"
        for _attempt in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(  # noqa: S603 (argv list)
                [
                    str(self.bin),
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--protected-mode",
                    "yes",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.dir),
                    "--logfile",
                    str(log),
                    "--daemonize",
                    "no",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                _wait_port(self.proc, self.port, self.startup_timeout, log, "redis-server")
                if self.ping():
                    return
            except RuntimeError:
                pass
            self.killed += _stop_pid(self.proc, signal.SIGTERM, self.stop_grace)
            self.proc = None
        raise RuntimeError(f"redis-server did not start:\n{_read(log)}")

    def ping(self) -> bool:
        """RESP ``PING`` over a raw socket: True when the server answers ``+PONG``."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), 2) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.killed += _stop_pid(self.proc, signal.SIGTERM, self.stop_grace)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
