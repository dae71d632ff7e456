"""Metric sources (``workload.metrics`` in a suite YAML) and the collector that reads them.

A workload reports numbers in whatever form it already has: a summary JSON, a JSONL log of
steps, plain log lines, a profiler trace. Rather than asking every workload to adopt one
format, a suite declares where its numbers are, and this module turns them into uniform
rows ``{name, value, step, unit, source}`` for the evaluation and results layers.

Two rules shape the collector:

* It never raises on bad data. A crashed or diverged run leaves missing files, truncated
  lines and NaN losses behind, and those are exactly the runs whose other checks must still
  be evaluated and reported. Every problem becomes a human-readable diagnostic instead, and
  a metric that could not be read is simply absent (the evaluation layer reports a check
  on an absent metric as "missing").
* Non-finite values are kept (NaN, inf): a loss that became NaN is a finding, not noise.
  Strict-JSON writers may spell them as the strings "NaN", "Infinity", "-Infinity".

What would lose or mix data is an *error* (``CollectedMetrics.errors``), not a diagnostic:
a name in the runner's reserved ``runner.`` namespace, or a (metric, step) produced by two
sources. The first value is kept, the others are named in the error, and the caller stores
what is valid and fails the cell's collect step.

A step one source logged more than once (a resume from a checkpoint logs steps 30-39
again) is a fact about the run, not a broken collection: the last value logged is kept,
the row's ``repeats`` says how often the step was logged, and ``CollectedMetrics.collapsed``
names the steps. A ``steps_complete`` check reports them ("repeated 30-39").

Import-light on purpose (no pandas). The source models the suite imports at DAG parse time
live in ``accelmatrix.metrics.source_models`` and are importable from here as before.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.metrics.junit import JunitXmlSource
from accelmatrix.metrics.profiler import TraceError, step_events, step_time_from_trace
from accelmatrix.metrics.source_models import (
    MAX_DIAGNOSTICS_PER_SOURCE,
    MAX_NAME_LEN,
    MAX_STEP,
    METRIC_NAME_RE,
    METRIC_SOURCE_TYPES,
    PREFIX_RE,
    RESERVED_PREFIX,
    JsonlSource,
    JsonSource,
    LogRegexSource,
    MetricSource,
    ProfilerTraceSource,
    RelativePath,
    parse_metric_sources,
)


# --------------------------------------------------------------------------------------------
# Collection
# --------------------------------------------------------------------------------------------
@dataclass
class CollectedMetrics:
    """Rows ``{name, value, step, unit, source}`` plus what went wrong reading them."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    # Values that were read but could not be kept (reserved name, duplicate): the cell's
    # collect fails with these, after the valid rows are stored.
    errors: list[str] = field(default_factory=list)
    # Metric -> the steps its source logged more than once (the last value is kept).
    collapsed: dict[str, list[int]] = field(default_factory=dict)

    @property
    def collapsed_rows(self) -> int:
        """How many logged rows were folded into the kept ones."""
        return sum(r.get("repeats", 1) - 1 for r in self.rows)

    def store_rows(self) -> list[MetricValue]:
        """The rows as the results store keeps them: one value per (metric, step). How often
        a step was logged (``repeats``) stays in metrics.json, where steps_complete reads it."""
        return [
            MetricValue(
                name=r["name"],
                value=r["value"],
                step=r.get("step"),
                unit=r.get("unit"),
                source=r.get("source"),
            )
            for r in self.rows
        ]

    def values(self, name: str) -> list[float]:
        """All values of one metric in collection order (convenience for callers/tests)."""
        return [r["value"] for r in self.rows if r["name"] == name]


