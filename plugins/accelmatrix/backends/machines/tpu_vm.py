"""The ``tpu-vm`` machine of a suite YAML: a Cloud TPU VM (single host or multi-host slice).

    machines:
      v4-16:
        backend: tpu-vm
        zone: us-central2-b
        accelerator_type: v4-16          # 2 hosts
        runtime_version: tpu-ubuntu2204-base
        capacity: queued                 # on-demand | spot | preemptible | reserved | queued
        valid_until_seconds: 3600        # queued only: give up waiting for capacity after this
        resources: {chips: 8}
        hourly_cost: 25.76
        ssh_user: accelmatrix            # login created from the per-node key in metadata
        python: python3                  # on the TPU VM image; runs the workload supervisor

The workload runs on every worker of the slice over SSH, with a key pair generated for the
node and injected through its ``ssh-keys`` metadata: no key file or credential is named
here.

Self-contained (no import of ``spec.suite``) so that ``suite.py`` can import it for the
machine union without an import cycle.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from accelmatrix.backends.machines.resources import refuse_credentials

Capacity = Literal["on-demand", "spot", "preemptible", "reserved", "queued"]
DEFAULT_VALID_UNTIL_SECONDS = 3600


class TpuResources(BaseModel):
    """What the slice offers (used for scheduling and cost reports)."""

    model_config = ConfigDict(extra="forbid")

    chips: PositiveInt | None = Field(None, description="TPU chips of the whole slice")


# Keys that carry Google credentials or a login: they belong in the Airflow connection.
_CREDENTIAL_KEYS = (
    "credentials",
    "credential_config_file",
    "key_path",
    "keyfile_dict",
    "keyfile_json",
    "key_file",
    "ssh_key_file",
    "private_key",
    "access_token",
    "token",
    "password",
    "service_account_key",
)


class TpuVmMachine(BaseModel):
    """A Cloud TPU VM created per cell through gcloud, deleted by the cell's teardown."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["tpu-vm"]
    gcp_conn_id: str = Field(
        "google_cloud_default",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Airflow connection whose credentials gcloud uses",
    )
    project: str | None = Field(
        None,
        pattern=r"^[a-z][-a-z0-9.:]*[a-z0-9]$",
        description="GCP project; default: the connection's project",
    )
    zone: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+-[a-z]$", description="e.g. us-central2-b")
    accelerator_type: str = Field(
        pattern=r"^v[0-9][a-z0-9]*-[0-9]+$", description="e.g. v4-8, v5litepod-16, v6e-8"
    )
    runtime_version: str = Field(
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description="TPU software version, e.g. tpu-ubuntu2204-base",
    )
    capacity: Capacity = Field(
        "on-demand",
        description="how the TPU is obtained; `queued` waits for capacity (queued resource)",
    )
    valid_until_seconds: PositiveInt | None = Field(
        None,
        description=f"capacity: queued only; default {DEFAULT_VALID_UNTIL_SECONDS}",
    )
    provision_timeout_seconds: PositiveInt = Field(
        1800, description="seconds a node may take to become READY once capacity exists"
    )
    network: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    subnetwork: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    internal_ips: bool = False
    metadata: dict[str, str] = Field(
        default_factory=dict, description="extra VM metadata (e.g. startup-script)"
    )
    resources: TpuResources = TpuResources()
    pool: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Airflow pool bounding concurrent use; default accelmatrix_<machine>",
    )
    pool_slots: PositiveInt = Field(1, description="slots of the pool when accelmatrix creates it")
    hourly_cost: Annotated[float, Field(ge=0)] = 0.0
    ssh_user: str = Field(
        "accelmatrix",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="login on the workers, created by the guest agent from the node's key",
    )
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    python: str = Field(
        "python3",
        pattern=r"^[A-Za-z0-9_./+-]+$",
        description="Python >= 3.10 on the VM image; runs the workload supervisor",
    )
    work_root: str = Field(
        "~/accelmatrix-work",
        pattern=r"^(/|~/)[A-Za-z0-9_./-]+$",
        description="absolute path or ~/...; each cell gets <work_root>/<dag>/<run>/<cell>",
    )
    provision_poll_seconds: Annotated[float, Field(gt=0, le=600)] = Field(
        15.0, description="how often a pending node or queued resource is looked at"
    )
    node_check_seconds: PositiveInt = Field(
        60,
        description="while the workload runs, how often the node's state is checked "
        "(a preempted node is an infrastructure failure, not a test failure)",
    )
    price_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", description="entry of include/pricing.yaml"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        return refuse_credentials(
            data,
            _CREDENTIAL_KEYS,
            "a tpu-vm machine takes no credentials; put them in the Airflow Google "
            "connection named by gcp_conn_id (key_path, keyfile_dict or a secrets backend); "
            "the VM login key is made per node",
        )

    @model_validator(mode="after")
    def _queued(self) -> TpuVmMachine:
        if self.capacity == "queued":
            if self.valid_until_seconds is None:
                self.valid_until_seconds = DEFAULT_VALID_UNTIL_SECONDS
        elif self.valid_until_seconds is not None:
            raise ValueError("valid_until_seconds only applies to capacity: queued")
        for key in self.metadata:
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", key):
                raise ValueError(f"metadata key {key!r}: letters, digits, '_' and '-' only")
            if key == "ssh-keys":
                raise ValueError(
                    "metadata key 'ssh-keys' is set by accelmatrix (a key pair per node); remove it"
                )
        if ".." in self.work_root.split("/"):
            raise ValueError(f"work_root {self.work_root!r} must not contain '..'")
        return self
