"""Step-time bounds files: the YAML format shared with the existing benchmarking system.

The other system also reads and writes these files, so unknown fields (``target_loss``,
``loss_tolerance``, whatever it adds later) must survive a load/write round trip untouched,
and fields absent from the input must not appear as ``null`` in the output. Hence
``extra="allow"`` everywhere and ``exclude_unset`` when writing.

accelmatrix itself never writes a bounds file under the include dir: a deployment's include/
comes from git (a DAG bundle, git-sync), read-only or overwritten at the next deploy. The
file is the initial baseline; bounds re-centered since (the maintenance DAG, an accepted
change) are rows of the results store (``results.stored_bounds``), and every reader sees
the file with them applied (``load_bounds_in_force``, ``apply_stored``). ``export_text``
prints the file with them applied, comments kept, for a person to open a PR with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from accelmatrix import settings
from accelmatrix.contracts.series_records import BoundsRecord
from accelmatrix.results import results_store

__all__ = [
    "PERF_FIELDS",
    "BenchmarkBounds",
    "BoundsError",
    "BoundsFile",
    "BoundsMetadata",
    "apply_stored",
    "bounds_key",
    "compute_bounds",
    "export_text",
    "load_bounds",
    "load_bounds_in_force",
    "read_stored",
    "row_in_force",
    "write_bounds",
]

# The fields a re-centering sets (and a stored row overrides); every other field of a
# benchmark (name, target_loss, ...) is the file's alone.
PERF_FIELDS = (
    "step_time_lower_bound",
    "step_time_upper_bound",
    "confidence_interval",
    "average",
    "sample_size",
)

# benchmark -> its newest stored row (results.stored_bounds), for one bounds file.
Stored = Mapping[str, BoundsRecord]

# Floor on the half-width, as a fraction of the mean: a very stable history would otherwise
# give bounds so tight that ordinary machine noise fails the check.
MIN_RELATIVE_HALF_WIDTH = 0.015


class BoundsError(ValueError):
    """A bounds file is missing, unreadable, malformed, or lacks the requested benchmark."""


class BenchmarkBounds(BaseModel):
    """One benchmark's step-time bounds; other fields are kept as-is for the other system."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    step_time_lower_bound: float | None = None
    step_time_upper_bound: float | None = None
    confidence_interval: float | None = None
    average: float | None = None
    sample_size: int | None = None

    @model_validator(mode="after")
    def _ordered(self) -> BenchmarkBounds:
        lo, hi = self.step_time_lower_bound, self.step_time_upper_bound
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"step_time_lower_bound ({lo}) must be <= step_time_upper_bound ({hi})"
            )
        return self


class BoundsMetadata(BaseModel):
    """How the bounds were computed; free-form apart from the confidence level."""

    model_config = ConfigDict(extra="allow")

    query_start: Any = None
    query_end: Any = None
    confidence_level: float | None = None


class BoundsFile(BaseModel):
    """A whole bounds file: benchmarks by key, plus metadata."""

    model_config = ConfigDict(extra="allow")

    benchmarks: dict[str, BenchmarkBounds]
    metadata: BoundsMetadata | None = None

    def get(self, benchmark: str, *, source: str | Path = "bounds file") -> BenchmarkBounds:
        """The named benchmark; the error lists what is available so a typo is obvious."""
        try:
            return self.benchmarks[benchmark]
        except KeyError:
            available = ", ".join(sorted(self.benchmarks)) or "(none)"
            raise BoundsError(
                f"benchmark {benchmark!r} not found in {source}; available benchmarks: {available}"
            ) from None


