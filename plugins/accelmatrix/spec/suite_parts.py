"""The parts of a suite: its workload, rules, params, budget and regression settings.

Every model a suite file holds besides the suite itself and its machines: ``Workload`` (with
``HangDetection``), ``ExcludeRule``, ``QuarantineRule``, ``ParamSpec``, ``Budget`` and
``RegressionRules``, plus ``Model`` (unknown keys are errors) and the name rules they share.
Each validates itself alone; what needs the whole suite (axes, machines, references between
fields, backend capabilities) stays on ``Suite`` in ``accelmatrix.spec.suite``, which is why
these are separate: they never need the backend registry. Imported while a DAG file is
parsed, so pydantic and stdlib only (plus the metric source models and templating).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from accelmatrix.metrics.sources import MetricSource
from accelmatrix.spec.services import Service
from accelmatrix.spec.templating import strings_in

# Names that end up in cell ids, pool names, task logs and resource labels: keep them tame.
NAME_RE = r"^[a-z][a-z0-9_]*$"
LABEL_RE = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
MACHINE_NAME_RE = r"^[a-z][a-z0-9-]*$"
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
MAX_CELLS = 1024  # Airflow's [core] max_map_length default
RESERVED_PARAMS = ("cells", "build", "accelmatrix_followup", "accelmatrix_compare")

Scalar = str | int | float | bool


class Model(BaseModel):
    """Base for every user-facing model: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class HangDetection(Model):
    """Fail a stuck workload early instead of waiting for its timeout.

    A training job that stops printing progress is hung (a collective that never
    returns, a dead data loader). The first line matching `pattern` must appear within
    `start_within` seconds and then recur at least every `recur_within` seconds.
    """

    pattern: str = Field(min_length=1, description="regex over workload log lines")
    start_within: PositiveInt = 240
    recur_within: PositiveInt = 600

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"pattern {v!r} is not a valid regular expression: {e}") from None
        return v


