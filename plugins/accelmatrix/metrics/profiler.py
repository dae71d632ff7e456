"""Step time from a profiler trace (Chrome trace JSON, as written by torch.profiler/kineto).

Why from the trace and not from log lines: a workload prints whatever it likes (and may
print wall time that includes data loading, logging or compilation); the profiler's
``ProfilerStep#<n>`` annotations are recorded by the framework around each step, so the
distance between consecutive step starts is the real per-step cost. The system accelmatrix
replaces takes the median of those gaps for device 0 (the mean when there are fewer than
3 gaps); this module does the same so that historical bounds stay comparable.

Kept import-light (json and statistics only; gzip lazily for ``.gz`` traces) because the
metric collector runs inside Airflow tasks that should not pay for heavy imports.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

STEP_PREFIX = "ProfilerStep#"
# With 3 or more gaps the median ignores a single outlier step (e.g. a checkpoint or a late
# compilation); with fewer the median of 1-2 values is no more robust than the mean.
MEDIAN_MIN_GAPS = 3


class TraceError(ValueError):
    """A trace that cannot give a step time; the message always names the file."""


@dataclass
class StepTime:
    """The step time of one trace and how it was derived (kept for the report)."""

    step_time: float  # seconds
    method: Literal["median", "mean"]
    gaps: list[float] = field(default_factory=list)  # seconds, in trace order
    steps: list[int] = field(default_factory=list)  # step numbers, in trace order


def step_time_from_trace(path: Path) -> StepTime:
    """Median (or mean, below 3 gaps) gap between consecutive ``ProfilerStep#`` starts.

    Raises ``TraceError`` (naming the file) when the file is unreadable, is not a Chrome
    trace, or has fewer than 2 step events on the chosen row (see ``step_events``).
    """
    path = Path(path)
    points = step_events(path)
    if len(points) < 2:
        raise TraceError(
            f"{path}: {len(points)} ProfilerStep#<n> complete event(s) (ph 'X') found; a step "
            "time needs at least 2 (was the profiler schedule's active window reached?)"
        )
    gaps = [(b[0] - a[0]) / 1e6 for a, b in zip(points, points[1:], strict=False)]
    if len(gaps) >= MEDIAN_MIN_GAPS:
        method: Literal["median", "mean"] = "median"
        value = statistics.median(gaps)
    else:
        method = "mean"
        value = statistics.fmean(gaps)
    return StepTime(step_time=value, method=method, gaps=gaps, steps=[s for _, s in points])


def step_events(path: Path) -> list[tuple[float, int]]:
    """``(start_us, step_number)`` of the step events of one row of the trace, by start.

    Only one process/thread is used, chosen deterministically: the lowest pid, then the
    lowest tid. In a GPU trace the device rows have small pids (0, 1, ...) and the host
    process a large one, so this picks device 0 like the system this mirrors; in a CPU-only
    trace it is the one training thread. Returns an empty list when there are none; raises
    ``TraceError`` for unreadable or malformed files.
    """
    path = Path(path)
    rows: dict[tuple[Any, Any], list[tuple[float, int]]] = {}
    for ev in _load_events(path):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        step = _step_number(ev.get("name"))
        if step is None:
            continue
        ts = ev.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise TraceError(f"{path}: step event {ev['name']!r} has no numeric 'ts' ({ts!r})")
        rows.setdefault((ev.get("pid"), ev.get("tid")), []).append((float(ts), step))
    if not rows:
        return []
    chosen = min(rows, key=lambda key: (_id_key(key[0]), _id_key(key[1])))
    return sorted(rows[chosen])


def _step_number(name: Any) -> int | None:
    if not isinstance(name, str) or not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX) :]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def _load_events(path: Path) -> list[Any]:
    try:
        if path.suffix == ".gz":
            import gzip  # only for compressed traces; keeps the common path import-free

            with gzip.open(path, "rt", encoding="utf-8") as f:
                data = json.load(f)
        else:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise TraceError(f"{path}: cannot read trace: {e}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise TraceError(f"{path}: malformed trace JSON: {e}") from None

    # The Chrome trace format allows a bare event array as well as {"traceEvents": [...]}.
    if isinstance(data, dict):
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(f"{path}: not a Chrome trace (no 'traceEvents' list)")
        return events
    if isinstance(data, list):
        return data
    raise TraceError(f"{path}: not a Chrome trace (top level is {type(data).__name__})")


def _id_key(value: Any) -> tuple[int, float | str]:
    """Sort key for pid/tid values, which are ints in torch traces but may be strings."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return (0, int(value))
    return (1, str(value))