class _Sink:
    """Collects the rows and diagnostics of one source, capping the diagnostics."""

    def __init__(self, out: CollectedMetrics, label: str) -> None:
        self.out, self.label, self.dropped = out, label, 0
        self._count = 0

    def row(self, name: str, value: float, step: int | None, unit: str | None) -> None:
        if not name.strip() or len(name) > MAX_NAME_LEN:
            self.out.errors.append(
                f"{self.label}: metric name {name[:60]!r} is empty or longer than "
                f"{MAX_NAME_LEN} characters; not stored"
            )
            return
        if name.startswith(RESERVED_PREFIX):
            self.out.errors.append(
                f"{self.label}: metric {name!r} uses the reserved namespace {RESERVED_PREFIX!r} "
                "of the runner's samples; not stored (rename it in the workload)"
            )
            return
        if step is not None and not 0 <= step <= MAX_STEP:
            self.out.errors.append(
                f"{self.label}: metric {name!r} step {step} is outside 0..{MAX_STEP} "
                "(a 64-bit integer the results store can hold); not stored"
            )
            return
        self.out.rows.append(
            {"name": name, "value": value, "step": step, "unit": unit, "source": self.label}
        )

    def problem(self, message: str, *, summary: bool = False) -> None:
        """Record a problem; per-line ones are capped, a summary (``summary``) never is."""
        if not summary:
            self._count += 1
        if summary or self._count <= MAX_DIAGNOSTICS_PER_SOURCE:
            self.out.diagnostics.append(f"{self.label}: {message}")
        else:
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            self.out.diagnostics.append(f"{self.label}: {self.dropped} more problem(s) omitted")


