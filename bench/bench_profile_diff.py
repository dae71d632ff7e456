#!/usr/bin/env python3
"""The op-level profile diff and the matrix attribution on generated data with known answers
(issues 42 and 49; figures in BENCHMARKS.md).

Printed:

1. Cost: the diff of 3 + 3 traces of ~50 MB and 200 steps (generated, kineto's CPU layout
   with ``record_shapes``), read from disk, in a fresh process: its CPU time (the goal's
   figure: on the shared 2-core host other jobs' load stretches wall time several-fold;
   the wall time and the load average are printed beside it) and peak RSS (goal <= 10 s,
   <= 1 GB).
2. One op of 40 slowed by 5-50 % (uniform), ``--samples`` profiled samples per build on a
   noisy host: each trace slowed as a whole by U(0, 10 %), each op of each trace by its
   own N(0, sd) with sd ~ U(2, 5 %), 10 % of the steps interrupted for 5 % of a step,
   every call jittered by 10 %. How often that op is named "one op" and, when named,
   how often its share interval covers the truth (goal >= 95 %); by the slowdown's size
   as a share of the step; and how often an unchanged op is credited > 10 % (its share's
   lower bound; goal <= 2 %). The frames are drawn directly (``synth_profile``: the same
   model as the JSON generator's; the reader is part 1's and the tests').
3. Intermittent: one op 2x slower in 20-50 % of the steps: found as a slow-step row (goal
   >= 95 %); and diffs of two unchanged builds: a slow-step finding (should be ~0).
4. Even slowdown: every op 2 % slower, on a quiet and on the noisy host: one op named
   (goal: none), "spread".
5. Attribution: planted matrices of 4 models x 3 machine kinds x 2 runtimes, the cause in
   the code (every model, or one), one machine kind, one runtime, or nothing; 3 % changes,
   2 % nightly noise, each cell's Δ over ``after`` nights against 14 before: right class
   per cause. 5b: the noise threshold by the matrix's size (``attribution.noise_chi2``)
   and its false-cause rate.
6. (Only with ``--parts 6``: minutes of real torch.) The op_regression example's workload,
   3 + 3 interleaved runs, 10 trials on this host: aten::mm named "one op".

Seeds are fixed so two runs print the same figures (the cost and part 6 aside).

    .venv/bin/python bench/bench_profile_diff.py [--trials 400] [--matrices 500] [--samples 3] [--parts 12345]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "tests")]

from accelmatrix.history.culprits.attribution import attribute, noise_chi2  # noqa: E402
from accelmatrix.history.culprits.profile_diff import diff_profiles, diff_traces  # noqa: E402
from accelmatrix_testkit.cause_matrix import CAUSES, plant  # noqa: E402
from accelmatrix_testkit.chrome_traces import make_ops, synth_profile, synth_trace  # noqa: E402

# Steps per trace in the ranking trials: the cost figure's 200.
STEPS = 200

_COST = """
import resource, sys, time
sys.path.insert(0, {plugins!r})
t = time.perf_counter()
from accelmatrix.history.culprits.profile_diff import diff_traces
imported = time.perf_counter() - t
t, c = time.perf_counter(), time.process_time()
out = diff_traces({a!r}, {b!r})
took, cpu = time.perf_counter() - t, time.process_time() - c
assert out.diff is not None, out.error
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(took, imported, rss, len(out.diff.rows), cpu)
"""


def cost(tmp: Path, k: int) -> None:
    ops = make_ops(np.random.default_rng(11), n=40, max_calls=36)
    a = [tmp / f"base-{j}.pt.trace.json" for j in range(k)]
    b = [tmp / f"culprit-{j}.pt.trace.json" for j in range(k)]
    for j in range(k):
        a[j].write_bytes(synth_trace(ops, steps=200, seed=1 + j))
        b[j].write_bytes(synth_trace(ops, steps=200, seed=50 + j, scale={ops[3].name: 1.3}))
    mb = sum(p.stat().st_size for p in a + b) / (2 * k) / 1e6
    code = _COST.format(plugins=str(ROOT / "plugins"), a=[str(p) for p in a], b=[str(p) for p in b])
    runs = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        runs.append((float(out[0]), float(out[1]), float(out[2]), int(out[3]), float(out[4])))
    took = sorted(r[0] for r in runs)[1]
    cpu = sorted(r[4] for r in runs)[1]
    rss = max(r[2] for r in runs)
    load = os.getloadavg()[0]
    print(f"1. Cost of one diff ({k}+{k} traces read from disk, a fresh process, median of 3)")
    print(f"   traces: {mb:.1f} MB each, 200 steps, {runs[0][3]} op rows")
    print(f"   diff: {cpu:.2f} s of CPU (goal <= 10 s), {took:.2f} s wall at load {load:.1f}")
    print(f"   [imports before it: {runs[0][1]:.2f} s wall]")
    print(f"   peak RSS of the process: {rss:.0f} MiB (goal <= 1024 MiB)")


def _host(rng: np.random.Generator) -> dict:
    """One trial's noisy host: each trace of it slowed as a whole by U(0, 10 %), each op of
    each trace by its own N(0, sd) with sd ~ U(2, 5 %) for the trial, and 10 % of the
    steps interrupted for 5 % of a step (landing in one op)."""
    return {"op_noise": float(rng.uniform(0.02, 0.05)), "interrupts": (0.1, 0.05)}


def _samples(ops, rng, host, seed, k, **kw):
    return [
        synth_profile(
            ops, steps=STEPS, seed=seed + j, drift=float(rng.uniform(0, 0.10)), **host, **kw
        )
        for j in range(k)
    ]


def one_op(trials: int, k: int) -> None:
    """Part 2: one op of 40 slowed 5-50 %, k + k samples on a noisy host."""
    rng = np.random.default_rng(5)
    edges = [(0.0, 0.005), (0.005, 0.01), (0.01, 0.03), (0.03, 1.0)]
    per = {e: [0, 0, 0, 0] for e in edges}  # trials, named, named & covered, ranked first
    covered = named = credited = credited_point = 0
    t0 = time.perf_counter()
    for i in range(trials):
        ops = make_ops(rng, n=40, max_calls=10)
        target = ops[int(rng.integers(len(ops)))]
        slow = float(rng.uniform(0.05, 0.50))
        host = _host(rng)
        base = _samples(ops, rng, host, 100 * i, k)
        new = _samples(ops, rng, host, 100 * i + 50, k, scale={target.name: 1 + slow})
        d = diff_profiles(base, new)
        total = sum(o.us * o.calls for o in ops)
        size = slow * target.us * target.calls / total
        truth = 1 / 1.02 if target.parent else 1.0  # the wrapper's own 2 % grows with it
        row = next(r for r in d.rows if r.op == target.name)
        ok = d.cause is not None and d.cause.op == target.name
        cov = row.share_lo is not None and row.share_lo <= truth <= row.share_hi
        wrapper = (target.parent, target.dims.replace(" ", ""))
        others = [r for r in d.rows if r.op != target.name and (r.op, r.shapes) != wrapper]
        credited += any(r.share_lo is not None and r.share_lo > 0.10 for r in others)
        credited_point += d.verdict != "no_regression" and any(
            r.share is not None and r.share > 0.10 for r in others
        )
        e = next(e for e in edges if e[0] <= size < e[1])
        per[e][0] += 1
        per[e][1] += ok
        per[e][2] += ok and cov
        per[e][3] += d.rows[0].op == target.name
        named += ok
        covered += ok and cov
    took = time.perf_counter() - t0
    print(
        f"2. One op of 40 slowed 5-50 %, {k}+{k} samples of {STEPS} steps on a noisy host "
        f"(trace x U(1, 1.10), op x N(1, 2-5 %), 10 % of steps interrupted), {trials} trials "
        f"({took:.0f} s)"
    )
    print(
        f"   named 'one op': {named / trials:.1%}; of those, share interval covers the truth: "
        f"{covered / max(named, 1):.1%} (goal >= 95 %)"
    )
    for (lo, hi), (n, ok, cov, first) in per.items():
        if n:
            print(
                f"     slowdown {lo:>5.1%}-{min(hi, 1):<6.1%} of the step: named {ok / n:6.1%}, "
                f"covered {cov / max(ok, 1):6.1%} of named, ranked first {first / n:6.1%} ({n} trials)"
            )
    print(
        f"   an unchanged op credited > 10 % (its share's lower bound): {credited / trials:.1%} "
        "(goal <= 2 %)"
    )
    print(
        f"   [an unchanged op's point share > 10 % in a diff with a verdict: "
        f"{credited_point / trials:.1%}]"
    )


def intermittent(trials: int, k: int) -> None:
    """Part 3: one op 2x slower in 20-50 % of the steps; and nothing changed."""
    rng = np.random.default_rng(7)
    found = first = false_found = 0
    for i in range(trials):
        ops = make_ops(rng, n=40, max_calls=10)
        target = ops[int(rng.integers(len(ops)))]
        share = float(rng.uniform(0.2, 0.5))
        host = _host(rng)
        base = _samples(ops, rng, host, 100 * i, k)
        new = _samples(ops, rng, host, 100 * i + 50, k, intermittent={target.name: (share, 2.0)})
        d = diff_profiles(base, new)
        found += any(t.op == target.name for t in d.findings)
        first += d.verdict == "intermittent" or (d.cause is not None and d.cause.op == target.name)
        same = diff_profiles(base, _samples(ops, rng, host, 100 * i + 70, k))
        false_found += bool(same.findings)
    print(f"3. One op 2x slower in 20-50 % of steps, {k}+{k} samples, same host, {trials} trials")
    print(
        f"   found as a slow-step row: {found / trials:.1%} (goal >= 95 %); "
        f"verdict 'intermittent' or that op named: {first / trials:.1%}"
    )
    print(f"   nothing changed: a slow-step finding in {false_found / trials:.1%} of diffs")


def even(trials: int, k: int) -> None:
    """Part 4: every op 2 % slower; on a quiet host (traces +-0.5 %) and on the noisy one."""
    for label, noisy in (("quiet host", False), ("noisy host", True)):
        rng = np.random.default_rng(6)
        named = spread = 0
        for i in range(trials):
            ops = make_ops(rng, n=40, max_calls=10)
            if noisy:
                host = _host(rng)
                base = _samples(ops, rng, host, 100 * i, k)
                new = [
                    synth_profile(ops, steps=STEPS, seed=100 * i + 50 + j,
                                  drift=0.02 + float(rng.uniform(0, 0.1)), **host)
                    for j in range(k)
                ]  # fmt: skip
            else:
                base = [synth_profile(ops, steps=STEPS, seed=100 * i + j,
                                      drift=float(rng.normal(0, 0.005))) for j in range(k)]  # fmt: skip
                new = [synth_profile(ops, steps=STEPS, seed=100 * i + 50 + j,
                                     drift=0.02 + float(rng.normal(0, 0.005))) for j in range(k)]  # fmt: skip
            d = diff_profiles(base, new)
            named += d.cause is not None
            spread += d.verdict == "spread"
        print(
            f"4. Every op 2 % slower, {k}+{k} samples, {label}, {trials} trials: one op named "
            f"{named / trials:.1%} (goal 0 %); verdict 'spread' {spread / trials:.1%}"
        )


def attribution(matrices: int) -> None:
    print(
        f"5. Attribution, 4 models x 3 kinds x 2 runtimes, 3 % changes, 2 % noise, {matrices} matrices per cause"
    )
    print(f"   {'nights after':>12} {'re-test':>8}  " + "  ".join(f"{c:>15}" for c in CAUSES))
    for after in (1, 2, 4):
        for use_retest in (False, True):
            rng = np.random.default_rng(after * 10 + use_retest)
            rates = []
            for cause in CAUSES:
                right = 0
                for _ in range(matrices):
                    p = plant(rng, cause, after=after)
                    a = attribute(
                        p.change,
                        p.siblings,
                        reproduced=p.reproduced if use_retest else None,
                        workload_axes={"model"},
                    )
                    right += a.cause == p.cause and (p.value is None or a.value == p.value)
                rates.append(right / matrices)
            print(
                f"   {after:>12} {'yes' if use_retest else 'no':>8}  "
                + "  ".join(f"{r:>15.1%}" for r in rates)
            )


def example(trials: int, k: int) -> None:
    """Part 6 (not in the default run: minutes of real torch): the op_regression example's
    workload (include/workloads/op_bench.py), a good and a culprit build run k times each,
    interleaved A B B A ... as the re-test runs them, on this (shared) host; each trial's
    diff of their traces. The real-scheduler test (tests/test_op_regression.py) asserts
    the same figures on the traces its re-test kept."""
    import shutil

    workload = ROOT / "include" / "workloads" / "op_bench.py"
    order = [(i // 2 + i) % 2 for i in range(2 * k)]  # 0 1 1 0 0 1 ...
    right = 0
    t0 = time.perf_counter()
    for t in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            kept: dict[int, list[Path]] = {0: [], 1: []}
            for i, who in enumerate(order):
                build = "nightly-2026-03-0" + ("1" if who == 0 else "2")
                out = Path(tmp) / f"{i}"
                subprocess.run(  # noqa: S603 (argv list, no shell)
                    [sys.executable, str(workload), "--build", build, "--slow-from",
                     "2026-03-02", "--out-dir", str(out)],
                    capture_output=True, check=True, timeout=300,
                )  # fmt: skip
                kept[who] += sorted(out.glob("*.pt.trace.json"))
            out = diff_traces(kept[0], kept[1])
            shutil.rmtree(tmp, ignore_errors=True)
        d = out.diff
        ok = (
            d is not None and d.verdict == "op" and d.cause is not None and d.cause.op == "aten::mm"
        )
        right += ok
        head = d.summary().splitlines()[:2] if d is not None else [out.error]
        print(
            f"   trial {t + 1}: {'ok' if ok else 'MISSED'}: {' / '.join(h.strip() for h in head)}"
        )
    load = os.getloadavg()[0]
    print(
        f"6. The example's workload, {k}+{k} interleaved runs per trial: aten::mm named 'one "
        f"op' with the largest share in {right} of {trials} trials (goal >= 9 of 10); "
        f"{time.perf_counter() - t0:.0f} s, load {load:.1f} at the end"
    )


def calibration(matrices: int) -> None:
    """Part 5b: the noise threshold by the matrix's size (attribution.noise_chi2): the share
    of pure-noise matrices given a cause (goal: about NOISE_FALSE_RATE), and the right
    class of a 3 % code or machine-kind change, 4 nights after, with the re-test."""
    print(
        f"5b. Attribution calibrated by size, {matrices} matrices each, 4 nights after, no re-test"
    )
    print(f"   {'models x kinds x runtimes':>26}  {'threshold':>9}  {'noise given a cause':>19}"
          f"  {'code right':>10}  {'machine kind right':>18}")  # fmt: skip
    for models, kinds, runtimes in ((2, 2, 2), (4, 3, 2), (8, 3, 2), (16, 4, 3)):
        rng = np.random.default_rng(models * 100 + kinds * 10 + runtimes)
        rates = []
        for cause in ("noise", "code", "machine_kind"):
            right = 0
            for _ in range(matrices):
                p = plant(rng, cause, models=models, kinds=kinds, runtimes=runtimes)
                a = attribute(p.change, p.siblings, workload_axes={"model"})
                right += a.cause == p.cause and (p.value is None or a.value == p.value)
            rates.append(right / matrices)
        thr = noise_chi2(models, 3)
        size = f"{models} x {kinds} x {runtimes}"
        print(
            f"   {size:>26}  {thr:>9.1f}  {1 - rates[0]:>19.1%}  {rates[1]:>10.1%}  {rates[2]:>18.1%}"
        )


def main() -> None:
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--matrices", type=int, default=500)
    ap.add_argument("--samples", type=int, default=3, help="profiled samples per build")
    ap.add_argument(
        "--parts",
        default="12345",
        help="which parts to run (6: the example's real workload, minutes)",
    )
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per trace in parts 2-3")
    args = ap.parse_args()
    STEPS = args.steps
    if "1" in args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            cost(Path(tmp), args.samples)
    if "2" in args.parts:
        one_op(args.trials, args.samples)
    if "3" in args.parts:
        intermittent(args.trials // 2, args.samples)
    if "4" in args.parts:
        even(args.trials // 4, args.samples)
    if "5" in args.parts:
        attribution(args.matrices)
        calibration(args.matrices)
    if "6" in args.parts:
        example(10, args.samples)


if __name__ == "__main__":
    main()