class Workload(Model):
    """What runs in a cell. Commands are argv lists: no shell ever sees a user value."""

    setup: list[list[str]] = Field(default_factory=list)
    run: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    timeout: PositiveInt = Field(3600, description="seconds the run may take before it is killed")
    setup_timeout: PositiveInt = 600
    artifacts: list[str] = Field(default_factory=list, description="globs relative to the work dir")
    metrics: list[MetricSource] = Field(default_factory=list)
    hang_detection: HangDetection | None = None
    services: list[Service] = Field(
        default_factory=list, description="background processes from setup to teardown"
    )

    @field_validator("run", "setup", mode="before")
    @classmethod
    def _argv_scalars_to_str(cls, v: Any, info: ValidationInfo) -> Any:
        # YAML turns `--steps, 20` into an int; an argv element is a string, so convert
        # scalars but refuse mappings/lists/null that would be a mistake.
        if isinstance(v, str) or (
            info.field_name == "setup"
            and isinstance(v, list)
            and any(isinstance(x, str) for x in v)
        ):
            # A command line written as one string would need a shell to split it.
            form = (
                '[["${python}", "-m", "pip", "install", "-r", "requirements.txt"]] (a list of '
                "commands, each an argv list)"
                if info.field_name == "setup"
                else '["${python}", "train.py", "--steps", "${params.steps}"]'
            )
            raise ValueError(
                f"must be an argv list, one element per argument, e.g. {form}; got {v!r} "
                "(no shell ever splits a command line here)"
            )

        def conv(argv: Any) -> Any:
            if not isinstance(argv, list):
                return argv
            out = []
            for a in argv:
                if isinstance(a, bool) or a is None or isinstance(a, (dict, list)):
                    raise ValueError(
                        f"argv elements must be strings or numbers, got {type(a).__name__}: {a!r}"
                        " (write commands as a list of strings, e.g. [python, train.py])"
                    )
                out.append(str(a) if isinstance(a, (int, float)) else a)
            return out

        if v and isinstance(v, list) and all(isinstance(x, list) for x in v):
            return [conv(x) for x in v]
        return conv(v)

    @field_validator("run", "setup")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        for s in strings_in(v):
            if "\x00" in s:
                raise ValueError("argv elements cannot contain NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"env name {k!r} is not a valid variable name")
            if k.startswith("ACCELMATRIX_"):
                raise ValueError(f"env name {k!r}: the ACCELMATRIX_ prefix is reserved")
            if "\x00" in val:
                raise ValueError(f"env {k}: values cannot contain NUL bytes")
        return v

    @field_validator("artifacts")
    @classmethod
    def _relative_globs(cls, v: list[str]) -> list[str]:
        for g in v:
            if g.startswith("/") or ".." in re.split(r"[/\\]", g):
                raise ValueError(
                    f"artifact glob {g!r} must be relative to the work dir and must not "
                    "contain '..'"
                )
        return v


class ExcludeRule(Model):
    """Cells matching every axis in `match` are not run; the plan shows them with `reason`."""

    match: dict[str, str | list[str]] = Field(min_length=1)
    reason: str = Field(min_length=1)

    @field_validator("match", mode="before")
    @classmethod
    def _values_as_labels(cls, v: Any) -> Any:
        """`seq: 32` must match the integer axis value 32 the way `seq: "32"` does: cells are
        matched by the axis value's label, so numbers and booleans become that label."""
        if not isinstance(v, dict):
            return v
        out = {}
        for axis, want in v.items():
            items = want if isinstance(want, list) else [want]
            if not items or not all(isinstance(w, str | int | float | bool) for w in items):
                raise ValueError(
                    f"{axis}: must be an axis value (a string or number, globs allowed) or a "
                    f"list of them, got {want!r}"
                )
            labels = [w if isinstance(w, str) else _label(w) for w in items]
            out[axis] = labels if isinstance(want, list) else labels[0]
        return out


class QuarantineRule(Model):
    """Cells whose id matches `cells` run and are reported, but do not fail the DAG run."""

    cells: str = Field(min_length=1, description="fnmatch glob over cell ids")
    reason: str = Field(min_length=1)


ParamType = Literal["string", "integer", "number", "boolean", "array", "null"]


class ParamSpec(Model):
    """A UI trigger-form param (rendered by Airflow's Param, validated by JSON schema).

    ``type`` is one JSON type or a list of them (``[string, "null"]``: an optional string).
    A param whose default is null, or an empty string, is optional: its schema admits null
    whatever ``type`` says, because Airflow's trigger form requires a value for every field
    whose type does not include null (an empty default left Trigger disabled).
    """

    type: ParamType | list[ParamType] = "string"
    default: Any = None
    description: str | None = None
    enum: list[Scalar] | None = None
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = Field(None, description="regex a string value must match (search)")

    @property
    def types(self) -> list[str]:
        """The JSON types a value may have, "null" included when the param is optional."""
        types = [self.type] if isinstance(self.type, str) else list(self.type)
        optional = self.default is None or (self.default == "" and "string" in types)
        if optional and "null" not in types:
            types.append("null")
        return types

    @property
    def base_type(self) -> str:
        """The param's type apart from null (the first one listed)."""
        return next((t for t in self.types if t != "null"), "null")

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the param, as the trigger form's Param gets it."""
        types = self.types
        schema: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
        for key in ("enum", "minimum", "maximum", "pattern"):
            value = getattr(self, key)
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # "less than the minimum of 8", not "of 8.0"
            if value is not None:
                schema[key] = value
        if "enum" in schema and "null" in types and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]  # enum applies to null too
        return schema

    @model_validator(mode="after")
    def _default_fits(self) -> ParamSpec:
        if isinstance(self.type, list):
            if not self.type or len(set(self.type)) != len(self.type):
                raise ValueError(f"type {self.type} must list each JSON type once")
            if self.type == ["null"]:
                raise ValueError('type ["null"] admits no value: add the type of a value')
        if self.enum is not None and self.default is not None and self.default not in self.enum:
            raise ValueError(f"default {self.default!r} is not one of enum {self.enum}")
        if self.pattern is not None:
            if "string" not in self.types:
                raise ValueError("pattern only applies to string params")
            try:
                rx = re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"pattern {self.pattern!r} is not a valid regex: {e}") from None
            if isinstance(self.default, str) and not rx.search(self.default):
                raise ValueError(
                    f"default {self.default!r} does not match pattern {self.pattern!r}"
                )
        return self


