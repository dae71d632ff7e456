"""Self time per op per step, read from a PyTorch profiler trace (Chrome-trace JSON).

Why a reader of our own, not a maintained one (issue 42 asks which one and why):

* HolisticTraceAnalysis (``holistictraceanalysis`` 0.5.0 on PyPI) has a trace diff, but it
  declares ``jupyterlab`` and ``pytest`` as runtime dependencies (a notebook server in
  every Airflow image that runs a gate); its diff compares the call graphs of two trace
  *directories* (one file per rank), not self time per step; and its last release (May
  2025) predates pandas 3, which this project runs.
* Perfetto's Python trace processor (``perfetto``) runs its SQL in a
  ``trace_processor_shell`` binary that it fetches at first use unless one is given: the
  machines this runs on reach package registries only.
* xprof reads XLA traces; JAX/XLA traces are not read here yet (they have no
  ``ProfilerStep#<n>`` steps, and are refused with that message).

The format itself is small and stable: kineto writes ``{"traceEvents": [...]}`` with
complete events (``ph: "X"``, ``ts``/``dur`` in µs) per op (``cat: cpu_op``), per step
(``ProfilerStep#<n>``, ``cat: user_annotation``), per device kernel (``cat: kernel``,
``gpu_memcpy``, ``gpu_memset``, linked to their launch by ``args.correlation``) and
``[memory]`` instant events when memory profiling is on. So this module decodes the fields
it needs with msgspec (installed with Airflow; typed decoding skips every field it does
not name instead of building a dict per event: two 50 MB traces diff in 1.3 s of CPU and
260 MiB, bench/bench_profile_diff.py) and aggregates in one pass. Device events are read
by the same code but were checked only on hand-made events, not a real GPU trace. ``metrics.profiler`` reads the same files for the step time; it shares its
``TraceError`` so one malformed file gives one kind of message everywhere.

Self time: an op's duration minus the durations of the ops directly inside it on the same
thread (the profiler nests ``aten::linear`` > ``aten::addmm``; the time is ``addmm``'s).
The ``ProfilerStep#<n>`` event is the root of each step; its own self time (Python, the
data loader, anything outside a recorded op) is the pseudo-op ``OUTSIDE_OPS``, so a
regression in code the profiler does not name still shows up as a row.

Ops are keyed by name, input shapes where the trace records them (``record_shapes=True``),
and where they ran (``cpu``, or ``gpu`` for device events): ``aten::mm`` on 64x256 and on
4096x4096 are different rows. Events outside every profiled step (warm-up, the trace's own
spans) are ignored.
"""

from __future__ import annotations

import bisect
import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from accelmatrix.metrics.profiler import STEP_PREFIX, TraceError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NESTED_CHILD",
    "NESTED_PARENT",
    "OUTSIDE_OPS",
    "OpProfile",
    "TraceError",
    "merge_profiles",
    "read_profile",
    "read_profiles",
]

OUTSIDE_OPS = "[step, outside any op]"
# Host-side events that are ops (their self time is counted) and nest within each other.
HOST_OP_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
# Device events: no nesting, the whole duration is the op's; step by their launch.
DEVICE_OP_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# ``OpProfile.nested``'s key columns: the op around, and the op inside it.
NESTED_PARENT = ("op", "shapes", "where")
NESTED_CHILD = ("child", "child_shapes", "child_where")
# Timestamps are µs with ns decimals, ts and dur each rounded: ends and starts this close
# are taken as equal.
_EPS_US = 2e-3


class _Args(
    msgspec.Struct,
    rename={"dims": "Input Dims", "total_allocated": "Total Allocated"},
):
    # Kept undecoded (a key, never read): empty when the trace has no shapes.
    dims: msgspec.Raw = msgspec.Raw(b"")
    correlation: int | None = None
    total_allocated: float | None = None


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]  # noqa: N815 (the format's name)


@dataclass(frozen=True)
class OpProfile:
    """One trace, aggregated: what ``profile_diff.diff_profiles`` compares.

    ``steps``: one row per profiled step (``step``: its number, ``dur_us``).
    ``ops``: one row per (step, op, shapes, where) with ``self_us`` and ``calls``; an op
    absent from a step has no row there (the diff counts it as 0 in that step).
    ``peak_memory_bytes``: the highest ``Total Allocated`` of the ``[memory]`` events within
    the steps, None when the trace was recorded without ``profile_memory``.
    ``nested``: one row per (step, op, shapes, where, child, child_shapes, child_where)
    with the ``self_us`` and ``calls`` of ``child`` inside ``op`` (any depth below it,
    host ops only): what the diff needs to report an op new in the culprit together with the ops it
    calls, as one row (its inclusive time). None when not read from a trace.
    """

    source: str
    steps: pd.DataFrame
    ops: pd.DataFrame
    peak_memory_bytes: float | None = None
    nested: pd.DataFrame | None = None

    @property
    def n_steps(self) -> int:
        return len(self.steps)


