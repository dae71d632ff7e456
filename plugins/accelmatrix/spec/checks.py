"""Checks a user writes in suite YAML to validate one matrix cell.

Each check is a small pydantic model; ``Check`` is the discriminated union on ``type`` so a
suite file gets precise errors ("min must be <= max") at load time instead of a confusing
failure deep inside the evaluation task. Only pydantic is imported here: suite parsing runs
during DAG parsing and must stay cheap.

String fields may contain ``${axis.model}``-style placeholders. They are resolved before
evaluation, so validation here treats them as plain text.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

__all__ = [
    "CHECK_TYPES",
    "ArtifactCountCheck",
    "Check",
    "ElapsedRegressionCheck",
    "ExitStatusCheck",
    "FinalLossCheck",
    "JunitCheck",
    "LogContainsCheck",
    "LogNotContainsCheck",
    "LossDecreasingCheck",
    "MetricBetweenCheck",
    "NotebooksCheck",
    "ReportItemsCheck",
    "StepTimeWithinBoundsCheck",
    "WorkersStartedCheck",
    "parse_checks",
    "GoldenCasesCheck",
]

Reduce = Literal["last", "min", "max", "mean", "median"]


def _relative_path(value: str, field: str) -> str:
    """Reject paths that could escape their base directory (absolute or with ``..`` parts)."""
    if not value.strip():
        raise ValueError(f"{field} must not be empty")
    if PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute():
        raise ValueError(f"{field} must be a relative path, got absolute path {value!r}")
    parts = re.split(r"[\\/]", value)
    if ".." in parts:
        raise ValueError(f"{field} must not contain '..' path parts, got {value!r}")
    return value


def _check_min_max(lo: float | None, hi: float | None, what: str) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{what}: min ({lo}) must be <= max ({hi})")


class _CheckBase(BaseModel):
    """Common fields; ``extra="forbid"`` so a typo in suite YAML is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    # warning: reported in the verdict table and the log, never fails the cell.
    severity: Literal["error", "warning"] = "error"

    @property
    def display_name(self) -> str:
        """The user's name, or a derived one readable in task logs and Data Docs."""
        return self.name or f"{self.type}[{self._name_detail()}]"  # type: ignore[attr-defined]

    def _name_detail(self) -> str:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


class ExitStatusCheck(_CheckBase):
    """The workload exited with ``expected`` and did not time out."""

    type: Literal["exit_status"] = "exit_status"
    expected: int = 0

    def _name_detail(self) -> str:
        return str(self.expected)


class LogContainsCheck(_CheckBase):
    """At least ``min_count`` lines of the workload log match ``pattern``."""

    type: Literal["log_contains"] = "log_contains"
    pattern: str = Field(min_length=1)
    regex: bool = False
    min_count: int = 1

    @field_validator("min_count")
    @classmethod
    def _min_count_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"min_count must be >= 1 (a count of 0 always passes), got {v}")
        return v

    @model_validator(mode="after")
    def _regex_compiles(self) -> LogContainsCheck:
        _compile_if_regex(self.pattern, self.regex)
        return self

    def _name_detail(self) -> str:
        return self.pattern


class LogNotContainsCheck(_CheckBase):
    """No line of the workload log matches ``pattern`` (e.g. NCCL timeouts, tracebacks)."""

    type: Literal["log_not_contains"] = "log_not_contains"
    pattern: str = Field(min_length=1)
    regex: bool = True

    @model_validator(mode="after")
    def _regex_compiles(self) -> LogNotContainsCheck:
        _compile_if_regex(self.pattern, self.regex)
        return self

    def _name_detail(self) -> str:
        return self.pattern


def _compile_if_regex(pattern: str, regex: bool) -> None:
    """Fail at suite load time rather than at evaluation time for a broken regex."""
    if not regex:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from exc


class ArtifactCountCheck(_CheckBase):
    """The number of files under the cell's files dir matching ``glob`` is within [min, max]."""

    type: Literal["artifact_count"] = "artifact_count"
    glob: str
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)
    count: int | None = Field(default=None, ge=0)

    @field_validator("glob")
    @classmethod
    def _glob_relative(cls, v: str) -> str:
        return _relative_path(v, "glob")

    @model_validator(mode="after")
    def _bounds(self) -> ArtifactCountCheck:
        if self.count is not None:
            # Tolerate min == max == count so a dumped model validates again unchanged.
            for bound in (self.min, self.max):
                if bound is not None and bound != self.count:
                    raise ValueError("artifact_count: give either count or min/max, not both")
            self.min = self.max = self.count
        if self.min is None and self.max is None:
            raise ValueError("artifact_count needs count, min or max")
        _check_min_max(self.min, self.max, "artifact_count")
        return self

    def _name_detail(self) -> str:
        return self.glob


