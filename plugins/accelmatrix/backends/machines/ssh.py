"""The `ssh` machine of a suite YAML: a host reached through an Airflow SSH connection.

The YAML names a connection id and nothing secret: host, port, login, keys and host key
checking live in the Airflow connection (UI, secrets backend or AIRFLOW_CONN_<ID>), where
they are encrypted and rotated without touching a suite file that sits in git.

``resources`` reuses ``accelmatrix.backends.machines.resources.Resources`` rather than a copy
that could drift.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from accelmatrix.backends.machines.resources import refuse_credentials, to_resources

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Keys people put next to a host by habit; each one is a credential or part of one.
_CREDENTIAL_KEYS = (
    "host",
    "hostname",
    "port",
    "user",
    "username",
    "login",
    "password",
    "key",
    "key_file",
    "private_key",
    "identity_file",
    "passphrase",
)


class SshMachine(BaseModel):
    """A host reached over SSH; cells run there under a supervisor, detached from Airflow."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["ssh"]
    ssh_conn_id: str = Field(
        min_length=1,
        max_length=250,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        description="Airflow connection id (conn_type ssh) holding host, login and key",
    )
    python: str = Field(
        "python3", min_length=1, description="Python >= 3.10 on the host; runs the supervisor"
    )
    work_root: str = Field(
        "~/.accelmatrix/work",
        description="absolute path or ~/...; each cell gets <work_root>/<dag>/<run>/<cell>",
    )
    resources: Any = Field(
        default_factory=to_resources,
        description="Resources: chips, gpus, gpu_type, cpu, memory",
    )
    pool: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Airflow pool bounding concurrent use; default accelmatrix_<machine>",
    )
    pool_slots: PositiveInt = Field(
        1, description="slots of the pool when accelmatrix creates it (one cell at a time)"
    )
    hourly_cost: Annotated[float, Field(ge=0)] = 0.0
    price_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", description="entry of include/pricing.yaml"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        return refuse_credentials(
            data,
            _CREDENTIAL_KEYS,
            "an ssh machine takes no connection details or credentials; put them in the "
            "Airflow connection named by ssh_conn_id",
        )

    @field_validator("resources", mode="before")
    @classmethod
    def _validate_resources(cls, v: Any) -> Any:
        return to_resources(v)

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if _CONTROL.search(v) or v != v.strip():
            raise ValueError("python must be one executable name or path")
        return v

    @field_validator("work_root")
    @classmethod
    def _work_root(cls, v: str) -> str:
        if _CONTROL.search(v):
            raise ValueError("work_root cannot contain control characters")
        if not (v.startswith("/") or v == "~" or v.startswith("~/")):
            raise ValueError(f"work_root {v!r} must be an absolute path or start with '~/'")
        if ".." in v.split("/"):
            raise ValueError(f"work_root {v!r} must not contain '..'")
        if v.rstrip("/") in ("", "~"):
            raise ValueError("work_root cannot be / or ~ itself: use a dedicated directory")
        return v
