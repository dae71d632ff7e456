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
  tested for real instead of with mocks.

It is deliberately standalone (no accelmatrix import): a workload must run on a machine
that only has torch installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
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
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "profile_steps", "threads"):
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    hidden = args.hidden if args.hidden is not None else HIDDEN[args.model]
    lr = DIVERGE_LR if args.fail_mode == "diverge" else args.lr
    fail_step = args.steps // 2

    x, y = make_dataset(args.seed)
    model = make_model(hidden, args.seed)
    params = list(model.parameters())
    loss_fn = nn.MSELoss()
    order = torch.randperm(DATASET_SIZE, generator=torch.Generator().manual_seed(args.seed + 1))

    print(
        f"train_tiny: model={args.model} hidden={hidden} steps={args.steps} "
        f"batch_size={args.batch_size} lr={lr} seed={args.seed} threads={args.threads} "
        f"fail_mode={args.fail_mode} profiler={args.profiler}",
        flush=True,
    )

    trace_path = out_dir / TRACE_NAME

    def save_trace(prof: profile | LightProfiler) -> None:
        prof.export_chrome_trace(str(trace_path))

    if args.profiler == "torch":
        # torch.profiler imports torch._inductor when it prepares a trace (see LightProfiler).
        # Pay that before the clock starts so train_runtime measures training, not imports.
        importlib.import_module("torch._inductor")
        profiler: profile | LightProfiler = profile(
            activities=[ProfilerActivity.CPU],
            schedule=profiler_schedule(args.profile_from_step, args.profile_steps),
            on_trace_ready=save_trace,
        )
    else:
        profiler = LightProfiler(args.profile_from_step, args.profile_steps, save_trace)

    loss_value = float("nan")
    t_start = time.perf_counter()
    with (
        open(out_dir / "metrics.jsonl", "w", encoding="utf-8") as jsonl,
        profiler as prof,
    ):
        for step in range(args.steps):
            if step == fail_step and args.fail_mode == "crash":
                raise RuntimeError(f"injected failure (--fail-mode crash) at step {step}")
            if step == fail_step and args.fail_mode == "hang":
                print(f"step {step} hanging (--fail-mode hang)", flush=True)
                while True:  # only a timeout or a signal ends this
                    time.sleep(3600)

            t0 = time.perf_counter()
            start = (step * args.batch_size) % DATASET_SIZE
            idx = order[start : start + args.batch_size]
            if idx.numel() < args.batch_size:  # wrap around the epoch boundary
                idx = torch.cat([idx, order[: args.batch_size - idx.numel()]])
            for p in params:
                p.grad = None
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            sgd_step(params, lr)
            loss_value = loss.item()  # forces the step to complete before timing it
            step_time = time.perf_counter() - t0
            samples_per_s = args.batch_size / step_time if step_time > 0 else float("inf")

            print(
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
            jsonl.write(json.dumps(record) + "\n")
            jsonl.flush()
            prof.step()
    train_runtime = time.perf_counter() - t_start

    summary = {
        "model": args.model,
        "hidden": hidden,
        "train_runtime": train_runtime,
        "final_loss": loss_value,
        "steps": args.steps,
    }
    (out_dir / "train_metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("Finished training run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
