"""One cached SSH connection per Airflow connection id and process, for the SSH backend.

Why a cache: WorkloadTrigger polls every running cell about once a second from the triggerer
(in threads, through asyncio.to_thread). An SSHHook per poll would cost a TCP connect, a key
exchange and an authentication per cell per second. Instead each process keeps one
authenticated paramiko transport per connection id, opens cheap channels on it (exec, SFTP)
and reconnects only when it has dropped.

Credentials come only from the Airflow connection, through the SSH provider's own
``SSHHook(ssh_conn_id=...)``: host, port, login, private key or key file, host key checking
and proxy settings are the connection's business. Nothing here logs or returns any of them.

The one other way in is a ``DirectTarget``: a machine accelmatrix created itself (a Cloud
TPU VM worker), reached by IP with the key pair generated for that machine and injected
through its metadata. Its host key is pinned on first contact (recorded in the resource), so
later connections of the same cell refuse a different host behind a recycled IP.
"""

from __future__ import annotations

import base64
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import paramiko

from accelmatrix.masking import mask_connection

log = logging.getLogger(__name__)

T = TypeVar("T")

# SSHHook waits 3-5 s between attempts: two attempts ride out a restarting sshd without
# stalling a poll thread for long. Tests lower it to 1 to see a dead host at once.
CONNECT_ATTEMPTS = 2
# A hung host must not block a triggerer thread forever.
SFTP_TIMEOUT = 30.0
# After a failed connect, calls fail at once for this long instead of each trying again:
# the triggerer runs polls in a small thread pool that a dead host must not monopolise.
RECONNECT_BACKOFF_SECONDS = 10.0
RECV_TICK = 0.2


class HostUnavailable(ConnectionError):
    """Connecting failed (refused, timed out, authentication, host key mismatch).

    Distinct from a connection that dropped mid-way: that one is worth one reconnect, this
    one already had its attempts.
    """


