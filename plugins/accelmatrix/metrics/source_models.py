"""The ``workload.metrics`` declarations of a suite: where a workload's numbers are.

The pydantic models of the metric sources (``json``, ``jsonl``, ``log_regex``,
``profiler_trace``, ``junit_xml``), the ``MetricSource`` union the suite model embeds, and the
limits both they and the collector enforce (metric names, the reserved ``runner.`` prefix,
the largest step). Separate from ``accelmatrix.metrics.sources`` (which reads the files and
turns them into rows) because the suite models are imported while a DAG file is parsed:
this module needs only pydantic, never the collector, the profiler trace reader or pandas.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

METRIC_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_./:-]*$"
# The largest step the results store's integer column holds (signed 64-bit).
MAX_STEP = 2**63 - 1
RESERVED_PREFIX = "runner."  # the runner's samples (accelmatrix.metrics.resource_samples)
MAX_NAME_LEN = 250  # the results store's limit on metric names (results.schema.NAME_LEN)
PREFIX_RE = r"^[A-Za-z0-9_./:-]*$"
MAX_DIAGNOSTICS_PER_SOURCE = 20  # a 1 GB log of garbage must not become a 1 GB report


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def _check_relative(value: str, info: ValidationInfo) -> str:
    """Paths and globs are relative to the collected files dir and cannot leave it.

    Checked at parse time so a suite cannot read arbitrary files of the Airflow worker
    (``/etc/...``, ``../../secrets``) through a metric source.
    """
    field_name = info.field_name or "path"
    if not value.strip():
        raise ValueError(f"{field_name} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{field_name} {value!r} cannot contain NUL bytes")
    if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", value):
        raise ValueError(
            f"{field_name} {value!r} must be relative to the collected files dir "
            "(e.g. train_metrics.json), not an absolute path"
        )
    parts = re.split(r"[/\\]", value)
    if ".." in parts:
        raise ValueError(
            f"{field_name} {value!r} must not contain '..': sources can only read files "
            "collected from the cell's work dir"
        )
    return value


RelativePath = Annotated[str, AfterValidator(_check_relative)]


class _Source(BaseModel):
    """Base of every source: unknown keys are errors, so a typo is not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    @property
    def label(self) -> str:
        """How rows and diagnostics name this source, e.g. ``jsonl:metrics.jsonl``."""
        raise NotImplementedError


class JsonSource(_Source):
    """A flat JSON object; every numeric value is a scalar metric named prefix + key."""

    type: Literal["json"]
    path: RelativePath = Field(description="file relative to the collected files dir")
    prefix: Annotated[str, AfterValidator(_not_reserved)] = Field("", pattern=PREFIX_RE)
    units: dict[str, str] = Field(default_factory=dict, description="unit per key in the file")

    @property
    def label(self) -> str:
        return f"json:{self.path}"


class JsonlSource(_Source):
    """One JSON object per line; each numeric key except step_key is a series point."""

    type: Literal["jsonl"]
    path: RelativePath = Field(description="file relative to the collected files dir")
    step_key: str = Field("step", min_length=1)
    units: dict[str, str] = Field(default_factory=dict, description="unit per key in the file")

    @property
    def label(self) -> str:
        return f"jsonl:{self.path}"


class LogRegexSource(_Source):
    """A regex with one capture group applied to each line of the workload log.

    ``series: true`` makes every match a point (step = match index, 0-based); otherwise the
    last match is a scalar, like the "final loss from the last ``loss:`` line" check of the
    system this replaces. Lines, not the whole log, are matched: memory stays bounded on
    huge logs and a pathological pattern can only backtrack within one line.
    """

    type: Literal["log_regex"]
    name: Annotated[str, AfterValidator(_not_reserved)] = Field(
        pattern=METRIC_NAME_RE, max_length=128
    )
    pattern: str = Field(min_length=1)
    series: bool = False
    unit: str | None = None

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, v: str) -> str:
        try:
            compiled = re.compile(v)
        except re.error as e:
            raise ValueError(f"pattern {v!r} is not a valid regular expression: {e}") from None
        if compiled.groups != 1:
            raise ValueError(
                f"pattern {v!r} must have exactly one capture group around the number, "
                f"it has {compiled.groups} (use (?:...) for groups that are not the value)"
            )
        return v

    @property
    def label(self) -> str:
        return f"log_regex:{self.name}"


def _not_reserved(value: str, info: ValidationInfo) -> str:
    """A source's metric names must not enter the namespace of the runner's samples."""
    if value.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"{info.field_name} {value!r} starts with {RESERVED_PREFIX!r}, the namespace of "
            "the metrics the runner samples (runner.cpu_percent, runner.wall_seconds, ...); "
            "choose another name"
        )
    return value


def _check_glob(value: str) -> str:
    # Python 3.11's Path.glob raises on '**' mixed into a component ('a**', '**.json').
    for part in value.split("/"):
        if "**" in part and part != "**":
            raise ValueError(
                f"glob {value!r}: '**' must be a whole path component (e.g. **/*.pt.trace.json)"
            )
    return value


class ProfilerTraceSource(_Source):
    """Exactly one Chrome trace; step time from its ``ProfilerStep#`` events (seconds).

    Also emits ``<name>_steps``, the number of step events used, so a check can require a
    minimum window. Zero or several matching files give no metric and a diagnostic: the
    step-time check then fails as missing, and an artifact-count check says why.
    """

    type: Literal["profiler_trace"]
    glob: Annotated[RelativePath, AfterValidator(_check_glob)] = "**/*.pt.trace.json"
    name: Annotated[str, AfterValidator(_not_reserved)] = Field(
        "step_time", pattern=METRIC_NAME_RE, max_length=128
    )
    # How many samples of each build a re-test keeps this trace of, for the culprit
    # report's op-level diff (history.culprits.profile_diff): its intervals come from the spread
    # between them, so one trace on a busy host does not decide which op is blamed.
    profiled_samples: Annotated[int, Field(ge=1, le=20)] = 3

    @property
    def label(self) -> str:
        return f"profiler_trace:{self.glob}"


from accelmatrix.metrics.junit import JunitXmlSource  # noqa: E402 (no cycle: it needs pydantic)

MetricSource = Annotated[
    JsonSource | JsonlSource | LogRegexSource | ProfilerTraceSource | JunitXmlSource,
    Field(discriminator="type"),
]
METRIC_SOURCE_TYPES: dict[str, type[BaseModel]] = {
    "json": JsonSource,
    "jsonl": JsonlSource,
    "log_regex": LogRegexSource,
    "profiler_trace": ProfilerTraceSource,
    "junit_xml": JunitXmlSource,
}


def parse_metric_sources(raw: list[dict[str, Any]]) -> list[MetricSource]:
    """Validate a ``workload.metrics`` list outside of a whole suite (tools and tests)."""
    from pydantic import TypeAdapter

    return TypeAdapter(list[MetricSource]).validate_python(raw)