def read_profile(path: Path | str) -> OpProfile:
    """Aggregate one trace file (``.json`` or ``.json.gz``); ``TraceError`` naming the file
    and what is wrong when it cannot be read, is truncated or malformed, or has no
    profiled step."""
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except (OSError, EOFError) as e:
        raise TraceError(f"{path}: cannot read trace: {e}") from None
    return profile_from_bytes(raw, source=str(path))


def read_profiles(paths: Sequence[Path | str]) -> OpProfile:
    """Several traces of one build as one profile (``merge_profiles``)."""
    return merge_profiles([read_profile(p) for p in paths])


def merge_profiles(profiles: Sequence[OpProfile]) -> OpProfile:
    """The steps of several traces of one build, as if from one trace.

    Why: a re-test that keeps a few profiled samples per build, interleaved with the other
    build's (A B B A), spreads a busy minute on the host over both builds instead of
    landing it on one. Steps are renumbered in order (each trace numbers its own from the
    schedule's start); the peak memory is the highest of the traces'."""
    import pandas as pd

    if not profiles:
        raise TraceError("no trace to read")
    if len(profiles) == 1:
        return profiles[0]
    steps, ops, renumbers, offset = [], [], [], 0
    for p in profiles:
        renumber = {s: offset + i for i, s in enumerate(p.steps["step"].tolist())}
        renumbers.append(renumber)
        steps.append(p.steps.assign(step=p.steps["step"].map(renumber)))
        ops.append(p.ops.assign(step=p.ops["step"].map(renumber)))
        offset += len(renumber)
    nested = [
        p.nested.assign(step=p.nested["step"].map(renumber))
        for p, renumber in zip(profiles, renumbers, strict=True)
        if p.nested is not None
    ]
    peaks = [p.peak_memory_bytes for p in profiles if p.peak_memory_bytes is not None]
    return OpProfile(
        source=", ".join(p.source for p in profiles),
        steps=pd.concat(steps, ignore_index=True),
        ops=pd.concat(ops, ignore_index=True),
        peak_memory_bytes=max(peaks) if peaks else None,
        nested=pd.concat(nested, ignore_index=True) if nested else None,
    )


def profile_from_bytes(raw: bytes, *, source: str = "<trace>") -> OpProfile:
    """``read_profile`` over the file's bytes (the tests and the bench feed bytes)."""
    events = _decode(raw, source)
    return _aggregate(events, source)


def _decode(raw: bytes, source: str) -> list[_Event]:
    if not raw.strip():
        raise TraceError(f"{source}: empty trace file")
    try:
        data = msgspec.json.decode(raw, type=_Trace | list[_Event])
    except msgspec.ValidationError as e:
        raise TraceError(f"{source}: not a PyTorch profiler trace: {e}") from None
    except msgspec.DecodeError as e:
        # msgspec says "truncated" for a file cut short (a profiler killed mid-write).
        kind = "truncated" if "truncated" in str(e).lower() else "malformed"
        raise TraceError(f"{source}: {kind} trace JSON: {e}") from None
    return data.traceEvents if isinstance(data, _Trace) else data


