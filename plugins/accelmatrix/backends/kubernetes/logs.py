"""Pod logs kept whole: one ``follow`` stream per container, appended to a file as it comes.

A kubelet rotates a container's log at ``containerLogMaxSize`` (10 MiB by default) and
``GET pods/<pod>/log`` returns the *current* file only, so re-reading a log and slicing it at
a byte offset (what the backends did) loses everything before the last rotation, and a
poller that reads once a second loses what was written between its last read and the
rotation. A ``follow=true`` stream does not: the kubelet finishes the old file and goes on
with the new one. So each pod's log is spooled:

* ``ensure`` starts (once per process) a daemon thread that follows the container's log
  with ``timestamps=true`` and appends every line, timestamp stripped, to the spool file
  (``pods/<pod>.log`` in the cell's artifacts). Its position (the last line's timestamp,
  how many lines carried that timestamp, the file size) is saved beside it after every
  chunk, so whoever follows next resumes exactly: a stream that broke (API restart, a
  timeout), another process (the triggerer follows while the run waits, the worker's
  collect takes over) or a restarted triggerer reopens with ``sinceTime`` (whole seconds,
  all the API takes) and drops the lines it already has. An ``flock`` on the spool keeps
  one follower per container across the processes of one host.
* The live log (``read_logs``) is read from the spool at a byte offset: O(new bytes), no
  longer the whole log each second.
* ``settle`` waits until the follower saw the end of a container that has exited (the
  stream ends after its last line), so collect copies a complete file.

What is still lost, stated plainly: lines that rotated away while *nobody* followed (no
process of this host watched the pod, e.g. the triggerer was down for more than a whole log
file's worth of output); a resumed spool cannot see them, and says so in a line of its own
when the current file starts after its last line. A spool on a host other than the one
that collects (triggerer and worker on different machines) is not shared; the collecting
process then follows from the start of the current file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHUNK = 1 << 16
_threads: dict[str, threading.Thread] = {}
_threads_lock = threading.Lock()


def parse_ts(text: bytes | str) -> int | None:
    """RFC 3339 with up to 9 fractional digits (the kubelet trims zeros) -> ns since epoch."""
    s = text.decode() if isinstance(text, bytes) else text
    if not s.endswith("Z") or len(s) < 20:
        return None
    base, _, frac = s[:-1].partition(".")
    try:
        secs = int(datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None
    return secs * 1_000_000_000 + int((frac or "0")[:9].ljust(9, "0"))


def _since_time(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Spool:
    """One container's log on local disk, and where its follower stands."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        # Bookkeeping beside the artifacts, not among them (pods/ holds logs only).
        meta = self.path.parent.parent / ".log-spool"
        self.state_path = meta / f"{self.path.name}.state"
        self.lock_path = meta / f"{self.path.name}.lock"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict[str, Any]) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(self.state_path.name + ".part")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_path)

    @property
    def complete(self) -> bool:
        return bool(self.state().get("complete"))

    def error(self) -> str | None:
        return self.state().get("error")

    def read(self, offset: int) -> tuple[list[str], int]:
        """Complete lines after byte ``offset`` and the offset after them."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n")
        if end < 0:
            return [], offset
        chunk = data[: end + 1]
        return chunk.decode("utf-8", errors="replace").splitlines(), offset + len(chunk)

    def follow(self, open_stream: Callable[[str | None], Any]) -> bool | None:
        """Follow once: append what the stream brings. None when another process follows;
        else True (the stream ended) — the caller decides whether the container did."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            state = self.state()
            if state.get("complete"):
                return True
            last, dup, size = (
                state.get("last"),
                int(state.get("dup") or 0),
                int(state.get("size") or 0),
            )
            with open(self.path, "ab") as out:
                out.truncate(size)  # a follower that died after writing, before saving
            resp = open_stream(_since_time(last) if last else None)
            skip = dup  # lines stamped `last` we already have
            first = True
            buf = b""
            with open(self.path, "ab") as out:
                try:
                    for chunk in resp.stream(CHUNK, decode_content=False):
                        buf += chunk
                        cut = buf.rfind(b"\n") + 1
                        if not cut:
                            continue
                        lines, buf = buf[:cut].splitlines(), buf[cut:]
                        for line in lines:
                            stamp, _, text = line.partition(b" ")
                            ns = parse_ts(stamp)
                            if ns is None:  # not a timestamped line: keep it as it is
                                ns, text = last or 0, line
                            if first and last is not None and ns > last and size:
                                # Resumed, and the current file starts after our last line:
                                # what lay between rotated away while nobody followed.
                                gap = (
                                    "[accelmatrix: log lines may be missing here: the "
                                    "kubelet rotated the log while no process followed it]\n"
                                )
                                out.write(gap.encode())
                                size += len(gap)
                            first = False
                            if last is not None and ns < last:
                                continue
                            if last is not None and ns == last and skip > 0:
                                skip -= 1
                                continue
                            out.write(text + b"\n")
                            size += len(text) + 1
                            dup = dup + 1 if ns == last else 1
                            last = ns
                        out.flush()
                        self._save({"last": last, "dup": dup, "size": size})
                finally:
                    resp.release_conn()
            return True

    def mark(self, **fields: Any) -> None:
        state = self.state()
        state.update(fields)
        self._save(state)


def ensure(
    spool: Spool,
    open_stream: Callable[[str | None], Any],
    finished: Callable[[], bool | None],
) -> None:
    """Follow ``spool``'s container in a daemon thread of this process (once).

    ``open_stream(since_time)`` opens the follow stream (raises the API's error);
    ``finished()`` says whether the container's output has ended: True (exited, or the pod
    is gone), False (still running) or None (cannot tell). A 403 is kept as the spool's
    error (the callers turn it into a clear message).
    """
    if spool.complete:
        return
    key = str(spool.path)
    with _threads_lock:
        t = _threads.get(key)
        if t is not None and t.is_alive():
            return

        def run() -> None:
            from kubernetes.client.exceptions import ApiException

            while True:
                try:
                    done_before = finished()
                    followed = spool.follow(open_stream)
                    if followed is None:  # another process follows: look again later
                        if spool.complete:
                            return
                        time.sleep(1.0)
                        continue
                    if done_before:
                        # The container had exited before this stream opened: the stream
                        # brought all of its output. (Exited only meanwhile: one more pass
                        # picks up whatever a broken stream missed, then ends here.)
                        spool.mark(complete=True)
                        return
                    time.sleep(0.2)
                    continue
                except ApiException as e:
                    if e.status == 403:
                        spool.mark(error=f"403 {e.reason}: {e.body!r:.300}")
                        return
                    if e.status == 404:  # the pod is gone, and its log with it
                        spool.mark(complete=True)
                        return
                    if e.status == 400:  # the container has not started yet
                        time.sleep(1.5)
                    else:
                        logger.warning("following the log of %s: %s", spool.path.name, e)
                except Exception as e:  # noqa: BLE001 - a broken stream: resume
                    logger.warning("following the log of %s: %s", spool.path.name, e)
                time.sleep(0.5)

        t = threading.Thread(target=run, daemon=True, name=f"log-spool {spool.path.name}")
        _threads[key] = t
        t.start()


def settle(spool: Spool, timeout: float = 30.0) -> bool:
    """Wait until the follower has the whole log of an exited container (True)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if spool.complete or spool.error():
            return spool.complete
        time.sleep(0.05)
    return spool.complete


def link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` shows ``src`` (a hard link: no copy of a big log, and it grows with it)."""
    tmp = dest.with_name(f".{dest.name}.part")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
