"""Preflight checks: what must hold before a suite provisions anything.

A cluster validation that deploys a 16-node job onto a cluster whose API is down, whose
storage claim is unbound or whose service account is missing wastes an hour and reports
the wrong failure. The suite lists typed preflight checks; the `preflight` task runs them
after `plan` and before any `provision`, and when one fails no cell is provisioned and the
run shows every failed check with what was expected and what was found
(accelmatrix.preflight runs them).

String fields may use `${python}`, `${include_dir}`, `${work_root}`, `${accelmatrix_home}`
and `${params.NAME}`: preflight runs on the Airflow worker, not on a cell's machine.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

__all__ = [
    "CommandPreflight",
    "ConnectionPreflight",
    "CpuCountPreflight",
    "DiskFreePreflight",
    "HttpPreflight",
    "PreflightCheck",
]


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, description="shown in the preflight report")


class CommandPreflight(_Base):
    """A command exits with `expect_exit` (e.g. `kubectl cluster-info`), optionally printing
    `stdout_contains` or at least `min_lines` lines (e.g. `kubectl get nodes -l gpu -o name`)."""

    type: Literal["command"]
    argv: list[str] = Field(min_length=1)
    expect_exit: int = 0
    stdout_contains: str | None = None
    min_lines: Annotated[int, Field(ge=1)] | None = None
    timeout: PositiveInt = 30

    @field_validator("argv", mode="before")
    @classmethod
    def _scalars(cls, v: object) -> object:
        if isinstance(v, list):
            return [
                str(a) if isinstance(a, int | float) and not isinstance(a, bool) else a for a in v
            ]
        return v


class HttpPreflight(_Base):
    """An HTTP(S) endpoint answers with `expect_status` (a cluster API's health URL)."""

    type: Literal["http"]
    url: str
    expect_status: int = Field(200, ge=100, le=599)
    timeout: PositiveInt = 10

    @field_validator("url")
    @classmethod
    def _http_only(cls, v: str) -> str:
        if not re.match(r"^(https?://|\$\{)", v):
            raise ValueError(f"url {v!r} must start with http:// or https://")
        return v


class DiskFreePreflight(_Base):
    """At least `min_gb` GB free on the file system holding `path` (storage available)."""

    type: Literal["disk_free"]
    path: str = Field(min_length=1)
    min_gb: Annotated[float, Field(gt=0)]


class CpuCountPreflight(_Base):
    """At least `min` CPUs usable by this process (nodes ready with the cores the job needs)."""

    type: Literal["cpu_count"]
    min: PositiveInt


class ConnectionPreflight(_Base):
    """An Airflow connection exists (the service account the job runs as)."""

    type: Literal["connection"]
    conn_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")


PreflightCheck = Annotated[
    Union[  # noqa: UP007 - a fixed set, unlike spec.checks.Check (derived from its registry)
        CommandPreflight,
        HttpPreflight,
        DiskFreePreflight,
        CpuCountPreflight,
        ConnectionPreflight,
    ],
    Field(discriminator="type"),
]