def load_bounds(path: str | Path) -> BoundsFile:
    """Read and validate a bounds file; every error names the file (and field, if any)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BoundsError(f"bounds file {path} not found") from None
    except OSError as exc:
        raise BoundsError(f"cannot read bounds file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise BoundsError(f"bounds file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise BoundsError(f"bounds file {path} must be a mapping with a 'benchmarks' key")
    try:
        return BoundsFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise BoundsError(f"invalid bounds file {path}: {problems}") from None


def write_bounds(path: str | Path, bounds_file: BoundsFile) -> None:
    """Write a bounds file, keeping every field that was loaded or set (and no others).

    For files outside the include dir (tests, a copy to edit): accelmatrix never writes the
    include dir's bounds files, it stores re-centered bounds (see the module docstring)."""
    data = bounds_file.model_dump(mode="python", exclude_unset=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # Write then rename, so a reader never sees a half-written file.
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    tmp.replace(path)


# -- stored bounds over the file ----------------------------------------------------------


def bounds_key(path: str | Path, include_dir: str | Path | None = None) -> str:
    """The key of a bounds file in the results store: its path relative to the include dir
    (posix, as a suite's check names it: ``bounds/nightly_perf_bounds.yaml``); a file
    outside the include dir is keyed by its resolved absolute path."""
    if include_dir is None:
        include_dir = settings.include_dir()
    p = Path(path).resolve()
    try:
        return p.relative_to(Path(include_dir).resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)


def row_in_force(bench: BenchmarkBounds, row: BoundsRecord) -> bool:
    """Whether a stored row still holds over the file's benchmark: the file still has the
    bounds the row was made over. A file changed since (a PR of the exported bounds, a
    person's new baseline) is a newer decision, and its values hold."""
    return _same(row.file_lower_bound, bench.step_time_lower_bound) and _same(
        row.file_upper_bound, bench.step_time_upper_bound
    )


def apply_stored(bounds_file: BoundsFile, stored: Stored) -> BoundsFile:
    """A copy of ``bounds_file`` with each benchmark's stored row in force applied: its
    perf fields that are set replace the file's; everything else is the file's. A row of
    a benchmark the file no longer has is ignored."""
    out = bounds_file.model_copy(deep=True)
    for name, row in stored.items():
        bench = out.benchmarks.get(name)
        if bench is None or not row_in_force(bench, row):
            continue
        for k in PERF_FIELDS:
            if (value := getattr(row, k)) is not None:
                setattr(bench, k, value)
    return out


def read_stored(key: str) -> dict[str, BoundsRecord]:
    """The stored rows in force of bounds file ``key`` in this process's results store.

    A SQLite store whose file does not exist yet has stored nothing: it is not created for
    a read (a check evaluated where no store was ever written, e.g. a test)."""

    url = settings.results_url()
    if url.startswith("sqlite:"):
        from sqlalchemy.engine import make_url

        db = make_url(url).database
        if db and db != ":memory:" and not db.startswith("file:") and not Path(db).exists():
            return {}

    return results_store().bounds_in_force(key)


def load_bounds_in_force(
    path: str | Path,
    *,
    include_dir: str | Path | None = None,
    stored: Stored | Callable[[str], Stored] | None = None,
) -> BoundsFile:
    """The bounds file at ``path`` with its stored rows in force applied.

    ``stored``: the rows (benchmark -> row), or a function of the file's key returning
    them; None reads this process's results store (``read_stored``)."""
    loaded = load_bounds(path)
    if stored is None or callable(stored):
        key = bounds_key(path, include_dir)
        try:
            rows = (stored or read_stored)(key)
        except Exception as exc:  # noqa: BLE001 - named: the check fails, never judges stale
            raise BoundsError(
                f"stored bounds of {key} could not be read from the results store: {exc}"
            ) from None
    else:
        rows = stored
    return apply_stored(loaded, rows) if rows else loaded


def _scalar(v: Any) -> str:
    """``v`` as a YAML 1.1 plain scalar that PyYAML reads back as the same value."""
    return yaml.safe_dump(v, default_flow_style=True).removesuffix("\n...\n").strip()


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[^\s#][^#]*?)\s*:(?P<rest>\s.*)?$")


def _content(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _key_of(text: str) -> Any:
    try:
        loaded = yaml.safe_load(f"{text}: 0")
    except yaml.YAMLError:
        return None
    return next(iter(loaded)) if isinstance(loaded, dict) and len(loaded) == 1 else None


def _edit_benchmarks(lines: list[str], values: dict[str, dict[str, Any]]) -> list[str] | None:
    """``lines`` with the perf fields of ``values`` set in place, every other line as it
    was; None when the layout is not the plain block style this edits."""
    out = list(lines)
    start = next(
        (
            i
            for i, ln in enumerate(out)
            if (m := _KEY.match(ln.rstrip("\n")))
            and not m["indent"]
            and _key_of(m["key"]) == "benchmarks"
        ),
        None,
    )
    if start is None:
        return None
    todo = {name: dict(fields) for name, fields in values.items()}
    i = start + 1
    bench_indent = None
    while i < len(out):
        line = out[i].rstrip("\n")
        if not _content(line):
            i += 1
            continue
        ind = _indent(line)
        if ind == 0:
            break
        bench_indent = ind if bench_indent is None else bench_indent
        m = _KEY.match(line)
        if ind != bench_indent or m is None:
            i += 1
            continue
        name = _key_of(m["key"])
        end = i + 1  # the benchmark's block: its deeper lines
        last = i
        while end < len(out):
            ln = out[end].rstrip("\n")
            if _content(ln):
                if _indent(ln) <= bench_indent:
                    break
                last = end
            end += 1
        if name in todo:
            rest = (m["rest"] or "").strip()
            if rest and not rest.startswith("#"):
                return None  # flow style (``tiny: {a: 1}``): not edited in place
            fields = todo.pop(name)
            field_indent = None
            for j in range(i + 1, last + 1):
                ln = out[j].rstrip("\n")
                if not _content(ln):
                    continue
                field_indent = _indent(ln) if field_indent is None else field_indent
                fm = _KEY.match(ln)
                if _indent(ln) != field_indent or fm is None:
                    continue
                k = _key_of(fm["key"])
                if k in fields:
                    comment = ""
                    if "#" in (fm["rest"] or ""):
                        tail = fm["rest"]
                        # A comment after the value: kept when the value is a plain number.
                        before, _, after = tail.partition("#")
                        if before.strip() and not before.rstrip().endswith(("'", '"')):
                            comment = "  #" + after.rstrip()
                    out[j] = f"{fm['indent']}{fm['key']}: {_scalar(fields.pop(k))}{comment}\n"
            pad = " " * (field_indent if field_indent is not None else bench_indent + 2)
            extra = [f"{pad}{k}: {_scalar(v)}\n" for k, v in fields.items()]
            if extra:
                if not out[last].endswith("\n"):
                    out[last] += "\n"
                out[last + 1 : last + 1] = extra
                end += len(extra)
        i = end
    return None if todo else out


def export_text(path: str | Path, stored: Stored) -> tuple[str, dict[str, dict[str, Any]]]:
    """The text of the bounds file at ``path`` with its stored rows in force applied, and
    what changed (benchmark -> {field: new value}).

    The file's own lines are kept (comments, order, fields accelmatrix does not know) and
    only the values of the perf fields change, added where the file lacks them; the result
    is checked to read back as the file with the stored values. A layout this does not
    edit in place (flow style, anchors) is printed whole by PyYAML, without its comments.
    """
    path = Path(path)
    text = path.read_text()
    base = load_bounds(path)
    applied = apply_stored(base, stored)
    changes: dict[str, dict[str, Any]] = {}
    for name, bench in applied.benchmarks.items():
        old = base.benchmarks[name]
        diff = {
            k: getattr(bench, k)
            for k in PERF_FIELDS
            if getattr(bench, k) is not None and getattr(bench, k) != getattr(old, k)
        }
        if diff:
            changes[name] = diff
    if not changes:
        return text, changes
    want = yaml.safe_load(text)
    for name, diff in changes.items():
        want["benchmarks"][name].update(diff)
    edited = _edit_benchmarks(text.splitlines(keepends=True), changes)
    if edited is not None:
        new = "".join(edited)
        try:
            if yaml.safe_load(new) == want:
                return new, changes
        except yaml.YAMLError:
            pass
    header = f"# {path.name} with the stored bounds applied; its comments could not be kept\n"
    return header + yaml.safe_dump(want, sort_keys=False, default_flow_style=False), changes


def _t_quantile(p: float, dof: int) -> float:
    """Student-t quantile; scipy is a Great Expectations dependency, imported lazily."""
    from scipy.stats import t

    return float(t.ppf(p, dof))


def compute_bounds(samples: list[float], confidence: float) -> dict[str, float | int]:
    """Bounds from historical step times, with the field names of a bounds file.

    Half-width H is the largest of: the two-sided Student-t interval half-width of the mean at
    ``confidence``, 1.5% of the mean, and the distance from the mean to the extreme samples
    (so every historical sample lies inside). Bounds are ``[max(0, mean - H), mean + H]``;
    ``confidence_interval`` reports the t half-width alone.
    """
    n = len(samples)
    if n < 2:
        raise ValueError(f"compute_bounds needs at least 2 samples, got {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = [float(s) for s in samples]
    if not all(math.isfinite(v) for v in values):
        raise ValueError("compute_bounds: samples must be finite numbers")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    t_half = _t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(variance / n)
    half = max(t_half, MIN_RELATIVE_HALF_WIDTH * abs(mean), max(values) - mean, mean - min(values))
    return {
        "step_time_lower_bound": max(0.0, mean - half),
        "step_time_upper_bound": mean + half,
        "confidence_interval": t_half,
        "average": mean,
        "sample_size": n,
    }
