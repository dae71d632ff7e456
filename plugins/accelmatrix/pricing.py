"""Cost per cell from a pricing table: include/pricing.yaml, machine type -> hourly price.

Why a table and not a price on every machine: prices change and are shared by many suites,
so they live in one reviewed file; a machine names its entry with ``price_key``. A machine
may still give ``hourly_cost`` inline (no ``price_key``), e.g. a negotiated rate. A
``price_key`` missing from the table fails the run's plan, so a typo never turns into a
silent cost of 0.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accelmatrix import settings

if TYPE_CHECKING:
    from accelmatrix.spec.cell import CellSpec

__all__ = [
    "BudgetExceeded",
    "Pricing",
    "PricingError",
    "check_budget",
    "estimate_cost",
    "hourly_price",
    "load_pricing",
    "pricing_path",
]


class PricingError(ValueError):
    """The pricing file is unreadable or lacks a machine's price_key."""


class Pricing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    currency: str = "USD"
    hourly: dict[str, float] = Field(default_factory=dict)

    def price(self, key: str, *, source: Path) -> float:
        try:
            value = self.hourly[key]
        except KeyError:
            known = ", ".join(sorted(self.hourly)) or "(none)"
            raise PricingError(f"price_key {key!r} is not in {source} (hourly: {known})") from None
        if value < 0:
            raise PricingError(f"{source}: hourly.{key} must be >= 0, got {value}")
        return float(value)


def pricing_path() -> Path:
    """``$ACCELMATRIX_PRICING_FILE``, else include/pricing.yaml."""
    return Path(os.environ.get("ACCELMATRIX_PRICING_FILE", settings.include_dir() / "pricing.yaml"))


def load_pricing(path: Path | None = None) -> Pricing:
    path = Path(path or pricing_path())
    return _load(path, path.stat().st_mtime_ns if path.exists() else 0)


@functools.cache
def _load(path: Path, _mtime: int) -> Pricing:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PricingError(f"pricing file {path} not found") from None
    except (OSError, yaml.YAMLError) as e:
        raise PricingError(f"cannot read pricing file {path}: {e}") from None
    try:
        return Pricing.model_validate(raw or {})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors()
        )
        raise PricingError(f"invalid pricing file {path}: {problems}") from None


def hourly_price(machine_spec: dict[str, Any]) -> float:
    """The machine's price per hour: its ``price_key`` in the table, else ``hourly_cost``."""
    key = machine_spec.get("price_key")
    if key:
        path = pricing_path()
        return load_pricing(path).price(key, source=path)
    return float(machine_spec.get("hourly_cost") or 0.0)


class BudgetExceeded(ValueError):
    """A run's estimated cost is above its budget; raised by ``plan`` before provisioning."""


def estimate_cost(cells: list[CellSpec], expected_seconds: float | None) -> float:
    """Estimated cost of running ``cells``: per cell, expected seconds x the
    machine's hourly price / 3600. ``expected_seconds`` None: each cell's workload timeout,
    the longest it may hold its machine."""
    total = 0.0
    for c in cells:
        seconds = expected_seconds if expected_seconds is not None else c.workload.timeout
        total += float(seconds) / 3600.0 * hourly_price(c.machine_json)
    return total


def check_budget(
    cells: list[CellSpec],
    *,
    max_usd: float,
    expected_seconds: float | None,
    source: str,
) -> float:
    """The estimate, or BudgetExceeded naming it, the budget and where the budget came from."""
    priced = any(c.machine_json.get("price_key") for c in cells)
    currency = load_pricing().currency if priced else "USD"
    if currency != "USD":
        raise PricingError(
            f"budget.max_usd is in USD but {pricing_path()} prices in {currency}: "
            "convert the pricing table or the budget"
        )
    estimate = estimate_cost(cells, expected_seconds)
    if estimate > max_usd:
        per = "expected_seconds" if expected_seconds is not None else "workload timeout"
        raise BudgetExceeded(
            f"estimated cost {estimate:.2f} USD for {len(cells)} cell(s) ({per} x hourly "
            f"price per cell) exceeds the budget of {max_usd:.2f} USD ({source}): nothing was "
            "provisioned; raise the budget, select fewer cells or lower expected_seconds"
        )
    return estimate