def _aggregate(events: list[_Event], source: str) -> OpProfile:
    import pandas as pd

    steps = _steps(events, source)
    starts = [s[0] for s in steps]
    ends = [s[1] for s in steps]

    def step_at(ts: float) -> int | None:
        i = bisect.bisect_right(starts, ts + _EPS_US) - 1
        return i if i >= 0 and ts < ends[i] - _EPS_US else None

    # (step index, op key) -> [self_us, calls]
    acc: dict[tuple[int, tuple[str, str, str]], list[float]] = {}
    shapes_cache: dict[bytes, str] = {}
    correlated: dict[int, int] = {}  # correlation id -> step index of the launch
    device: list[_Event] = []
    threads: dict[tuple[Any, Any], list[_Event]] = {}
    peak: float | None = None
    for ev in events:
        if ev.ph == "X" and ev.ts is not None and ev.dur is not None:
            if ev.cat in HOST_OP_CATS:
                threads.setdefault((ev.pid, ev.tid), []).append(ev)
            elif ev.cat in DEVICE_OP_CATS:
                device.append(ev)
        elif ev.ph == "i" and ev.name == "[memory]" and ev.args is not None:
            total = ev.args.total_allocated
            if total is not None and ev.ts is not None and step_at(ev.ts) is not None:
                peak = total if peak is None else max(peak, total)

    def key(ev: _Event, where: str) -> tuple[str, str, str]:
        b = bytes(ev.args.dims) if ev.args is not None else b""
        if not b:
            return (ev.name, "", where)
        shapes = shapes_cache.get(b)
        if shapes is None:
            shapes = shapes_cache[b] = b.decode("utf-8", "replace").replace(" ", "")
        return (ev.name, shapes, where)

    def add(step: int, k: tuple[str, str, str], self_us: float) -> None:
        cell = acc.get((step, k))
        if cell is None:
            acc[(step, k)] = [self_us, 1.0]
        else:
            cell[0] += self_us
            cell[1] += 1.0

    # (step index, ancestor op key, op key) -> [the op's self µs, calls] inside that ancestor
    inside: dict[tuple[int, tuple[str, str, str], tuple[str, str, str]], list[float]] = {}

    for rows in threads.values():
        rows.sort(key=lambda e: (e.ts, -e.dur))
        # stack of [end, event, child time, step]
        stack: list[list[Any]] = []

        def close(frame: list[Any], around: list[list[Any]]) -> None:
            ev, children, step = frame[1], frame[2], frame[3]
            if step is None:
                return
            own = max(ev.dur - children, 0.0)
            if ev.name.startswith(STEP_PREFIX):
                add(step, (OUTSIDE_OPS, "", "cpu"), own)
                return
            k = key(ev, "cpu")
            add(step, k, own)
            # Every op open around it (the stack, its ancestors; the step's root aside).
            seen: set[tuple[str, str, str]] = {k}
            for up in around:
                if up[3] != step or up[1].name.startswith(STEP_PREFIX):
                    continue
                ka = key(up[1], "cpu")
                if ka in seen:  # an op inside itself (recursion): counted once
                    continue
                seen.add(ka)
                slot = (step, ka, k)
                cell = inside.get(slot)
                if cell is None:
                    inside[slot] = [own, 1.0]
                else:
                    cell[0] += own
                    cell[1] += 1.0

        for ev in rows:
            # The open op is not this one's parent when it ended before this one began, or
            # ends before this one does: two ops back to back whose µs timestamps were
            # rounded (ns decimals) can overlap by a nanosecond, and must stay siblings.
            while stack and (
                stack[-1][0] <= ev.ts + _EPS_US or ev.ts + ev.dur > stack[-1][0] + _EPS_US
            ):
                close(stack.pop(), stack)
            if stack:
                stack[-1][2] += ev.dur
            step = step_at(ev.ts)
            if ev.args is not None and ev.args.correlation is not None and step is not None:
                correlated[ev.args.correlation] = step
            stack.append([ev.ts + ev.dur, ev, 0.0, step])
        while stack:
            close(stack.pop(), stack)

    for ev in device:
        corr = ev.args.correlation if ev.args is not None else None
        step = correlated.get(corr) if corr is not None else None
        if step is None:
            step = step_at(ev.ts)
        if step is not None:
            add(step, key(ev, "gpu"), ev.dur)

    numbers = [s[2] for s in steps]
    items = list(acc.items())
    ops = pd.DataFrame(
        {
            "step": pd.Series([numbers[s] for (s, _), _ in items], dtype="int64"),
            "op": pd.Series([k[0] for (_, k), _ in items], dtype="string"),
            "shapes": pd.Series([k[1] for (_, k), _ in items], dtype="string"),
            "where": pd.Series([k[2] for (_, k), _ in items], dtype="string"),
            "self_us": pd.Series([v[0] for _, v in items], dtype="float64"),
            "calls": pd.Series([v[1] for _, v in items], dtype="int64"),
        }
    )
    step_frame = pd.DataFrame(
        {
            "step": pd.Series(numbers, dtype="int64"),
            "dur_us": pd.Series([e - s for s, e, _ in steps], dtype="float64"),
        }
    )
    pairs = list(inside.items())
    nested = pd.DataFrame(
        {
            "step": pd.Series([numbers[s] for (s, _, _), _ in pairs], dtype="int64"),
            **{
                col: pd.Series([k[j] for (_, k, _), _ in pairs], dtype="string")
                for j, col in enumerate(NESTED_PARENT)
            },
            **{
                col: pd.Series([k[j] for (_, _, k), _ in pairs], dtype="string")
                for j, col in enumerate(NESTED_CHILD)
            },
            "self_us": pd.Series([v[0] for _, v in pairs], dtype="float64"),
            "calls": pd.Series([v[1] for _, v in pairs], dtype="int64"),
        }
    )
    return OpProfile(
        source=source, steps=step_frame, ops=ops, peak_memory_bytes=peak, nested=nested
    )


def _steps(events: list[_Event], source: str) -> list[tuple[float, float, int]]:
    """(start, end, number) of the profiled steps, by start, from one thread.

    The thread is the one with the most step events (the training loop's): a second
    thread's annotations of the same name would otherwise double every window."""
    rows: dict[tuple[Any, Any], list[tuple[float, float, int]]] = {}
    for ev in events:
        if ev.ph != "X" or not ev.name.startswith(STEP_PREFIX):
            continue
        digits = ev.name[len(STEP_PREFIX) :]
        if not (digits.isascii() and digits.isdigit()) or ev.ts is None or ev.dur is None:
            continue
        rows.setdefault((ev.pid, ev.tid), []).append((ev.ts, ev.ts + ev.dur, int(digits)))
    if not rows:
        raise TraceError(
            f"{source}: no {STEP_PREFIX}<n> step events (ph 'X'); an op diff needs the "
            "profiler's steps (was prof.step() called, and the schedule's active window reached?)"
        )
    best = max(rows.values(), key=len)
    return sorted(best)
