#!/usr/bin/env python3
"""A small training run that needs nothing but the Python standard library.

Why: the SSH example suite runs on whatever host the connection points at (a GPU
workstation, an existing VM) with that host's own ``python3``; it must not assume PyTorch is
installed there. Logistic regression by mini-batch SGD on a seeded synthetic data set: a
real optimisation whose loss falls step by step, with the same log lines, metrics.jsonl and
end marker as include/workloads/train_tiny.py, so the same checks apply.

    step 7 loss: 0.412345 step_time: 0.0021s samples/s: 30000.0
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    return p.parse_args(argv)


def make_data(n: int, d: int, rng: random.Random) -> tuple[list[list[float]], list[int]]:
    true_w = [rng.uniform(-2, 2) for _ in range(d)]
    xs, ys = [], []
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(d)]
        z = sum(a * b for a, b in zip(true_w, x, strict=True))
        xs.append(x)
        ys.append(1 if rng.random() < 1 / (1 + math.exp(-z)) else 0)
    return xs, ys


def strict_json(obj: dict) -> str:
    """JSON any parser accepts: NaN/inf become the strings "NaN"/"Infinity" (read back as
    numbers by accelmatrix's metric sources), never bare NaN."""

    def fix(v: object) -> object:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    return json.dumps({k: fix(v) for k, v in obj.items()}, allow_nan=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    xs, ys = make_data(2048, args.features, rng)
    w = [0.0] * args.features
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"python {sys.version.split()[0]} training {args.steps} steps", flush=True)
    t_start = time.perf_counter()
    with open(args.out_dir / "metrics.jsonl", "w") as metrics:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            batch = rng.sample(range(len(xs)), args.batch_size)
            grad = [0.0] * args.features
            loss = 0.0
            for i in batch:
                z = sum(a * b for a, b in zip(w, xs[i], strict=True))
                p = 1 / (1 + math.exp(-z))
                loss -= math.log(p if ys[i] else 1 - p + 1e-12) if p > 0 else 0.0
                for j, xj in enumerate(xs[i]):
                    grad[j] += (p - ys[i]) * xj
            loss /= args.batch_size
            w = [wj - args.lr * g / args.batch_size for wj, g in zip(w, grad, strict=True)]
            dt = time.perf_counter() - t0
            rate = args.batch_size / dt if dt > 0 else 0.0
            print(
                f"step {step} loss: {loss:.6f} step_time: {dt:.4f}s samples/s: {rate:.1f}",
                flush=True,
            )
            metrics.write(strict_json({"step": step, "loss": loss, "step_time": dt}) + "\n")
    summary = {"steps": args.steps, "train_runtime": time.perf_counter() - t_start, "loss": loss}
    (args.out_dir / "summary.json").write_text(strict_json(summary))
    print("Finished training run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
