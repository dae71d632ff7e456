"""Planted matrices of per-cell changes with a known cause (history.culprits.attribution).

models x machine kinds x runtimes cells; the cause moves the cells it owns by ``effect`` %
(each model by its own factor in 0.7-1.3: a big model feels a slow machine more), every cell
carries Gaussian noise. A cell's Δ is the mean of ``after`` nights against the median-ish
level of ``before`` nights, each night with ``noise`` % sd, so its standard error is
``noise * sqrt(1/after + 1/before)``. Used by tests/test_attribution.py and
bench/bench_profile_diff.py, so both measure the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from accelmatrix.history.culprits.attribution import CellDelta

__all__ = ["CAUSES", "Planted", "plant"]

PlantedCause = Literal["code", "code_one_model", "machine_kind", "runtime", "noise"]
CAUSES: tuple[PlantedCause, ...] = ("code", "code_one_model", "machine_kind", "runtime", "noise")


@dataclass(frozen=True)
class Planted:
    change: CellDelta
    siblings: list[CellDelta]
    cause: str  # the class attribution should give
    value: str | None  # the machine kind or runtime, for those classes
    reproduced: bool  # what an A/B re-test on one machine would say


def plant(
    rng: np.random.Generator,
    cause: PlantedCause,
    *,
    models: int = 4,
    kinds: int = 3,
    runtimes: int = 2,
    effect: float = 3.0,
    noise: float = 2.0,
    after: int = 4,
    before: int = 14,
) -> Planted:
    se = noise * math.sqrt(1 / after + 1 / before)
    ms = [f"model{i}" for i in range(models)]
    ks = [f"kind{i}" for i in range(kinds)]
    rs = [f"rt{i}" for i in range(runtimes)]
    factor = {m: float(rng.uniform(0.7, 1.3)) for m in ms}
    kind, rt, one = str(rng.choice(ks)), str(rng.choice(rs)), str(rng.choice(ms))

    def owned(m: str, k: str, r: str) -> bool:
        return {
            "code": True,
            "code_one_model": m == one,
            "machine_kind": k == kind,
            "runtime": r == rt,
            "noise": False,
        }[cause]

    cells, moved = [], []
    for m in ms:
        for k in ks:
            for r in rs:
                d = (effect * factor[m] if owned(m, k, r) else 0.0) + float(rng.normal(0, se))
                c = CellDelta(f"{m}-{k}-{r}", k, {"model": m, "runtime": r}, d, se)
                cells.append(c)
                if owned(m, k, r):
                    moved.append(c)
    change = moved[int(rng.integers(len(moved)))] if moved else cells[int(rng.integers(len(cells)))]
    label = {"code_one_model": "code", "runtime": "axis_value"}.get(cause, cause)
    value = kind if cause == "machine_kind" else rt if cause == "runtime" else None
    return Planted(
        change=change,
        siblings=[c for c in cells if c is not change],
        cause=label,
        value=value,
        reproduced=cause in ("code", "code_one_model"),
    )
