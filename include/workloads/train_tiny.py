#!/usr/bin/env python
"""A tiny, deterministic PyTorch CPU training run: the default workload of accelmatrix.

Why it exists: every layer of accelmatrix (spawning, log streaming, timeouts, artifact
collection, metric extraction, bounds checks) must be exercised end to end on a laptop or CI
runner without accelerators, downloads or minutes of compute. This script behaves like a
real training job in the ways the checks care about:

* one log line per step (``step 7 loss: 0.123456 step_time: 0.0021s samples/s: 30000.0``)
  and the ``Finished training run`` marker at the end;
* ``metrics.jsonl`` (one object per step) and ``train_metrics.json`` (a run summary);
* exactly one Chrome trace from ``torch.profiler`` (``trace.pt.trace.json``) whose
  ``ProfilerStep#N`` events give the step time, as the systems accelmatrix replaces do;
* injectable failures (``--fail-mode``) so crash, hang and divergence handling can be
  tested for real instead of with mocks;
* a data-parallel mode (``--world-size 2``): forked ranks on one host, gradients averaged
  with ``torch.distributed`` (gloo, loopback only), as a DDP job does. Rank 0 logs, writes
  the metrics and the trace; the run fails if any rank fails.
* a multi-node mode (``--rendezvous env``): this process is ONE rank of a job whose other
  ranks run elsewhere (the pods of a JobSet), told where to meet the torchrun way:
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (or ``NODE_RANK``) from the
  environment; gloo over TCP to the leader.

It is deliberately standalone (no accelmatrix import): a workload must run on a machine
that only has torch installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

HIDDEN = {"mlp": 64, "wide": 512}
IN_FEATURES = 32
DATASET_SIZE = 2048
TRACE_NAME = "trace.pt.trace.json"
# Large enough that SGD overshoots from the first step on: even with gradient clipping the
# loss jumps to ~1e13 and stays there (finite, so log regexes still match the numbers).
DIVERGE_LR = 1e4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(HIDDEN), default="mlp")
    p.add_argument("--hidden", type=int, default=None, help="hidden size; overrides --model")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=Path("."))
    p.add_argument("--profile-from-step", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument(
        "--fail-mode",
        choices=("none", "crash", "hang", "diverge"),
        default="none",
        help="inject a failure: crash (exception at step steps//2), hang (sleep forever at "
        f"step steps//2), diverge (lr={DIVERGE_LR:g} instead of --lr: the loss explodes)",
    )
    p.add_argument(
        "--profiler",
        choices=("torch", "light"),
        default="torch",
        help="torch: torch.profiler.profile with a schedule; light: the same trace without "
        "torch.profiler's 2-3 s torch._inductor import (see LightProfiler)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 by default because several cells share few cores",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="data-parallel ranks (forked processes, gloo over loopback); 1 = single process",
    )
    p.add_argument(
        "--rendezvous",
        choices=("local", "env"),
        default="local",
        help="local: fork --world-size ranks here; env: one rank of a multi-node job "
        "(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK or NODE_RANK from the environment)",
    )
    p.add_argument(
        "--fail-rank",
        type=int,
        default=None,
        help="with --fail-mode crash/hang: only this rank fails (default: every rank)",
    )
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "profile_steps", "threads", "world_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.profile_from_step < 0:
        p.error("--profile-from-step must be >= 0")
    if args.hidden is not None and args.hidden < 1:
        p.error("--hidden must be >= 1")
    return args


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem: a smooth non-linear target plus a little noise.

    Generated from its own generator so the data depends on the seed only, not on how many
    random numbers model initialisation consumed.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(DATASET_SIZE, IN_FEATURES, generator=g)
    w = torch.randn(IN_FEATURES, 1, generator=g) / math.sqrt(IN_FEATURES)
    y = (
        torch.tanh(x @ w)
        + 0.1 * torch.sin(3.0 * x[:, :1])
        + 0.01 * torch.randn(DATASET_SIZE, 1, generator=g)
    )
    return x, y


def make_model(hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))


@torch.no_grad()
def sgd_step(params: list[nn.Parameter], lr: float, max_grad_norm: float = 1.0) -> None:
    """Plain SGD with global gradient-norm clipping, by hand.

    Why not ``torch.optim.SGD``: constructing any torch optimizer imports ``torch._dynamo``
    (about 2.5 s on a 2-core machine), which would more than double the run time of a job
    whose training takes a few tens of milliseconds. Clipping keeps the wide model stable
    at the default learning rate (without it, it spikes to a loss of ~200 mid-run), so a
    healthy run's loss is a usable check target; it does not stop --fail-mode diverge.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    scale = min(1.0, max_grad_norm / (float(norm) + 1e-12))
    for p in params:
        if p.grad is not None:
            p.add_(p.grad, alpha=-lr * scale)