class MetricBetweenCheck(_CheckBase):
    """The reduced value of a metric series lies within [min, max]."""

    type: Literal["metric_between"] = "metric_between"
    metric: str = Field(min_length=1)
    min: float | None = None
    max: float | None = None
    reduce: Reduce = "last"

    @model_validator(mode="after")
    def _bounds(self) -> MetricBetweenCheck:
        if self.min is None and self.max is None:
            raise ValueError("metric_between needs at least one of min or max")
        _check_min_max(self.min, self.max, "metric_between")
        return self

    def _name_detail(self) -> str:
        return self.metric


class FinalLossCheck(_CheckBase):
    """The last loss value is within ``tolerance`` of ``target``.

    Target and tolerance are given inline, or read from a benchmark of a bounds file
    (``bounds_file`` + ``benchmark``: its ``target_loss`` and ``loss_tolerance`` fields),
    where the system this replaces keeps them next to the step-time bounds.
    """

    type: Literal["final_loss"] = "final_loss"
    metric: str = Field(default="loss", min_length=1)
    target: float | None = None
    tolerance: float | None = None
    bounds_file: str | None = None
    benchmark: str | None = Field(default=None, min_length=1)

    @field_validator("tolerance")
    @classmethod
    def _tolerance_non_negative(cls, v: float | None) -> float | None:
        if v is not None and v < 0:
            raise ValueError(f"tolerance must be >= 0, got {v}")
        return v

    @field_validator("bounds_file")
    @classmethod
    def _bounds_file_relative(cls, v: str | None) -> str | None:
        return None if v is None else _relative_path(v, "bounds_file")

    @model_validator(mode="after")
    def _one_source(self) -> FinalLossCheck:
        inline = (self.target is not None, self.tolerance is not None)
        from_file = (self.bounds_file is not None, self.benchmark is not None)
        if any(from_file):
            if not all(from_file):
                raise ValueError("final_loss: bounds_file and benchmark go together")
            if any(inline):
                raise ValueError(
                    "final_loss: give either target/tolerance or bounds_file/benchmark, not both"
                )
        elif not all(inline):
            raise ValueError("final_loss needs target and tolerance (or bounds_file and benchmark)")
        return self

    def _name_detail(self) -> str:
        return self.metric


class LossDecreasingCheck(_CheckBase):
    """The mean of the last ``window`` points is below the mean of the first ``window``."""

    type: Literal["loss_decreasing"] = "loss_decreasing"
    metric: str = Field(default="loss", min_length=1)
    window: int = 3

    @field_validator("window")
    @classmethod
    def _window_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"window must be >= 1, got {v}")
        return v

    def _name_detail(self) -> str:
        return self.metric


class StepTimeWithinBoundsCheck(_CheckBase):
    """Step time lies within a benchmark's bounds from a shared bounds YAML file."""

    type: Literal["step_time_within_bounds"] = "step_time_within_bounds"
    metric: str = Field(default="step_time", min_length=1)
    bounds_file: str
    benchmark: str = Field(min_length=1)

    @field_validator("bounds_file")
    @classmethod
    def _bounds_file_relative(cls, v: str) -> str:
        return _relative_path(v, "bounds_file")

    def _name_detail(self) -> str:
        return self.benchmark


from accelmatrix.spec.checks_ci import ElapsedRegressionCheck, JunitCheck  # noqa: E402
from accelmatrix.spec.checks_cluster import WorkersStartedCheck  # noqa: E402
from accelmatrix.spec.checks_inference import GoldenCasesCheck  # noqa: E402
from accelmatrix.spec.checks_runtime import NotebooksCheck, ReportItemsCheck  # noqa: E402

Check = Annotated[
    Union[  # noqa: UP007 - the discriminated union reads better spelled out
        ExitStatusCheck,
        LogContainsCheck,
        LogNotContainsCheck,
        ArtifactCountCheck,
        MetricBetweenCheck,
        FinalLossCheck,
        LossDecreasingCheck,
        StepTimeWithinBoundsCheck,
        GoldenCasesCheck,
        JunitCheck,
        ElapsedRegressionCheck,
        ReportItemsCheck,
        NotebooksCheck,
        WorkersStartedCheck,
    ],
    Field(discriminator="type"),
]

CHECK_TYPES: tuple[str, ...] = (
    "exit_status",
    "log_contains",
    "log_not_contains",
    "artifact_count",
    "metric_between",
    "final_loss",
    "loss_decreasing",
    "step_time_within_bounds",
    "golden_cases",
    "junit",
    "elapsed_regression",
    "report_items",
    "notebooks",
    "workers_started",
)

_CHECK_LIST = TypeAdapter(list[Check], config=ConfigDict(title="checks"))


def parse_checks(raw: list[dict]) -> list[Check]:
    """Validate a list of check dicts (e.g. from YAML); raises pydantic ValidationError."""
    return _CHECK_LIST.validate_python(raw)
