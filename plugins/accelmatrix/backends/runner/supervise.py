"""Supervise one workload process, detached from the Airflow task that started it.

The run task starts this script in its own session (own process group) and then defers: the
task process exits, so nobody would be left to wait() on the workload and its exit status
would be lost. This runner waits for it and writes, atomically:

  status.json   {"pid", "pgid", "started_at", "ended_at", "exit_code", "state", "signal"}
  output.log    stdout and stderr interleaved as they arrive (what on-call reads)
  stdout.log, stderr.log
  resources.jsonl  one line per --sample-interval seconds: CPU %, RSS and process count of
                the workload's process group, plus GPU utilisation/memory where nvidia-smi
                exists ({"step", "t", "cpu_percent", "rss_mb", "procs", ...}); a last
                line {"final": true, "cpu_seconds", "peak_rss_mb", "wall_seconds"}

Standalone on purpose (stdlib only, run by file path): the workload's environment must not
need accelmatrix on its PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


class ResourceSampler(threading.Thread):
    """Samples the workload's process group from /proc while it runs (Linux; else a no-op).

    CPU % is CPU time used by the group's processes between two samples over the wall time
    between them (100 = one core busy). The runner itself is left out: it is ours, not the
    workload's. GPUs are sampled only where `nvidia-smi` exists; otherwise nothing is
    recorded for them and status.json says why (`gpu_sampling`).
    """

    def __init__(self, path: Path, interval: float, skip_pid: int):
        super().__init__(daemon=True, name="resource-sampler")
        self.path, self.interval, self.skip_pid = path, interval, skip_pid
        self.pgid = os.getpgid(0)
        self.stop_event = threading.Event()
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.page_mb = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / 2**20
        self.nvidia_smi = shutil.which("nvidia-smi")
        self.gpu_note = (
            f"sampled with {self.nvidia_smi}" if self.nvidia_smi else "no GPU: nvidia-smi not found"
        )
        self._cpu: dict[int, float] = {}

    def group(self) -> dict[int, tuple[float, float]]:
        """pid -> (CPU seconds, RSS MB) of every live process in the workload's group."""
        out: dict[int, tuple[float, float]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == self.skip_pid:
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # fields[0] is field 3 of proc(5): state; pgrp is 5, utime 14, stime 15, rss 24.
            if int(fields[2]) != self.pgid or fields[0] == "Z":
                continue
            cpu = (int(fields[11]) + int(fields[12])) / self.ticks
            out[int(entry.name)] = (cpu, int(fields[21]) * self.page_mb)
        return out

    def gpu(self) -> dict[str, float]:
        if not self.nvidia_smi:
            return {}
        try:
            res = subprocess.run(  # noqa: S603 (fixed argv)
                [
                    self.nvidia_smi,
                    "--query-gpu=utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=5,
            )
            rows = [[float(x) for x in line.split(",")] for line in res.stdout.splitlines() if line]
        except (OSError, ValueError, subprocess.SubprocessError):
            return {}
        if not rows:
            return {}
        return {
            "gpu_util_percent": sum(r[0] for r in rows) / len(rows),
            "gpu_mem_mb": sum(r[1] for r in rows),
        }

    def sample(self, step: int, dt: float) -> dict:
        now = self.group()
        used = sum(cpu - self._cpu.get(pid, 0.0) for pid, (cpu, _) in now.items())
        self._cpu = {pid: cpu for pid, (cpu, _) in now.items()}
        return {
            "step": step,
            "t": round(time.time(), 3),
            "cpu_percent": round(max(0.0, used) / dt * 100.0, 2) if dt > 0 else 0.0,
            "rss_mb": round(sum(rss for _, rss in now.values()), 2),
            "procs": len(now),
            **self.gpu(),
        }

    def finish(self, wall_seconds: float) -> None:
        """After the workload exited: its total CPU seconds and peak RSS, from the kernel's
        accounting of waited-for children (exact even for a run shorter than one interval)."""
        self.stop_event.set()
        self.join(timeout=5)
        try:
            import resource

            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        except (ImportError, OSError):
            return
        cpu = usage.ru_utime + usage.ru_stime
        final = {
            "final": True,
            "wall_seconds": round(wall_seconds, 3),
            "cpu_seconds": round(cpu, 3),
            # ru_maxrss is in KiB on Linux: the peak of the largest single process.
            "peak_rss_mb": round(usage.ru_maxrss / 1024.0, 2),
        }
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(final) + "\n")

    def run(self) -> None:
        if not os.path.isdir("/proc"):
            self.gpu_note += "; no /proc: CPU and memory not sampled"
            return
        step, last = 0, time.monotonic()
        wait = min(self.interval, 0.2)  # a first sample early: short workloads get one too
        with open(self.path, "a", encoding="utf-8") as out:
            while not self.stop_event.wait(wait):
                wait = self.interval
                now = time.monotonic()
                try:
                    out.write(json.dumps(self.sample(step, now - last)) + "\n")
                    out.flush()
                except (OSError, ValueError, IndexError):
                    pass  # a process vanished mid-read or /proc changed shape: skip
                step, last = step + 1, now


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
    ap.add_argument(
        "--sample-interval",
        type=float,
        default=1.0,
        help="seconds between resource samples (0 disables sampling)",
    )
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
        sampler = None
        if args.sample_interval > 0:
            sampler = ResourceSampler(
                log_dir / "resources.jsonl", args.sample_interval, skip_pid=os.getpid()
            )
            status["gpu_sampling"] = sampler.gpu_note
            write_status(status_path, status)
            sampler.start()
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
        if sampler is not None:
            sampler.finish(time.time() - status["started_at"])
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
