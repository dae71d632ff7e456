#!/usr/bin/env python
"""A nightly benchmark whose culprit build makes one op slower: the op_regression example.

The op_regression suite passes the build under test (``--build nightly-2026-03-01``, from
the DAG run's logical date) and ``--slow-from DATE``. Every build runs the same tiny CPU
step on one thread (a dozen small ops on a 64 x 64 tensor, then a matmul, a ReLU and a
sum); builds of ``DATE`` and later do the
matmul twice (the second result unused, as a refactor that recomputes a projection
would). That is the regression the culprit report must find: the step's time goes up by
most of a matmul, and the op-level diff of the last good build's trace against the
culprit's names ``aten::mm`` first, most of the regression.

Real timings, not simulated ones (nightly_bench.py sleeps for a drawn step time): the
culprit report diffs real profiler traces, and those only show the op that a real step
ran. The matmul dominates the step so the doubling (about +65 % of the step) stands far
beyond a shared host's night-to-night noise (3-6 %, docs/performance.md, "The example:
op_regression on a real scheduler"); nothing here depends on the date beyond which side of
``DATE`` the build is on.

Output, as the suite's metrics read it:

* one line per step, ``build nightly-2026-03-01 step 3 step_time: 0.000612s`` (the
  ``log_regex`` series the history and the re-test follow);
* ``out/op_bench.pt.trace.json``: a Chrome trace of ``--profile-steps`` steps with
  ``ProfilerStep#<n>`` around each and the ops' input shapes (the ``profiler_trace``
  source; a re-test keeps those of 3 samples per build for the diff).

The profiler is the autograd profiler on kineto, driven by hand: ``torch.profiler.profile``
imports ``torch._inductor`` when it writes the trace, 2-3 s of CPU per run on two cores
(see train_tiny.py's LightProfiler), more than this whole benchmark. Standalone (no
accelmatrix import): a workload runs where only torch is installed.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch

TRACE_NAME = "op_bench.pt.trace.json"
# x: ROWS x DIM, w: DIM x DIM. One matmul is ~0.3-0.5 ms on one core: long against the
# ReLU and the sum, short against a busy host's scheduler slice, so most steps run whole.
ROWS, DIM = 256, 384
SMALL = 64  # the small ops' tensor: SMALL x SMALL


def step(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor, *, slow: bool) -> float:
    # The step's other work: a dozen small ops on a 64 x 64 tensor (normalisation,
    # activations), a few µs each, which the doubled matmul leaves alone. A real step has
    # many ops besides its slow one; the op-level diff reads the re-test host's common
    # drift from the median op (history.culprits.profile_diff), and with only the matmul's own
    # neighbours (which a second matmul's cache traffic slows too) it read the doubled
    # matmul as "every op slower" on a busy host, 4 times in 15.
    a = torch.layer_norm(z, (SMALL,))
    a = torch.softmax(torch.tanh(a), dim=-1)
    a = torch.sigmoid(a * 0.5 + 1.0)
    a = torch.sqrt(torch.exp(torch.abs(a)))
    a = torch.clamp(torch.neg(a), -1.0, 1.0)
    b = torch.maximum(a, torch.zeros_like(a)).mean()
    h = torch.mm(x, w)
    if slow:
        torch.mm(x, w)  # the regression: the matmul done twice, its result unused
    return float(torch.relu(h).sum() + b)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--slow-from", default="", help="YYYY-MM-DD: first build with the slow op")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5, help="steps before the profiled ones")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    a = p.parse_args(argv)
    if a.steps < a.warmup + a.profile_steps:
        p.error("--steps must cover --warmup and --profile-steps")
    m = re.search(r"(\d{4}-\d{2}-\d{2})", a.build)
    slow = bool(a.slow_from and m and m.group(1) >= a.slow_from)
    torch.set_num_threads(1)  # several workloads share a few cores
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(ROWS, DIM, generator=g), torch.randn(DIM, DIM, generator=g)
    z = torch.randn(SMALL, SMALL, generator=g)
    a.out_dir.mkdir(parents=True, exist_ok=True)

    prof = None
    for i in range(a.steps):
        if i == a.warmup:
            prof = torch.autograd.profiler.profile(use_kineto=True, record_shapes=True)
            prof.__enter__()
        profiled = prof is not None and i < a.warmup + a.profile_steps
        mark = torch.autograd.profiler.record_function(f"ProfilerStep#{i}") if profiled else None
        if mark is not None:
            mark.__enter__()
        t0 = time.perf_counter()
        step(x, w, z, slow=slow)
        dt = time.perf_counter() - t0
        if mark is not None:
            mark.__exit__(None, None, None)
        if prof is not None and i == a.warmup + a.profile_steps - 1:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(a.out_dir / TRACE_NAME))
            prof = None
        print(f"build {a.build} step {i} step_time: {dt:.6f}s", flush=True)
    print(f"Finished op benchmark of {a.build}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