class Budget(Model):
    """A cost ceiling per run, checked by ``plan`` before anything is provisioned.

    The estimate is, per cell, ``expected_seconds`` (default: the workload timeout, the
    longest a cell may hold its machine) x the machine's hourly price / 3600, summed over
    the cells of the run. ``param`` names a number param of the suite whose value, when
    set for a run, replaces ``max_usd`` (so a trigger form can raise the ceiling once).
    """

    max_usd: Annotated[float, Field(ge=0)]
    param: str | None = Field(None, pattern=NAME_RE)
    expected_seconds: PositiveInt | None = None


class RegressionRules(Model):
    """How the suite's perf series are classified after each run (history/series/regression.py)."""

    window_days: PositiveInt = 30
    min_points: PositiveInt = 3
    regression_run: Annotated[int, Field(ge=2)] = 2
    suspicious_run: Annotated[int, Field(ge=3)] = 3
    flaky_flips: PositiveInt = 3


# Metric names whose higher values are better (throughput and its kin); any other metric
# is taken as lower-is-better (times, latencies, memory, loss) unless the suite says so.
HIGHER_IS_BETTER_HINTS = ("throughput", "per_s", "per_sec", "qps", "mfu", "accuracy", "flops")


class ConfirmSpec(Model):
    """How a suspect regression is re-tested before it notifies (``history.confirm``).

    Each suspect cell gets one machine for the re-test: the last good build, the suspect
    build and the builds between them (up to 8 per session) are set up on it once and run
    ``pairs`` times each, interleaved (A B B A ...). Their verdict is judged by the size of
    the change (accelmatrix.history.retests.compare). An undecided re-test adds ``pairs`` more per
    build in another session, up to ``max_pairs``. Every session is an ordinary run of the
    suite's DAG, under its pools and budget; ``max_usd`` caps each one's estimated cost,
    ``max_cells`` how many of a group's cells are re-tested (the largest changes first).
    """

    enabled: bool = Field(True, description="re-test suspect changes before notifying")
    # 7 pairs is the fewest whose exact Wilcoxon p-value can reach 0.01 (history.retests.compare).
    pairs: Annotated[int, Field(ge=7, le=50)] = Field(
        10, description="samples of each build per session, each next to the last good build's"
    )
    max_pairs: Annotated[int, Field(ge=7, le=200)] = Field(
        40, description="most pairs per build over all sessions of one re-test"
    )
    min_change: Annotated[float, Field(gt=0, le=1)] = Field(
        0.02,
        description=(
            "a suspect build is confirmed when it is worse by half the claimed change or by "
            "this much (relative), whichever is less"
        ),
    )
    max_cells: Annotated[int, Field(ge=1, le=64)] = Field(
        4, description="most cells of one suspect group re-tested"
    )
    max_usd: Annotated[float, Field(ge=0)] | None = Field(
        None, description="most one re-test session may cost (estimated before it starts)"
    )
    bisect: bool = Field(True, description="find the first bad build between the good and bad")

    @model_validator(mode="after")
    def _cap(self) -> ConfirmSpec:
        if self.max_pairs < self.pairs:
            raise ValueError(
                f"history.confirm: max_pairs ({self.max_pairs}) is below pairs ({self.pairs})"
            )
        return self


