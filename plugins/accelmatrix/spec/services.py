"""Background services of a workload: long-lived processes that live from setup to teardown.

    workload:
      services:
        - name: server
          run: ["${python}", "${include_dir}/workloads/inference/server.py",
                --port-file, "${work_dir}/server.port"]
          ready: {port_file: server.port, http_path: /health, timeout: 60}

An inference server, a database, a mock API: the run step talks to them, setup starts them
(after the setup commands) and waits until they answer, teardown stops them. The service
binds a free port itself and writes it to ``port_file`` (relative to the work dir): no port
is ever guessed, so parallel cells never collide.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator


class Readiness(BaseModel):
    """The service is ready once ``port_file`` holds a port and GET ``http_path`` answers 2xx."""

    model_config = ConfigDict(extra="forbid")

    port_file: str = Field(min_length=1, description="relative to the work dir")
    http_path: str = Field("/health", pattern=r"^/[A-Za-z0-9_./-]*$")
    timeout: PositiveInt = Field(60, description="seconds to wait for readiness")

    @field_validator("port_file")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in re.split(r"[/\\]", v):
            raise ValueError(f"port_file {v!r} must be relative to the work dir without '..'")
        return v


class Service(BaseModel):
    """One background process (argv list, never a shell)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    run: list[str] = Field(min_length=1)
    ready: Readiness

    @field_validator("run", mode="before")
    @classmethod
    def _argv(cls, v: object) -> object:
        if isinstance(v, list):
            out = []
            for a in v:
                if isinstance(a, bool) or a is None or isinstance(a, dict | list):
                    raise ValueError(f"argv elements must be strings or numbers, got {a!r}")
                out.append(str(a) if isinstance(a, int | float) else a)
            return out
        return v
