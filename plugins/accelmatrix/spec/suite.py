"""The suite YAML, as pydantic models.

One YAML file under include/suites/ describes one test matrix and becomes one Airflow DAG.
Everything a user writes is validated here, at parse time, so that a typo is reported with
the file, the field path and the allowed values before anything is provisioned.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from accelmatrix.backends.machine_kinds import MACHINE_MODELS, kind_of, kinds_that
from accelmatrix.spec.axis_kinds import AxisKind, normalize_axis
from accelmatrix.spec.checks import Check
from accelmatrix.spec.notify import Notify
from accelmatrix.spec.preflight_checks import PreflightCheck
from accelmatrix.spec.run_checks import RunCheck
from accelmatrix.spec.suite_parts import (
    CONTROL_CHARS,
    LABEL_RE,
    MACHINE_NAME_RE,
    MAX_CELLS,
    NAME_RE,
    RESERVED_PARAMS,
    Budget,
    ExcludeRule,
    GithubTrigger,
    HangDetection,
    HistorySpec,
    Model,
    ParamSpec,
    QuarantineRule,
    RegressionRules,
    Scalar,
    Workload,
    _label,
)
from accelmatrix.spec.support import SupportRule, validate_supports
from accelmatrix.spec.templating import (
    RUN_VARS,
    TemplateError,
    check_references,
    references,
    strings_in,
)

# One member per backend kind, discriminated by `backend`: the registry lists them.
Machine = Annotated[Union[MACHINE_MODELS], Field(discriminator="backend")]  # noqa: UP007


class Suite(Model):
    """A whole suite file. The DAG id is the file name without .yaml."""

    description: str = ""
    owners: list[str] = Field(default_factory=lambda: ["accelmatrix"])
    tags: list[str] = Field(default_factory=list)
    schedule: str | None = None
    axes: dict[str, list[Scalar] | dict[str, dict[str, Any] | Scalar]] = Field(min_length=1)
    axis_kinds: dict[str, AxisKind] = Field(
        default_factory=dict, description="axes whose values a domain module validates"
    )
    exclude: list[ExcludeRule] = Field(default_factory=list)
    supports: list[SupportRule] = Field(default_factory=list)
    machines: dict[str, Machine] = Field(min_length=1)
    machine: str | None = Field(
        None, description="machine of every cell, unless an axis named `machine` picks it"
    )
    workload: Workload
    checks: list[Check] = Field(default_factory=list)
    run_checks: list[RunCheck] = Field(
        default_factory=list, description="checks of the run's table of cells, at the gate"
    )
    preflight: list[PreflightCheck] = Field(
        default_factory=list, description="checked before anything is provisioned"
    )
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    quarantine: list[QuarantineRule | str] = Field(default_factory=list)
    retries: Annotated[int, Field(ge=0, le=10)] = 0
    retry_delay_seconds: PositiveInt = 60
    max_active_runs: PositiveInt = 1
    notify: Notify | None = None
    github: GithubTrigger | None = Field(
        None, description="pull requests with a label run the suite (accelmatrix.ui.github_webhook)"
    )
    param_axes: list[str] = Field(
        default_factory=list,
        description="axes whose value the same-named param selects per run ('all': every value)",
    )
    runtime_version: str | None = Field(
        None,
        min_length=1,
        description="runtime/image version under test, e.g. nightly-${run.ds}; in the history",
    )
    budget: Budget | None = None
    regression: RegressionRules = RegressionRules()
    history: HistorySpec = HistorySpec()
    slot_order: Literal["machine_time", "throughput"] = Field(
        "machine_time",
        description=(
            "which ready task gets a free executor slot: machine_time (default) drives the "
            "cells that hold a machine first and creates a machine last; throughput uses "
            "Airflow's default rule (every provision first: shortest run, machines wait idle)"
        ),
    )

    # -- field rules -------------------------------------------------------------------------
    @field_validator("axes")
    @classmethod
    def _axes(cls, axes: dict[str, Any]) -> dict[str, Any]:
        for name, values in axes.items():
            if not re.match(NAME_RE, name):
                raise ValueError(f"axis name {name!r} must match {NAME_RE}")
            labels = list(values) if isinstance(values, dict) else [_label(v) for v in values]
            if not labels:
                raise ValueError(f"axis {name!r} has no values")
            for lab in labels:
                if not re.match(LABEL_RE, lab):
                    raise ValueError(
                        f"axis {name!r} value {lab!r} must match {LABEL_RE} "
                        "(it becomes part of the cell id)"
                    )
            dupes = {x for x in labels if labels.count(x) > 1}
            if dupes:
                raise ValueError(f"axis {name!r} has duplicate values: {sorted(dupes)}")
        return axes

    @field_validator("machines")
    @classmethod
    def _machine_names(cls, machines: dict[str, Any]) -> dict[str, Any]:
        for name in machines:
            if not re.match(MACHINE_NAME_RE, name):
                raise ValueError(f"machine name {name!r} must match {MACHINE_NAME_RE}")
        return machines

    @field_validator("params")
    @classmethod
    def _param_names(cls, params: dict[str, Any]) -> dict[str, Any]:
        for name in params:
            if not re.match(NAME_RE, name):
                raise ValueError(f"param name {name!r} must match {NAME_RE}")
            if name in RESERVED_PARAMS:
                raise ValueError(f"param name {name!r} is reserved by accelmatrix")
        return params

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None or v.startswith("@"):
            presets = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly")
            if v is not None and v not in presets + ("@yearly",):
                raise ValueError(f"schedule preset {v!r} is not one of {', '.join(presets)}")
            return v
        from croniter import croniter  # light; only where a schedule is written

        if not croniter.is_valid(v):
            raise ValueError(f"schedule {v!r} is not a valid cron expression (e.g. '0 2 * * *')")
        return v

    @field_validator("owners", "tags")
    @classmethod
    def _no_control(cls, v: list[str]) -> list[str]:
        for s in v:
            if CONTROL_CHARS.search(s) or not s.strip():
                raise ValueError(f"{s!r} is empty or contains control characters")
        return v

    # -- cross-field rules -------------------------------------------------------------------
    @model_validator(mode="after")
    def _typed_axes(self) -> Suite:
        # Before _cross, so placeholders may name defaulted and derived fields.
        for axis, kind in self.axis_kinds.items():
            if axis not in self.axes:
                raise ValueError(
                    f"axis_kinds: no axis named {axis!r} (axes: {', '.join(self.axes)})"
                )
            self.axes[axis] = normalize_axis(kind, axis, self.axes[axis])
        return self

    @model_validator(mode="after")
    def _github(self) -> Suite:
        gh = self.github
        if gh is None:
            return self
        spec = self.params.get(gh.ref_param)
        if spec is None or spec.base_type != "string":
            strings = [n for n, p in self.params.items() if p.base_type == "string"]
            raise ValueError(
                f"github.ref_param: {gh.ref_param!r} must be a string param of the suite, "
                f"which gets the pull request's head sha (string params: "
                f"{', '.join(strings) or 'none'})"
            )
        if gh.ref_param in gh.params:
            raise ValueError(
                f"github.params.{gh.ref_param}: the ref param gets the head sha; set the others"
            )
        if unknown := [n for n in gh.params if n not in self.params]:
            raise ValueError(
                f"github.params: {unknown} are not params of the suite "
                f"(params: {', '.join(self.params) or 'none'})"
            )
        if gh.compare and self.runtime_version != f"${{params.{gh.ref_param}}}":
            raise ValueError(
                "github.compare: the builds compared are the base and head commits, so "
                f"runtime_version must be '${{params.{gh.ref_param}}}' (it is "
                f"{self.runtime_version!r})"
            )
        return self

    @model_validator(mode="after")
    def _run_check_axes(self) -> Suite:
        for i, check in enumerate(self.run_checks):
            unknown = [a for a in check.by if a not in self.axes]
            if unknown:
                raise ValueError(
                    f"run_checks[{i}].by: {unknown} are not axes (axes: {', '.join(self.axes)})"
                )
        return self

    @model_validator(mode="after")
    def _cross(self) -> Suite:
        if "machine" in self.axes:
            unknown = [v for v in self.axis_labels("machine") if v not in self.machines]
            if unknown:
                raise ValueError(
                    f"axes.machine: {unknown} are not machines "
                    f"(machines: {', '.join(self.machines)})"
                )
            if self.machine is not None:
                raise ValueError("set either `machine` or an axis named `machine`, not both")
        elif self.machine is None:
            if len(self.machines) != 1:
                raise ValueError(
                    "several machines are defined: pick one with `machine:` or add an axis "
                    f"named `machine` (machines: {', '.join(self.machines)})"
                )
        elif self.machine not in self.machines:
            raise ValueError(
                f"machine {self.machine!r} is not defined (machines: {', '.join(self.machines)})"
            )

        for axis in self.param_axes:
            if axis not in self.axes:
                raise ValueError(
                    f"param_axes: no axis named {axis!r} (axes: {', '.join(self.axes)})"
                )
            spec = self.params.get(axis)
            if spec is None or spec.base_type != "string" or not spec.enum:
                raise ValueError(
                    f"param_axes: {axis!r} needs a string param named {axis!r} with an enum "
                    f"of its values (and optionally 'all'): {', '.join(self.axis_labels(axis))}"
                )
            wrong = [v for v in spec.enum if v != "all" and v not in self.axis_labels(axis)]
            if wrong:
                raise ValueError(
                    f"params.{axis}.enum: {wrong} are not values of axis {axis!r} "
                    f"(values: {', '.join(self.axis_labels(axis))}, or 'all')"
                )

        if self.workload.services:
            can = kinds_that("runs_services")
            for name in self.cell_machines():
                backend = self.machines[name].backend
                if not kind_of(backend).runs_services:
                    raise ValueError(
                        f"workload.services: machine {name!r} is a {backend} machine, whose "
                        f"backend cannot run services (backends that can: {', '.join(can)})"
                    )

        for name, m in self.machines.items():
            if m.price_key and m.hourly_cost:
                raise ValueError(
                    f"machines.{name}: give either price_key (include/pricing.yaml) or "
                    "hourly_cost, not both"
                )

        for i, rule in enumerate(self.exclude):
            for axis, want in rule.match.items():
                if axis not in self.axes:
                    raise ValueError(
                        f"exclude[{i}].match: no axis named {axis!r} (axes: {', '.join(self.axes)})"
                    )
                labels = self.axis_labels(axis)
                for w in [want] if isinstance(want, str) else want:
                    if not any(c in w for c in "*?[") and w not in labels:
                        raise ValueError(
                            f"exclude[{i}].match.{axis}: {w!r} is not a value of axis {axis!r} "
                            f"(values: {', '.join(labels)})"
                        )

        validate_supports(self)

        total = 1
        for values in self.axes.values():
            total *= len(values)
        if total > MAX_CELLS * 16:
            # Refuse before expanding a combinatorial explosion in memory.
            raise ValueError(f"the axes multiply to {total} cells; the limit is {MAX_CELLS}")

        if self.budget is not None and self.budget.param is not None:
            spec = self.params.get(self.budget.param)
            if spec is None or spec.base_type not in ("number", "integer"):
                raise ValueError(
                    f"budget.param: {self.budget.param!r} must name a number or integer param "
                    f"(params: {', '.join(self.params) or 'none'})"
                )

        if self.runtime_version is not None:
            for ref in references(self.runtime_version):
                if not (ref.startswith("params.") or ref in RUN_VARS[:3]):
                    raise ValueError(
                        f"runtime_version: ${{{ref}}} is not allowed here; it is per run, so "
                        "only ${params.NAME}, ${run.ds}, ${run.ds_nodash} and "
                        "${run.logical_date} apply"
                    )
            try:
                check_references(self.runtime_version, axes={}, params=self.params)
            except TemplateError as e:
                raise ValueError(f"runtime_version: {e}") from None

        fields = {
            name: sorted({k for v in values.values() if isinstance(v, dict) for k in v})
            if isinstance(values, dict)
            else []
            for name, values in self.axes.items()
        }
        templated: dict[str, Any] = {
            "workload.run": self.workload.run,
            "workload.setup": self.workload.setup,
            "workload.services": [sv.model_dump() for sv in self.workload.services],
            "workload.env": self.workload.env,
            "workload.artifacts": self.workload.artifacts,
            "checks": [c.model_dump() for c in self.checks],
            "machines": {n: m.model_dump() for n, m in self.machines.items()},
        }
        for where, obj in templated.items():
            for s in strings_in(obj):
                if "${run.runtime_version}" in s and self.runtime_version is None:
                    raise ValueError(
                        f"{where}: ${{run.runtime_version}} needs a suite `runtime_version`"
                    )
                try:
                    check_references(s, axes=fields, params=self.params)
                except TemplateError as e:
                    raise ValueError(f"{where}: {e}") from None
        return self

    # -- helpers -----------------------------------------------------------------------------
    def axis_labels(self, axis: str) -> list[str]:
        values = self.axes[axis]
        return list(values) if isinstance(values, dict) else [_label(v) for v in values]

    def cell_machines(self) -> list[str]:
        """The machines the cells run on: the `machine` axis, else `machine`, else the one."""
        if "machine" in self.axes:
            return self.axis_labels("machine")
        return [self.machine or next(iter(self.machines))]

    def pool_for(self, machine: str) -> str:
        return self.machines[machine].pool or f"accelmatrix_{machine.replace('-', '_')}"


# The parts moved to suite_parts.py; importable from here as before.
__all__ = [
    "CONTROL_CHARS",
    "LABEL_RE",
    "MACHINE_NAME_RE",
    "MAX_CELLS",
    "NAME_RE",
    "RESERVED_PARAMS",
    "Budget",
    "ExcludeRule",
    "HangDetection",
    "HistorySpec",
    "Machine",
    "Model",
    "ParamSpec",
    "QuarantineRule",
    "RegressionRules",
    "Scalar",
    "Suite",
    "Workload",
]