class HistorySpec(Model):
    """Which perf series the suite's history follows, and how changes in them are found.

    A series is one metric of one cell over runs, by logical date. Every metric a check
    judges is followed; ``track`` adds more (with or without bounds). Each point of a
    series is one statistic of the metric over the run's steps (``median`` unless
    ``track`` says otherwise; a scalar metric is itself).
    """

    track: dict[str, Literal["median", "mean", "last", "min", "max"]] = Field(
        default_factory=dict,
        description="extra metrics to follow, each with the statistic of its steps",
    )
    higher_is_better: list[str] = Field(
        default_factory=list, description="metrics where a rise is an improvement"
    )
    lower_is_better: list[str] = Field(
        default_factory=list, description="metrics where a rise is a regression"
    )
    window: Annotated[int, Field(ge=10, le=1000)] = Field(
        60, description="points per series the gate re-analyses after each run"
    )
    penalty: Annotated[float, Field(gt=0)] | None = Field(
        None, description="detector penalty per change (default 6; higher: fewer, surer)"
    )
    min_effect: Annotated[float, Field(ge=0)] | None = Field(
        None, description="smallest change reported, in the series' noise sigmas (default 1)"
    )
    min_change: Annotated[float, Field(ge=0)] | None = Field(
        None, description="smallest relative change reported (0.02 = 2 %; default 0)"
    )
    confirm: ConfirmSpec = Field(
        default_factory=ConfirmSpec, description="re-test suspect changes (and bisect them)"
    )
    builds: list[str] | None = Field(
        None,
        description=(
            "argv printing the builds between ${from} and ${to}, one per line (not needed "
            "when runtime_version names builds by ${run.ds})"
        ),
    )

    @model_validator(mode="after")
    def _directions(self) -> HistorySpec:
        both = sorted(set(self.higher_is_better) & set(self.lower_is_better))
        if both:
            raise ValueError(
                f"history: {', '.join(both)} cannot be both higher and lower is better"
            )
        return self

    def higher_is_better_for(self, metric: str) -> bool:
        if metric in self.higher_is_better:
            return True
        if metric in self.lower_is_better:
            return False
        name = metric.lower()
        return any(h in name for h in HIGHER_IS_BETTER_HINTS)


def _label(v: Scalar) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


# owner/name as GitHub allows them: the owner 1-39 of [A-Za-z0-9-], the name 1-100 of
# [A-Za-z0-9._-] (GitHub refuses "." and ".." as names; they never match a delivery).
GITHUB_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$"


class GithubTrigger(Model):
    """A pull request runs the suite when it carries ``label`` (accelmatrix.ui.github_webhook).

    A ``pull_request`` delivery for ``repo`` that adds the label, or a push to a pull request
    that has it, triggers one run of the suite with ``ref_param`` set to the head commit; the
    verdict goes back to the pull request as a commit status and one comment, through the
    GitHub connection ``conn_id`` (Airflow's GitHub provider). A fork's head runs only
    when someone with write access to ``repo`` added the label for that commit.
    """

    repo: str = Field(pattern=GITHUB_REPO_RE, description="owner/name of the GitHub repository")
    label: str = Field(
        min_length=1,
        max_length=50,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="the label that runs the suite on a pull request, e.g. run-tpu-tests",
    )
    ref_param: str = Field(
        "git_ref", pattern=NAME_RE, description="the suite's string param that gets the head sha"
    )
    conn_id: str = Field(
        "github_default",
        pattern=r"^[A-Za-z0-9_.-]{1,250}$",
        description="Airflow GitHub connection (a token with repo:status and pull request "
        "write access; its host for GitHub Enterprise)",
    )
    context: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="the commit status context (default: accelmatrix/<suite id>)",
    )
    params: dict[str, Scalar] = Field(
        default_factory=dict,
        description="other param values of the pull request's runs, e.g. {tier: on-demand}",
    )
    compare: bool = Field(
        False,
        description=(
            "also compare the head's perf with the base branch's commit on one machine per "
            "cell (a compare run, builds interleaved); needs runtime_version: "
            "${params.<ref_param>}"
        ),
    )