def profiler_schedule(from_step: int, active: int):
    """Record steps [from_step, from_step + active) exactly once.

    One warm-up step precedes the window when there is room for it, because kineto's first
    recorded step otherwise carries its start-up cost; repeat=1 guarantees a single trace.
    """
    warmup = 1 if from_step >= 1 else 0
    return schedule(wait=from_step - warmup, warmup=warmup, active=active, repeat=1)


class LightProfiler:
    """The step window of ``torch.profiler.profile(schedule=...)`` on the autograd profiler.

    Why: ``torch.profiler.profile`` imports ``torch._inductor`` when it prepares a trace
    (deliberately upstream, pytorch/pytorch#155243), which costs 2-3 s of CPU per run on a
    2-core machine: more than the whole tiny training. This class drives the same kineto
    profiler directly and writes the same Chrome trace (``ProfilerStep#<n>`` annotations
    around each recorded step), so consumers cannot tell the difference. Like the real one,
    ``step()`` is called at the end of every step and a window cut short by the end of the
    run is still saved on exit.
    """

    def __init__(self, from_step: int, active: int, on_trace_ready) -> None:
        self._first, self._end = from_step, from_step + active
        self._on_trace_ready = on_trace_ready
        self._step_num = 0
        self._prof = None
        self._annotation = None
        self._saved = False

    def __enter__(self) -> LightProfiler:
        self._transition()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_annotation()
        if self._prof is not None and not self._saved:
            self._save()

    def step(self) -> None:
        self._close_annotation()
        self._step_num += 1
        self._transition()

    def export_chrome_trace(self, path: str) -> None:
        assert self._prof is not None
        self._prof.export_chrome_trace(path)

    def _transition(self) -> None:
        if self._saved:
            return
        if self._step_num == self._end and self._prof is not None:
            self._save()
            return
        if self._first <= self._step_num < self._end:
            if self._prof is None:
                self._prof = torch.autograd.profiler.profile(use_kineto=True, use_cpu=True)
                self._prof.__enter__()
            self._annotation = torch.autograd.profiler.record_function(
                f"ProfilerStep#{self._step_num}"
            )
            self._annotation.__enter__()

    def _close_annotation(self) -> None:
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
            self._annotation = None

    def _save(self) -> None:
        self._prof.__exit__(None, None, None)
        self._saved = True
        self._on_trace_ready(self)


class DataParallel:
    """Gradient and loss averaging across ranks: the part of DDP this workload needs.

    Why not ``DistributedDataParallel``: wrapping a module imports ``torch._dynamo`` (seconds
    per rank on 2 cores, see ``sgd_step``); an all-reduce per parameter is what it does for
    a model this small anyway.
    """

    def __init__(self, rank: int, world: int, init_method: str) -> None:
        import torch.distributed as dist

        self.dist, self.rank, self.world = dist, rank, world
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)

    def average_grads(self, params: list[nn.Parameter]) -> None:
        for p in params:
            if p.grad is not None:
                self.dist.all_reduce(p.grad)
                p.grad /= self.world

    def mean(self, value: float) -> float:
        t = torch.tensor([value])
        self.dist.all_reduce(t)
        return float(t.item()) / self.world

    def close(self) -> None:
        self.dist.destroy_process_group()


def strict_json(obj: dict) -> str:
    """JSON any parser accepts: a diverged loss (NaN, inf) is written as the string "NaN" /
    "Infinity" (which accelmatrix's metric sources read as numbers), never as bare NaN."""

    def fix(v: object) -> object:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    return json.dumps({k: fix(v) for k, v in obj.items()}, allow_nan=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.rendezvous == "env":
        return train_one_rank_of_many(args, out_dir)
    if args.world_size == 1:
        return train(args, out_dir, rank=0, dp=None)
    # Loopback only; gloo would otherwise pick the interface of the host name.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = out_dir / ".dist_store"
    store.unlink(missing_ok=True)
    children = []
    for rank in range(1, args.world_size):
        pid = os.fork()
        if pid == 0:  # a rank: train, then leave without running the parent's cleanup
            code = 1
            try:
                dp = DataParallel(rank, args.world_size, f"file://{store}")
                code = train(args, out_dir, rank, dp)
            finally:
                os._exit(code)
        children.append(pid)
    # A file store: no port to pick and nothing listening beyond gloo's loopback pairs.
    code = train(args, out_dir, 0, DataParallel(0, args.world_size, f"file://{store}"))
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"rank process {pid} failed: wait status {status}", file=sys.stderr, flush=True)
            code = code or 1
    store.unlink(missing_ok=True)
    return code


def train_one_rank_of_many(args: argparse.Namespace, out_dir: Path) -> int:
    """One rank of a multi-node job: meet the others at MASTER_ADDR:MASTER_PORT (TCP store)."""
    env = os.environ
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE") if not env.get(k)]
    rank_text = env.get("RANK") or env.get("NODE_RANK")
    if missing or rank_text is None:
        print(f"--rendezvous env needs {missing or ['RANK or NODE_RANK']} set", file=sys.stderr)
        return 2
    rank, world = int(rank_text), int(env["WORLD_SIZE"])
    address = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    print(f"rank {rank}/{world} joining the rendezvous at {address}", flush=True)
    dp = DataParallel(rank, world, f"tcp://{address}")
    print(f"rank {rank}/{world} joined at {time.time():.3f}", flush=True)
    return train(args, out_dir, rank, dp)


