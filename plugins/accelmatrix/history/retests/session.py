"""A re-test session's samples, read back from its log, and paired for ``history.retests.compare``.

The session cell's workload (``backends/interleave.py``) runs every build of the re-test
on one machine, in palindromes, and writes marker lines around each sample. Its log is
collected like any cell's (``output.log`` in the cell's artifacts, whatever the backend).
``read_samples`` splits that log at the markers and reads each sample's metrics with the
suite's own metric sources (``metrics.sources.collect_metrics``, the code collect uses), so
a re-test measures exactly what the nightly measured. Only log sources can be told apart
per sample: a metrics file the workload writes is overwritten by the next sample, so a
series read from a file is refused when the re-test starts (``history.retests.followup``).

A sample's value is the metric's statistic over its steps (``history.track``: median by
default), as a nightly point is. Samples are pooled over rounds (each round is a session
of its own on a machine of its own); ``pairs`` pairs each sample of a build with the
reference build's sample of the same half-palindrome of the same round, so every pair
comes from one machine, minutes apart.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accelmatrix.backends.interleave import MARK
from accelmatrix.metrics.source_models import LogRegexSource
from accelmatrix.metrics.sources import collect_metrics

__all__ = ["Sample", "Session", "pairs_of", "read_samples", "values_of"]


@dataclass(frozen=True)
class Sample:
    """One sample of one metric: which round (session) and half-palindrome it was taken
    in, its build, its place in the session's order, and its value."""

    round: int
    half: int
    index: int
    build: str
    metric: str
    value: float

    def as_list(self) -> list[object]:
        """The compact JSON row kept on the re-test (``confirmations.samples``)."""
        return [self.round, self.half, self.index, self.build, self.metric, self.value]

    @classmethod
    def from_list(cls, row: Sequence[object]) -> Sample:
        r, h, i, b, m, v = row
        return cls(int(r), int(h), int(i), str(b), str(m), float(v))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Session:
    """What a session's log says: its samples, and the samples that did not end well."""

    samples: list[Sample]
    ran: int  # samples that began
    failed: list[str]  # "sample 7 (nightly-2026-03-07) exited 1"


def read_samples(
    log_path: Path,
    *,
    builds: Sequence[str],
    round_: int,
    sources: Iterable[object],
    statistics: dict[str, str],
) -> Session:
    """The samples of the metrics in ``statistics`` (metric -> numpy statistic name, or
    ``last``) in a session log; ``builds`` in the session's order of builds."""

    wanted = [s for s in sources if isinstance(s, LogRegexSource) and s.name in statistics]
    segments, failed = _segments(log_path)
    out: list[Sample] = []
    n = len(builds)
    with tempfile.TemporaryDirectory(prefix="accelmatrix-session-") as tmp:
        for index, (build, lines) in sorted(segments.items()):
            part = Path(tmp) / f"{index}.log"
            part.write_text("".join(lines), encoding="utf-8")
            rows = collect_metrics(wanted, files_dir=Path(tmp), log_path=part).rows
            for metric, stat in statistics.items():
                values = np.asarray(
                    [r["value"] for r in rows if r["name"] == metric], dtype="float64"
                )
                values = values[np.isfinite(values)]
                if not len(values):
                    continue
                value = float(values[-1] if stat == "last" else getattr(np, stat)(values))
                out.append(Sample(round_, index // n, index, build, metric, value))
    return Session(samples=out, ran=len(segments), failed=failed)


def _segments(log_path: Path) -> tuple[dict[int, tuple[str, list[str]]], list[str]]:
    """sample index -> (build, its lines); and the samples that did not exit 0. A sample
    with no end marker (the session was killed in it) is dropped: half a run is no
    sample."""
    open_: dict[int, tuple[str, list[str]]] = {}
    done: dict[int, tuple[str, list[str]]] = {}
    failed: list[str] = []
    current: int | None = None
    if not log_path.is_file():
        return {}, [f"no session log at {log_path}"]
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(MARK):
                try:
                    mark = json.loads(line[len(MARK) :])
                except ValueError:
                    continue
                i = int(mark.get("i", -1))
                if mark.get("event") == "begin":
                    open_[i] = (str(mark.get("build")), [])
                    current = i
                elif mark.get("event") == "end" and i in open_:
                    if mark.get("exit") == 0:
                        done[i] = open_.pop(i)
                    else:
                        build = open_.pop(i)[0]
                        failed.append(f"sample {i} ({build}) exited {mark.get('exit')}")
                    current = None
                continue
            if current is not None and current in open_:
                open_[current][1].append(line)
    for i, (build, _lines) in open_.items():
        failed.append(f"sample {i} ({build}) did not end (the session was cut short)")
    return done, failed


def values_of(samples: Iterable[Sample], build: str, metric: str) -> list[float]:
    return [s.value for s in samples if s.build == build and s.metric == metric]


def pairs_of(
    samples: Iterable[Sample], reference: str, build: str, metric: str
) -> list[tuple[float, float]]:
    """(reference value, build value) of every half-palindrome of every round that holds a
    sample of both."""
    ref: dict[tuple[int, int], float] = {}
    other: dict[tuple[int, int], float] = {}
    for s in samples:
        if s.metric != metric or not math.isfinite(s.value):
            continue
        if s.build == reference:
            ref[(s.round, s.half)] = s.value
        elif s.build == build:
            other[(s.round, s.half)] = s.value
    return [(ref[k], other[k]) for k in sorted(ref) if k in other]
