"""What a cell's machine offers (chips, GPUs, CPU, memory): one model for every machine kind.

Used for scheduling views and cost. The ssh and k8s machines keep their ``resources`` field
loosely typed and validate it through :func:`resources`, so that a dump of a machine stays
exactly what it was when the model lived in spec/suite.py.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt


class Resources(BaseModel):
    """What a cell's machine offers. Used for scheduling on real backends and for cost."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    chips: PositiveInt | None = Field(None, description="TPU chips")
    gpus: PositiveInt | None = None
    gpu_type: str | None = Field(None, pattern=r"^[a-z0-9-]+$")
    cpu: Annotated[float, Field(gt=0)] | None = None
    memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")


def to_resources(value: Any = None) -> Resources:
    """``value`` validated as :class:`Resources` (empty when None)."""
    return Resources.model_validate(value if value is not None else {})


def refuse_credentials(data: Any, keys: tuple[str, ...], where_they_belong: str) -> Any:
    """The machine's raw YAML ``data`` unchanged, or a ValueError naming the credential
    ``keys`` it holds and ``where_they_belong`` (the Airflow connection). ``extra="forbid"``
    would reject them too, but without saying why or where they go instead."""
    if isinstance(data, dict):
        found = sorted(k for k in data if isinstance(k, str) and k in keys)
        if found:
            raise ValueError(f"{', '.join(found)}: {where_they_belong}")
    return data