def collect_metrics(
    sources: list[MetricSource],
    *,
    files_dir: Path,
    log_path: Path | None,
    extra_rows: list[dict[str, Any]] | None = None,
) -> CollectedMetrics:
    """Read every source; never raises for missing or malformed data (see module doc).

    ``extra_rows`` (the runner's samples) join the rows before the duplicate check, so the
    rows returned are exactly what the results store can hold.
    """
    files_dir = Path(files_dir)
    out = CollectedMetrics()
    for source in sources:
        sink = _Sink(out, source.label)
        try:
            if isinstance(source, JsonSource):
                _collect_json(source, files_dir, sink)
            elif isinstance(source, JsonlSource):
                _collect_jsonl(source, files_dir, sink)
            elif isinstance(source, LogRegexSource):
                _collect_log_regex(source, log_path, sink)
            elif isinstance(source, ProfilerTraceSource):
                _collect_trace(source, files_dir, sink)
            elif isinstance(source, JunitXmlSource):
                source.collect(files_dir, sink)
            else:  # pragma: no cover - the union above is closed
                sink.problem(f"unknown source type {type(source).__name__}")
        except OSError as e:  # permissions, a directory where a file was expected, ...
            sink.problem(f"cannot read: {e}")
        except Exception as e:  # noqa: BLE001 - the contract is "never raises on bad data"
            sink.problem(f"unexpected error while reading: {type(e).__name__}: {e}")
        sink.close()
    out.rows.extend(extra_rows or [])
    _drop_duplicates(out)
    return out


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _number(value: Any) -> float | None:
    """JSON numbers only (bool is an int in Python, but ``true`` is not a metric), plus the
    strings strict-JSON writers use for non-finite values ("NaN", "Infinity")."""
    if isinstance(value, str):
        return _NON_FINITE.get(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int too large for a float (copysign would overflow too)
        return math.inf if value > 0 else -math.inf


def _open_file(files_dir: Path, rel: str, sink: _Sink) -> Path | None:
    path = files_dir / rel
    if not path.exists():
        sink.problem(f"file not found ({rel} in {files_dir})")
        return None
    if not path.is_file():
        sink.problem(f"{rel} is not a regular file")
        return None
    if not _inside(path, files_dir):
        sink.problem(f"{rel} resolves outside the collected files dir (symlink?); not read")
        return None
    return path


def _inside(path: Path, root: Path) -> bool:
    """The workload controls its work dir: a symlink must not expose other worker files."""
    return path.resolve().is_relative_to(root.resolve())


def _collect_json(source: JsonSource, files_dir: Path, sink: _Sink) -> None:
    path = _open_file(files_dir, source.path, sink)
    if path is None:
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        sink.problem(f"malformed JSON: {e}")
        return
    if not isinstance(data, dict):
        sink.problem(f"expected a JSON object, got {type(data).__name__}")
        return
    found = False
    for key, raw in data.items():
        value = _number(raw)
        if value is not None:
            sink.row(source.prefix + key, value, None, source.units.get(key))
            found = True
    if not found:
        sink.problem("no numeric values in the object", summary=True)


def _collect_jsonl(source: JsonlSource, files_dir: Path, sink: _Sink) -> None:
    path = _open_file(files_dir, source.path, sink)
    if path is None:
        return
    records = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
                # Typically the last line of a run killed mid-write.
                sink.problem(f"malformed line {lineno}: {e}")
                continue
            if not isinstance(obj, dict):
                sink.problem(f"line {lineno} is not a JSON object")
                continue
            step = _step_of(obj.get(source.step_key))
            if step is None:
                step = records
                sink.problem(
                    f"line {lineno} has no integer {source.step_key!r}; using record "
                    f"index {step} as the step"
                )
            records += 1
            for key, raw in obj.items():
                if key == source.step_key:
                    continue
                value = _number(raw)
                if value is not None:
                    sink.row(key, value, step, source.units.get(key))
    if records == 0:
        sink.problem("no records", summary=True)


def _step_of(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None


def _collect_log_regex(source: LogRegexSource, log_path: Path | None, sink: _Sink) -> None:
    if log_path is None:
        sink.problem("no workload log to match against")
        return
    log_path = Path(log_path)
    if not log_path.is_file():
        sink.problem(f"workload log not found ({log_path})")
        return
    regex = re.compile(source.pattern)
    index = -1
    last: tuple[int, str | None] | None = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            for m in regex.finditer(line.rstrip("\n")):
                index += 1
                if source.series:
                    value = _parse_match(m.group(1), index, sink)
                    if value is not None:
                        sink.row(source.name, value, index, source.unit)
                else:
                    last = (index, m.group(1))
    if index < 0:
        sink.problem(f"no line of the log matches {source.pattern!r}")
        return
    if not source.series and last is not None:
        value = _parse_match(last[1], last[0], sink)
        if value is not None:
            sink.row(source.name, value, None, source.unit)


def _parse_match(text: str | None, index: int, sink: _Sink) -> float | None:
    if text is None:
        sink.problem(f"match {index}: the capture group did not participate")
        return None
    try:
        return float(text)  # also accepts nan/inf, which are kept on purpose
    except ValueError:
        sink.problem(f"match {index}: {text!r} is not a number")
        return None


def _collect_trace(source: ProfilerTraceSource, files_dir: Path, sink: _Sink) -> None:
    matches = sorted(
        p for p in files_dir.glob(source.glob) if p.is_file() and _inside(p, files_dir)
    )
    if len(matches) != 1:
        shown = ", ".join(str(p.relative_to(files_dir)) for p in matches[:5])
        more = f", ... ({len(matches) - 5} more)" if len(matches) > 5 else ""
        sink.problem(
            f"expected exactly one file matching {source.glob!r} in {files_dir}, found "
            f"{len(matches)}" + (f": {shown}{more}" if matches else "")
        )
        return
    path = matches[0]
    sink.label = f"profiler_trace:{path.relative_to(files_dir).as_posix()}"
    try:
        events = step_events(path)
    except TraceError as e:
        sink.problem(str(e))
        return
    sink.row(f"{source.name}_steps", float(len(events)), None, None)
    try:
        result = step_time_from_trace(path)
    except TraceError as e:
        sink.problem(str(e))
        return
    sink.row(source.name, result.step_time, None, "s")


def _drop_duplicates(out: CollectedMetrics) -> None:
    """One row per (metric, step): a step one source logged again keeps its last value; a
    value a second source produced is an error.

    The results store keys metrics by (name, step). A source that logs a step twice said
    twice what happened at that step, and the later value is the one the run continued
    from: it replaces the earlier one, and the row counts ``repeats``. Two sources of one
    (metric, step) are a suite that maps two things onto one name: the first is kept, the
    rest named in one error per metric and pair of sources, never lost without a word.
    """
    first: dict[tuple[str, int | None], dict[str, Any]] = {}
    clashes: dict[tuple[str, str, str], list[int | None]] = {}
    kept = []
    for r in out.rows:
        seen = first.setdefault((r["name"], r["step"]), r)
        if seen is r:
            kept.append(r)
        elif seen["source"] == r["source"] and r["step"] is not None:
            seen["value"] = r["value"]
            seen["repeats"] = seen.get("repeats", 1) + 1
            steps = out.collapsed.setdefault(r["name"], [])
            if not steps or steps[-1] != r["step"]:
                steps.append(r["step"])
        else:
            clashes.setdefault((r["name"], seen["source"], r["source"]), []).append(r["step"])
    out.rows[:] = kept
    for (name, a, b), steps in clashes.items():
        where = "as a scalar" if steps[0] is None else f"at step {steps[0]}"
        more = f" (and {len(steps) - 1} more value(s))" if len(steps) > 1 else ""
        origin = f"twice in {a}" if a == b else f"from both {a} and {b}"
        out.errors.append(
            f"metric {name!r} comes {origin} {where}{more}: kept the first value, dropped "
            "the other(s); one (name, step) must have one value"
        )


# --------------------------------------------------------------------------------------------
# train_metrics.json
# --------------------------------------------------------------------------------------------
def write_train_metrics(
    rows: list[dict[str, Any]],
    path: Path,
    extra: dict[str, Any] | None = None,
    *,
    step_time_name: str = "step_time",
    loss_name: str = "loss",
) -> dict[str, Any]:
    """Write the per-run summary in the format of the system accelmatrix replaces.

    ``{"model", "train_runtime", "step_execution_time", "mfu", "final_loss", ...extra}``:
    step_execution_time is the profiler step time (never a log-line time), final_loss the
    last point of the loss series. Keys of ``extra`` win, so a caller can set model or
    override a value. A NaN loss stays NaN because a diverged run must not look like a
    missing one (null): it is written as the string "NaN" ("Infinity", "-Infinity"), which
    keeps the file strict JSON for any reader, and which the json metric source reads back
    as a number. Written atomically: readers never see half a file. Returns the summary
    (with float NaN).
    """
    summary: dict[str, Any] = {
        "model": None,
        "train_runtime": _scalar(rows, "train_runtime"),
        "step_execution_time": _scalar(rows, step_time_name),
        "mfu": None,
        "final_loss": _final(rows, loss_name),
    }
    if summary["final_loss"] is None:
        summary["final_loss"] = _scalar(rows, "final_loss")
    summary.update(extra or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    strict = {k: _strict_number(v) for k, v in summary.items()}
    tmp.write_text(json.dumps(strict, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return summary


def _strict_number(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return next(k for k, x in _NON_FINITE.items() if x == v or (x != x and v != v))
    return v


def _scalar(rows: list[dict[str, Any]], name: str) -> float | None:
    """The last scalar (step None) row of a metric, else None."""
    found = [r["value"] for r in rows if r["name"] == name and r["step"] is None]
    return found[-1] if found else None


def _final(rows: list[dict[str, Any]], name: str) -> float | None:
    """The point with the highest step of a series; a scalar of that name if no series."""
    points = [r for r in rows if r["name"] == name and r["step"] is not None]
    if points:
        # Highest step; on a tie (two sources of one series) the first declared source.
        return max(enumerate(points), key=lambda ir: (ir[1]["step"], -ir[0]))[1]["value"]
    return _scalar(rows, name)


# The models moved to source_models.py; importable from here as before.
__all__ = [
    "MAX_DIAGNOSTICS_PER_SOURCE",
    "MAX_NAME_LEN",
    "MAX_STEP",
    "METRIC_NAME_RE",
    "METRIC_SOURCE_TYPES",
    "PREFIX_RE",
    "RESERVED_PREFIX",
    "CollectedMetrics",
    "JsonSource",
    "JsonlSource",
    "JunitXmlSource",
    "LogRegexSource",
    "MetricSource",
    "ProfilerTraceSource",
    "RelativePath",
    "collect_metrics",
    "parse_metric_sources",
    "write_train_metrics",
]
