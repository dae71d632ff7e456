#!/usr/bin/env python
"""A small data-parallel training job: the local stand-in for an FSDP job on a cluster.

N worker processes (the "pods") train one model with torch.distributed over gloo on
127.0.0.1, like the cluster-validation job of the system accelmatrix replaces, and leave
behind what its success indicators need, so that accelmatrix can evaluate them instead of
a person reading the output:

* `worker K started at <epoch seconds>` per worker (all workers started within a cutoff);
* `step N loss: X samples/s/worker: Y` about twice a second (loss decreasing, hang
  detection, throughput = the SLOWEST worker's samples/s, agreed by all-reduce) and the
  same numbers in out/metrics.jsonl;
* checkpoints out/ckpt/step_N.pt every --checkpoint-every seconds (checkpoints saved);
* out/job_status.json in the shape of the original's status output: {timestamp,
  job_exists, pods_info, job_status{conditions, masterAddr, masterPort}}.

On a cluster (a `k8s-jobset` machine: one pod per worker) the launcher's environment decides
instead: with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK set, this process is worker RANK
of WORLD_SIZE and meets the others at the leader's address; nothing is forked.

`--mode quick|comprehensive` picks the training duration (the suite passes both). Failure
modes for the tests: `hang` (worker 1 stops answering collectives), `diverge` (gradient
ascent: the loss rises), `collective-timeout` (worker 1 is late to a collective and the
process group's timeout fires: a real gloo timeout error in the log).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

MASTER_ADDR = "127.0.0.1"
LOG_EVERY_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", choices=("quick", "comprehensive"), default="quick")
    p.add_argument("--quick-seconds", type=float, default=15)
    p.add_argument("--comprehensive-seconds", type=float, default=60)
    p.add_argument("--checkpoint-every", type=float, default=4.0, help="seconds")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--collective-timeout", type=float, default=600, help="seconds")
    p.add_argument("--fail-mode", choices=("none", "hang", "diverge", "collective-timeout"))
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    args = p.parse_args(argv)
    args.fail_mode = args.fail_mode or "none"
    if args.workers < 1:
        p.error("--workers must be >= 1")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def worker(
    rank: int, args: argparse.Namespace, port: int, duration: float, addr: str = MASTER_ADDR
) -> None:
    torch.set_num_threads(1)
    started = time.time()
    (args.out_dir / "pods" / f"worker-{rank}.json").write_text(
        json.dumps({"name": f"worker-{rank}", "pid": os.getpid(), "started_at": started})
    )
    print(f"worker {rank} started at {started:.3f} pid {os.getpid()}", flush=True)
    timeout = args.collective_timeout
    if args.fail_mode == "collective-timeout":
        timeout = 3.0
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=args.workers,
        timeout=timedelta(seconds=timeout),
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
    # diverge: clipped gradient ascent, so the loss rises steadily but stays finite.
    diverge = args.fail_mode == "diverge"
    opt = torch.optim.SGD(
        model.parameters(), lr=args.lr / 10 if diverge else args.lr, maximize=diverge
    )
    gen = torch.Generator().manual_seed(1000 + rank)
    true_w = torch.linspace(-1, 1, 64)

    step, t0 = 0, time.monotonic()
    last_log, last_ckpt, window_samples, window_start = t0, t0, 0, t0
    metrics = open(args.out_dir / "metrics.jsonl", "a") if rank == 0 else None  # noqa: SIM115
    (args.out_dir / "ckpt").mkdir(exist_ok=True)
    while True:
        elapsed = time.monotonic() - t0
        if rank == 1 and elapsed > duration / 3:
            if args.fail_mode == "hang":
                print("worker 1: simulating a stuck collective", flush=True)
                time.sleep(3600)
            if args.fail_mode == "collective-timeout":
                time.sleep(timeout * 2)
        x = torch.randn(args.batch_size, 64, generator=gen)
        y = x @ true_w + 0.05 * torch.randn(args.batch_size, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
        loss.backward()  # DDP all-reduces the gradients here
        if diverge:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        window_samples += args.batch_size
        now = time.monotonic()
        # One collective per step decides, for every worker alike, whether to log and stop
        # (rank 0's clock) and what the slowest worker's throughput was.
        sps = window_samples / max(now - window_start, 1e-9)
        flags = torch.tensor(
            [
                float(rank == 0 and now - last_log >= LOG_EVERY_S),
                float(rank == 0 and now - t0 >= duration),
                -sps,
            ]
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        log_now, stop, slowest = bool(flags[0]), bool(flags[1]), -float(flags[2])
        if log_now:
            if rank == 0:
                print(
                    f"step {step} loss: {loss.item():.6f} samples/s/worker: {slowest:.1f}",
                    flush=True,
                )
                metrics.write(
                    json.dumps(
                        {"step": step, "loss": loss.item(), "samples_per_s_per_worker": slowest}
                    )
                    + "\n"
                )
                metrics.flush()
            last_log, window_samples, window_start = now, 0, now
        if rank == 0 and now - last_ckpt >= args.checkpoint_every:
            torch.save(model.module.state_dict(), args.out_dir / "ckpt" / f"step_{step}.pt")
            print(f"checkpoint saved: ckpt/step_{step}.pt", flush=True)
            last_ckpt = now
        if stop:
            break
    if rank == 0:
        torch.save(model.module.state_dict(), args.out_dir / "ckpt" / f"step_{step}.pt")
        print(f"checkpoint saved: ckpt/step_{step}.pt", flush=True)
        print(f"Finished training run: {step} steps in {time.monotonic() - t0:.1f} s", flush=True)
        metrics.close()
    dist.destroy_process_group()


def job_status(args, port, procs, phase: str) -> dict:
    pods = []
    for rank, proc in enumerate(procs):
        info_path = args.out_dir / "pods" / f"worker-{rank}.json"
        info = (
            json.loads(info_path.read_text()) if info_path.exists() else {"name": f"worker-{rank}"}
        )
        code = proc.exitcode
        info["phase"] = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
        info["exit_code"] = code
        pods.append(info)
    conditions = [{"type": "Created", "status": "True"}]
    if pods and all("started_at" in p for p in pods):
        conditions.append({"type": "PodsRunning", "status": "True"})
    conditions.append({"type": phase, "status": "True"})
    return {
        "timestamp": datetime.now().isoformat(),
        "job_exists": True,
        "pods_info": pods,
        "job_status": {
            "conditions": conditions,
            "masterAddr": MASTER_ADDR,
            "masterPort": str(port),
        },
    }


def launched_rank() -> tuple[int, int, str, int] | None:
    """(rank, world, master address, port) when a multi-node launcher set them, else None."""
    env = os.environ
    if not all(env.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")):
        return None
    return int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    duration = args.quick_seconds if args.mode == "quick" else args.comprehensive_seconds
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "pods").mkdir(exist_ok=True)
    launched = launched_rank()
    if launched is not None:  # one pod of a multi-node job: this process is one worker
        rank, args.workers, addr, port = launched
        print(f"job: worker {rank} of {args.workers}, master {addr}:{port}", flush=True)
        worker(rank, args, port, duration, addr)
        return 0
    port = free_port()
    print(
        f"job: {args.workers} worker(s), mode {args.mode} ({duration:g} s), master {MASTER_ADDR}:{port}"
    )
    status_path = args.out_dir / "job_status.json"
    ctx = mp.get_context("fork")  # torch is already imported: workers start in milliseconds
    procs = [
        ctx.Process(target=worker, args=(r, args, port, duration)) for r in range(args.workers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)
    write_json(status_path, job_status(args, port, procs, "Running"))
    # Like a job controller: the job fails as soon as one worker fails (its peers would
    # otherwise wait on a collective that never completes).
    while any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                if p.is_alive():
                    p.kill()
            break
        time.sleep(0.2)
    for proc in procs:
        proc.join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    write_json(status_path, job_status(args, port, procs, "Failed" if failed else "Succeeded"))
    if failed:
        codes = {r: procs[r].exitcode for r in failed}
        print(f"job failed: worker exit codes {codes} (negative: killed by signal)", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
