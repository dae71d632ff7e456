"""Supervise one workload process, detached from the Airflow task that started it.

The run task starts this script in its own session (own process group) and then defers: the
task process exits, so nobody would be left to wait() on the workload and its exit status
would be lost. This runner waits for it and writes, atomically:

  status.json   {"pid", "pgid", "started_at", "ended_at", "exit_code", "state", "signal"}
  output.log    stdout and stderr interleaved as they arrive (what on-call reads)
  stdout.log, stderr.log

Standalone on purpose (stdlib only, run by file path): the workload's environment must not
need accelmatrix on its PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def write_status(path: Path, status: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def pump(stream, own, combined, lock: threading.Lock, prefix: bytes) -> None:
    for line in iter(stream.readline, b""):
        own.write(line)
        own.flush()
        with lock:
            combined.write(prefix + line if prefix else line)
            combined.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-dir", required=True, type=Path)
    ap.add_argument("--cwd", required=True, type=Path)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    log_dir: Path = args.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    status_path = log_dir / "status.json"
    status = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "started_at": time.time(),
        "ended_at": None,
        "exit_code": None,
        "state": "running",
        "signal": None,
        "argv": cmd,
    }
    write_status(status_path, status)

    received: list[int] = []

    def on_signal(signum, _frame):
        # The whole process group gets the signal from cancel(); remember it for the record.
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    lock = threading.Lock()
    with (
        open(log_dir / "output.log", "ab") as combined,
        open(log_dir / "stdout.log", "ab") as out,
        open(log_dir / "stderr.log", "ab") as err,
    ):
        try:
            proc = subprocess.Popen(  # noqa: S603 (argv list from a validated suite, no shell)
                cmd, cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as e:
            msg = f"accelmatrix: cannot start {cmd[:1]}: {e}\n".encode()
            combined.write(msg)
            err.write(msg)
            status.update(exit_code=127, state="exited", ended_at=time.time())
            write_status(status_path, status)
            return 127
        threads = [
            threading.Thread(target=pump, args=(proc.stdout, out, combined, lock, b"")),
            threading.Thread(target=pump, args=(proc.stderr, err, combined, lock, b"")),
        ]
        for t in threads:
            t.start()
        while True:
            try:
                code = proc.wait()
                break
            except InterruptedError:
                continue
        for t in threads:
            t.join(timeout=10)
    status.update(
        exit_code=code,
        state="exited",
        ended_at=time.time(),
        signal=received[0] if received else (-code if code < 0 else None),
    )
    write_status(status_path, status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