def train(args: argparse.Namespace, out_dir: Path, rank: int, dp: DataParallel | None) -> int:
    """The training loop of one rank; only rank 0 prints, profiles and writes files.

    With ``dp`` every rank takes its own slice of the global batch (``world_size *
    batch_size`` samples per step) and applies the averaged gradient, so all ranks hold the
    same weights; the logged loss is the mean over ranks.
    """
    lead = rank == 0
    world = dp.world if dp is not None else 1
    hidden = args.hidden if args.hidden is not None else HIDDEN[args.model]
    lr = DIVERGE_LR if args.fail_mode == "diverge" else args.lr
    fail_step = args.steps // 2
    say = print if lead else (lambda *a, **k: None)

    x, y = make_dataset(args.seed)
    model = make_model(hidden, args.seed)
    params = list(model.parameters())
    loss_fn = nn.MSELoss()
    order = torch.randperm(DATASET_SIZE, generator=torch.Generator().manual_seed(args.seed + 1))

    say(
        f"train_tiny: model={args.model} hidden={hidden} steps={args.steps} "
        f"batch_size={args.batch_size} lr={lr} seed={args.seed} threads={args.threads} "
        f"fail_mode={args.fail_mode} profiler={args.profiler} world_size={world}",
        flush=True,
    )

    trace_path = out_dir / TRACE_NAME

    def save_trace(prof: profile | LightProfiler) -> None:
        prof.export_chrome_trace(str(trace_path))

    if not lead:
        profiler: profile | LightProfiler | _NoProfiler = _NoProfiler()
    elif args.profiler == "torch":
        # torch.profiler imports torch._inductor when it prepares a trace (see LightProfiler).
        # Pay that before the clock starts so train_runtime measures training, not imports.
        importlib.import_module("torch._inductor")
        profiler = profile(
            activities=[ProfilerActivity.CPU],
            schedule=profiler_schedule(args.profile_from_step, args.profile_steps),
            on_trace_ready=save_trace,
        )
    else:
        profiler = LightProfiler(args.profile_from_step, args.profile_steps, save_trace)

    loss_value = float("nan")
    global_batch = args.batch_size * world
    t_start = time.perf_counter()
    with (
        open(out_dir / "metrics.jsonl" if lead else os.devnull, "w", encoding="utf-8") as jsonl,
        profiler as prof,
    ):
        for step in range(args.steps):
            fails = args.fail_rank is None or args.fail_rank == rank
            if step == fail_step and args.fail_mode == "crash" and fails:
                raise RuntimeError(f"injected failure (--fail-mode crash) at step {step}")
            if step == fail_step and args.fail_mode == "hang" and fails:
                say(f"step {step} hanging (--fail-mode hang)", flush=True)
                while True:  # only a timeout or a signal ends this
                    time.sleep(3600)

            t0 = time.perf_counter()
            start = (step * global_batch + rank * args.batch_size) % DATASET_SIZE
            idx = order[start : start + args.batch_size]
            if idx.numel() < args.batch_size:  # wrap around the epoch boundary
                idx = torch.cat([idx, order[: args.batch_size - idx.numel()]])
            for p in params:
                p.grad = None
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            if dp is not None:
                dp.average_grads(params)
            sgd_step(params, lr)
            loss_value = loss.item()  # forces the step to complete before timing it
            if dp is not None:
                loss_value = dp.mean(loss_value)
            step_time = time.perf_counter() - t0
            samples_per_s = global_batch / step_time if step_time > 0 else float("inf")

            say(
                f"step {step} loss: {loss_value:.6f} step_time: {step_time:.4f}s "
                f"samples/s: {samples_per_s:.1f}",
                flush=True,
            )
            record = {
                "step": step,
                "loss": loss_value,
                "step_time_s": step_time,
                "samples_per_s": samples_per_s,
            }
            jsonl.write(strict_json(record) + "\n")
            jsonl.flush()
            prof.step()
    train_runtime = time.perf_counter() - t_start
    if dp is not None:
        dp.close()
    if not lead:
        return 0

    summary = {
        "model": args.model,
        "hidden": hidden,
        "train_runtime": train_runtime,
        "final_loss": loss_value,
        "steps": args.steps,
        "world_size": world,
    }
    (out_dir / "train_metrics.json").write_text(strict_json(summary) + "\n")
    print("Finished training run", flush=True)
    return 0


class _NoProfiler:
    """What ranks other than 0 use: one trace per run, written by rank 0."""

    def __enter__(self) -> _NoProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
