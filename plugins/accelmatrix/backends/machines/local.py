"""The `local` machine of a suite YAML: a process on the Airflow worker host."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from accelmatrix.backends.machines.resources import Resources


class LocalMachine(BaseModel):
    """A process on the Airflow worker host: the embedded default, needs no cloud account."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    backend: Literal["local"]
    resources: Resources = Resources()
    pool: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Airflow pool bounding concurrent use; default accelmatrix_<machine>",
    )
    pool_slots: PositiveInt = Field(4, description="slots of the pool when accelmatrix creates it")
    hourly_cost: Annotated[float, Field(ge=0)] = 0.0
    price_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", description="entry of include/pricing.yaml"
    )
