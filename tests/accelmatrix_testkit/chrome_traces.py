"""Generated PyTorch profiler traces (Chrome-trace JSON) with known per-op costs.

Shaped like kineto's CPU traces: one ``ProfilerStep#<n>`` per step on the training thread,
``cpu_op`` events inside it, some with a child op (``aten::linear`` > ``aten::addmm``: the
time is the child's), ``Input Dims`` in ``args`` as with ``record_shapes=True``. Each call's
duration is the op's mean times a log-normal jitter (``cv``), times a per-step factor
(steps differ by ``step_cv``), times ``1 + drift`` for the whole trace (a re-test host a
little faster or slower), times the op's planted ``scale``. So a test or bench/
bench_profile_diff.py knows exactly which op changed and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accelmatrix.history.culprits.op_trace import OUTSIDE_OPS, OpProfile

__all__ = ["SynthOp", "make_ops", "synth_profile", "synth_trace"]


@dataclass(frozen=True)
class SynthOp:
    name: str
    dims: str  # the Input Dims JSON, e.g. "[[64, 256], [256, 256]]"
    us: float  # mean self time per call
    calls: int  # calls per step
    parent: str | None = None  # a wrapper op around each call (its own time is 2 % of this)


def make_ops(rng: np.random.Generator, n: int = 40, max_calls: int = 40) -> list[SynthOp]:
    """``n`` ops with heavy-tailed costs (a few matmuls dominate, many small ops), as in a
    real step; names are unique so each op is one row of the diff."""
    ops = []
    for i in range(n):
        d = int(rng.choice([64, 128, 256, 512]))
        ops.append(
            SynthOp(
                name=f"aten::op{i:02d}",
                dims=f"[[{d}, {d}], [{d}, {d}], [], []]",
                us=float(rng.lognormal(mean=3.0, sigma=1.2)),
                calls=int(rng.integers(1, max_calls)),
                parent="aten::linear" if i % 4 == 0 else None,
            )
        )
    return ops


def synth_trace(
    ops: list[SynthOp],
    *,
    steps: int = 200,
    scale: dict[str, float] | None = None,
    drift: float = 0.0,
    cv: float = 0.1,
    step_cv: float = 0.01,
    outside_us: float = 30.0,
    seed: int = 0,
    pid: int = 4242,
) -> bytes:
    """The trace's bytes; ``scale`` multiplies the named ops' durations (1.2 = 20 % slower)."""
    rng = np.random.default_rng(seed)
    scale = scale or {}
    sigma = float(np.sqrt(np.log(1 + cv * cv)))
    out: list[str] = [
        '{"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms",\n'
        '"traceEvents": [\n'
        f'{{"ph": "M", "name": "process_name", "pid": {pid}, "tid": 0, "args": {{"name": "python"}}}}'
    ]
    t = 1_000_000.0
    n_calls = sum(o.calls for o in ops)
    for s in range(steps):
        step_factor = (1 + drift) * float(rng.lognormal(0.0, step_cv))
        jitter = iter(rng.lognormal(-sigma * sigma / 2, sigma, size=n_calls * 2 + 1))
        body: list[str] = []
        cursor = t + outside_us / 2
        for o in ops:
            f = scale.get(o.name, 1.0) * step_factor
            for _ in range(o.calls):
                dur = o.us * f * next(jitter)
                if o.parent:
                    wrap = 0.02 * dur * next(jitter)
                    body.append(_x(o.parent, o.dims, cursor, dur + wrap, pid))
                    body.append(_x(o.name, o.dims, cursor + wrap / 2, dur, pid))
                    cursor += dur + wrap
                else:
                    body.append(_x(o.name, o.dims, cursor, dur, pid))
                    cursor += dur
        end = cursor + outside_us / 2 * step_factor
        out.append(
            f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s + 2}", '
            f'"pid": {pid}, "tid": {pid}, "ts": {t:.3f}, "dur": {end - t:.3f}, '
            f'"args": {{"External id": {s}}}}}'
        )
        out.extend(body)
        t = end + 1.0
    return (out[0] + ",\n" + ",\n".join(out[1:]) + "\n]}\n").encode()


def synth_profile(
    ops: list[SynthOp],
    *,
    steps: int = 200,
    scale: dict[str, float] | None = None,
    drift: float = 0.0,
    cv: float = 0.1,
    step_cv: float = 0.01,
    outside_us: float = 30.0,
    seed: int = 0,
    op_noise: float = 0.0,
    intermittent: dict[str, tuple[float, float]] | None = None,
    interrupts: tuple[float, float] = (0.0, 0.0),
) -> OpProfile:
    """What ``op_trace.read_profile`` gives for ``synth_trace``'s trace of the same
    arguments (the same model of jitter, drawn in another order), built directly: the
    bench's thousands of ranking trials need the frames, not 50 MB of JSON each.

    A noisy host, beyond that model: ``op_noise`` scales each op of this trace by its own
    log-normal factor (sd ``op_noise``: an op a few percent dearer in one trace than the
    next); ``intermittent`` maps an op to (share of steps, factor): in that share of the
    steps, drawn at random, the op takes ``factor`` x as long (a recompile, a sync);
    ``interrupts`` is (share of steps, fraction of the step): in that share of the steps
    the OS takes that much of the step, landing in one op drawn by its time."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    scale = scale or {}
    sigma = float(np.sqrt(np.log(1 + cv * cv)))
    step_factor = (1 + drift) * rng.lognormal(0.0, step_cv, size=steps)
    names, shapes, self_us, calls = [], [], [], []
    intermittent = intermittent or {}
    for o in ops:
        draws = rng.lognormal(-sigma * sigma / 2, sigma, size=(steps, o.calls))
        f = scale.get(o.name, 1.0) * (rng.lognormal(0.0, op_noise) if op_noise else 1.0)
        t = o.us * f * step_factor * draws.sum(axis=1)
        if o.name in intermittent:
            share, factor = intermittent[o.name]
            t = np.where(rng.random(steps) < share, t * factor, t)
        names.append(o.name)
        shapes.append(o.dims.replace(" ", ""))
        self_us.append(t)
        calls.append(o.calls)
        if o.parent:
            names.append(o.parent)
            shapes.append(o.dims.replace(" ", ""))
            self_us.append(0.02 * t * rng.lognormal(-sigma * sigma / 2, sigma, size=steps))
            calls.append(o.calls)
    names.append(OUTSIDE_OPS)
    shapes.append("")
    self_us.append(outside_us * step_factor)
    calls.append(1)
    k = len(names)
    values = np.stack(self_us)  # op x step
    if interrupts[0] > 0:
        hit = np.flatnonzero(rng.random(steps) < interrupts[0])
        weight = values.mean(axis=1) / values.mean(axis=1).sum()
        victims = rng.choice(k, size=len(hit), p=weight)
        values[victims, hit] += interrupts[1] * values[:, hit].sum(axis=0)
    ops_frame = pd.DataFrame(
        {
            "step": pd.Series(np.tile(np.arange(steps), k), dtype="int64"),
            "op": pd.Series(np.repeat(names, steps), dtype="string"),
            "shapes": pd.Series(np.repeat(shapes, steps), dtype="string"),
            "where": pd.Series(["cpu"] * (k * steps), dtype="string"),
            "self_us": values.reshape(-1),
            "calls": pd.Series(np.repeat(calls, steps), dtype="int64"),
        }
    )
    step_frame = pd.DataFrame({"step": np.arange(steps), "dur_us": values.sum(axis=0)})
    return OpProfile(source="<generated>", steps=step_frame, ops=ops_frame)


def _x(name: str, dims: str, ts: float, dur: float, pid: int) -> str:
    return (
        f'{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, "tid": {pid}, '
        f'"ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{"External id": 1, '
        f'"Record function id": 0, "Input type": ["float", "float", "Scalar", "Scalar"], '
        f'"Input Strides": [[256, 1], [256, 1], [], []], "Input Dims": {dims}, "Ev Idx": 1}}}}'
    )
