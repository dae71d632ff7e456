"""Step-time bounds files: the YAML format shared with the existing benchmarking system.

The other system also reads and writes these files, so unknown fields (``target_loss``,
``loss_tolerance``, whatever it adds later) must survive a load/write round trip untouched,
and fields absent from the input must not appear as ``null`` in the output. Hence
``extra="allow"`` everywhere and ``exclude_unset`` when writing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

__all__ = [
    "BenchmarkBounds",
    "BoundsError",
    "BoundsFile",
    "BoundsMetadata",
    "compute_bounds",
    "load_bounds",
    "write_bounds",
]

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
    """Write a bounds file, keeping every field that was loaded or set (and no others)."""
    data = bounds_file.model_dump(mode="python", exclude_unset=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # Write then rename, so a reader never sees a half-written file.
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    tmp.replace(path)


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