@dataclass
class ExecResult:
    """What a remote command did. ``exit_code`` is None when the channel closed without one."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False

    def text(self) -> str:
        return (self.stdout + self.stderr).decode("utf-8", errors="replace")


def _dropped(exc: BaseException, transport_active: bool) -> bool:
    """True if ``exc`` means the connection (not the remote operation) failed.

    An SFTP "no such file" or "failure" status on a healthy connection is the caller's
    business; a dead transport, an EOF or a timeout is ours and warrants one reconnect.
    """
    if isinstance(exc, paramiko.SSHException | EOFError | ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and not transport_active


@dataclass(frozen=True)
class DirectTarget:
    """A host accelmatrix provisioned itself: address, login and the path of its key.

    ``host_key`` ("ssh-ed25519 AAAA...") pins the server key seen on first contact; empty
    means "first contact: accept and record it" (a brand-new VM has no known host key).
    """

    host: str
    port: int
    user: str
    key_path: str
    host_key: str = ""

    @property
    def cache_key(self) -> str:
        return f"direct:{self.user}@{self.host}:{self.port}:{self.key_path}"

    def connect(self, timeout: float = 30.0) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.host_key:
            kind, _, b64 = self.host_key.partition(" ")
            key = paramiko.PKey.from_type_string(kind, base64.b64decode(b64.split()[0]))
            name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
            client.get_host_keys().add(name, kind, key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507 (TOFU, pinned after)
        pkey = paramiko.Ed25519Key.from_private_key_file(self.key_path)
        client.connect(
            self.host,
            port=self.port,
            username=self.user,
            pkey=pkey,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            look_for_keys=False,
            allow_agent=False,
        )
        return client


class RemoteHost:
    """A lazily (re)connected SSH client to the host of one Airflow SSH connection (or of one
    ``DirectTarget``)."""

    def __init__(self, conn_id: str, target: DirectTarget | None = None):
        self.conn_id = conn_id
        self.target = target
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._hostname = ""
        self._home: str | None = None
        self._has_proc: bool | None = None
        self._down_until = 0.0
        self._down_error = ""

    # -- connection -----------------------------------------------------------------------
    def _active(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    def client(self) -> paramiko.SSHClient:
        """The connected client, (re)connecting through the Airflow connection if needed."""
        with self._lock:
            if self._client is None or not self._active():
                self._close()
                if time.monotonic() < self._down_until:
                    raise HostUnavailable(
                        f"SSH connection {self.conn_id!r} failed moments ago: {self._down_error}"
                    )
                try:
                    self._client, self._hostname = self._connect()
                except (paramiko.SSHException, EOFError, OSError) as e:
                    self._down_until = time.monotonic() + RECONNECT_BACKOFF_SECONDS
                    self._down_error = f"{type(e).__name__}: {e}"
                    raise HostUnavailable(
                        f"cannot connect through SSH connection {self.conn_id!r}: "
                        f"{self._down_error}"
                    ) from e
            return self._client

    def _connect(self) -> tuple[paramiko.SSHClient, str]:
        if self.target is not None:
            return self.target.connect(), self.target.host
        from airflow.providers.ssh.hooks.ssh import SSHHook

        mask_connection(self.conn_id)
        hook = SSHHook(ssh_conn_id=self.conn_id, conn_retry_attempts=CONNECT_ATTEMPTS)
        return hook.get_conn(), hook.remote_host

    def server_host_key(self) -> str:
        """The server's host key as "type base64" (to pin it for later connections)."""
        key = self.client().get_transport().get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"

    @property
    def hostname(self) -> str:
        """The host name of the connection (a label on resources; never a credential)."""
        if not self._hostname:
            self.client()
        return self._hostname

    def _close(self) -> None:
        for thing in (self._sftp, self._client):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: S110 (closing a broken connection may fail; ignore)
                    pass
        self._sftp = None
        self._client = None

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- SFTP -----------------------------------------------------------------------------
    def sftp(self, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        """Run a short SFTP operation on the shared session; reconnect once if it dropped.

        The shared session is serialised by a lock (paramiko does not promise that one
        SFTPClient is safe across threads). Keep ``fn`` short: polls of other cells wait.
        """
        for attempt in (1, 2):
            try:
                with self._lock:
                    client = self.client()
                    if self._sftp is None or self._sftp.sock.closed:
                        self._sftp = client.open_sftp()
                        self._sftp.get_channel().settimeout(SFTP_TIMEOUT)
                    return fn(self._sftp)
            except HostUnavailable:
                raise
            except (paramiko.SSHException, EOFError, OSError) as e:
                with self._lock:
                    if attempt == 2 or not _dropped(e, self._active()):
                        raise
                    log.info("SSH connection %s dropped (%s); reconnecting", self.conn_id, e)
                    self._close()
        raise AssertionError("unreachable")

    @contextmanager
    def bulk_sftp(self) -> Iterator[paramiko.SFTPClient]:
        """A private SFTP session for long transfers, so they never hold up the polls."""
        sftp = self._open(lambda c: c.open_sftp())
        sftp.get_channel().settimeout(SFTP_TIMEOUT)
        try:
            yield sftp
        finally:
            sftp.close()

    def _open(self, opener: Callable[[paramiko.SSHClient], T]) -> T:
        """Open a channel; reconnect once if the cached transport turns out to be dead.

        Only opening is retried, never a command: a command must not run twice.
        """
        try:
            return opener(self.client())
        except HostUnavailable:
            raise
        except (paramiko.SSHException, EOFError, OSError) as e:
            with self._lock:
                if not _dropped(e, self._active()):
                    raise
                self._close()
            return opener(self.client())

    def read(self, path: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        """Bytes of a remote file from ``offset`` (None if it does not exist)."""

        def op(s: paramiko.SFTPClient) -> bytes | None:
            try:
                with s.open(path, "rb") as f:
                    if offset:
                        f.seek(offset)
                    return f.read(limit) if limit is not None else f.read()
            except FileNotFoundError:
                return None

        return self.sftp(op)

    def exists(self, path: str) -> bool:
        def op(s: paramiko.SFTPClient) -> bool:
            try:
                s.stat(path)
            except FileNotFoundError:
                return False
            return True

        return self.sftp(op)

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write via a temp file and a POSIX rename: readers never see half a file."""

        def op(s: paramiko.SFTPClient) -> None:
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            with s.open(tmp, "wb") as f:
                f.write(data)
            s.chmod(tmp, mode)
            s.posix_rename(tmp, path)

        self.sftp(op)

    def makedirs(self, path: str) -> None:
        def op(s: paramiko.SFTPClient) -> None:
            sftp_makedirs(s, path)

        self.sftp(op)

    def home(self) -> str:
        """The login user's home directory (SFTP starts there), to expand ``~/``."""
        if self._home is None:
            self._home = self.sftp(lambda s: s.normalize("."))
        return self._home

    def has_proc(self) -> bool:
        """Whether /proc is readable over SFTP (process checks without running a command)."""
        if self._has_proc is None:
            self._has_proc = self.exists("/proc/self/stat")
        return self._has_proc

    # -- commands -------------------------------------------------------------------------
    def execute(
        self,
        command: str,
        *,
        stdin: bytes = b"",
        timeout: float = 60.0,
        combine: bool = False,
        on_output: Callable[[bytes], None] | None = None,
        on_timeout: Callable[[], None] | None = None,
        kill_wait: float = 10.0,
    ) -> ExecResult:
        """Run ``command`` through the login shell, feed ``stdin``, collect its output.

        Past ``timeout`` seconds ``on_timeout`` is called (to kill what the command started;
        closing the channel would not) and the output is read ``kill_wait`` seconds more.
        """
        chan = self._open(lambda c: c.get_transport().open_session(timeout=SFTP_TIMEOUT))
        out, err = bytearray(), bytearray()
        timed_out = False
        try:
            chan.set_combine_stderr(combine)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            chan.settimeout(RECV_TICK)
            deadline = time.monotonic() + timeout
            eof = False
            while True:
                if not eof:
                    try:
                        data = chan.recv(65536)
                    except TimeoutError:
                        data = None
                    if data == b"":
                        eof = True
                    elif data:
                        out += data
                        if on_output is not None:
                            on_output(data)
                else:
                    chan.status_event.wait(RECV_TICK)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if eof and chan.exit_status_ready():
                    break
                if time.monotonic() >= deadline:
                    if timed_out:
                        break
                    timed_out = True
                    if on_timeout is not None:
                        on_timeout()
                    deadline = time.monotonic() + kill_wait
            code = chan.recv_exit_status() if chan.exit_status_ready() else None
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
        finally:
            chan.close()
        if code == -1:  # paramiko's "no exit status was sent" (the connection dropped)
            code = None
        return ExecResult(code, bytes(out), bytes(err), timed_out)


def sftp_makedirs(s: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP (which has no recursive mkdir), tolerating concurrent creation."""
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = f"{current.rstrip('/')}/{part}" if current else part
        try:
            attrs = s.stat(current)
        except FileNotFoundError:
            try:
                s.mkdir(current)
            except OSError:
                # Created meanwhile by a concurrent provision of a sibling cell: fine if a dir.
                if not stat.S_ISDIR(s.stat(current).st_mode or 0):
                    raise
            continue
        if not stat.S_ISDIR(attrs.st_mode or 0):
            raise NotADirectoryError(f"{current} exists on the host and is not a directory")


# -- the per-process cache ----------------------------------------------------------------
_HOSTS: dict[str, RemoteHost] = {}
_HOSTS_LOCK = threading.Lock()
_HOSTS_PID = os.getpid()


def get_host(conn_id: str) -> RemoteHost:
    """The process's RemoteHost for ``conn_id`` (thread-safe, created on first use)."""
    global _HOSTS_PID
    with _HOSTS_LOCK:
        if os.getpid() != _HOSTS_PID:
            # Forked: the parent's transports run in threads we do not have, and closing them
            # here would send a disconnect on the parent's socket. Forget them, do not close.
            _HOSTS.clear()
            _HOSTS_PID = os.getpid()
        host = _HOSTS.get(conn_id)
        if host is None:
            host = _HOSTS[conn_id] = RemoteHost(conn_id)
        return host


def get_direct_host(target: DirectTarget) -> RemoteHost:
    """The process's RemoteHost for a machine accelmatrix provisioned (see DirectTarget)."""
    global _HOSTS_PID
    with _HOSTS_LOCK:
        if os.getpid() != _HOSTS_PID:
            _HOSTS.clear()
            _HOSTS_PID = os.getpid()
        old = host = _HOSTS.get(target.cache_key)
        if host is None or host.target != target:  # new, or its host key got pinned since
            host = _HOSTS[target.cache_key] = RemoteHost(target.cache_key, target)
    if old is not None and old is not host:
        old.close()
    return host


def forget_direct_hosts(key_path: str) -> None:
    """Close and forget the connections made with ``key_path`` (its machine is gone)."""
    with _HOSTS_LOCK:
        gone = [k for k, h in _HOSTS.items() if h.target and h.target.key_path == key_path]
        hosts = [_HOSTS.pop(k) for k in gone]
    for host in hosts:
        host.close()


def close_all() -> None:
    """Close every cached connection (tests use it to act like a fresh process)."""
    with _HOSTS_LOCK:
        hosts = list(_HOSTS.values())
        _HOSTS.clear()
    for host in hosts:
        host.close()
