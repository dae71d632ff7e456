"""Planted perf history: a matrix of models x machine kinds over nights, with known causes.

Writes runs, cells and metrics to a real results store as the steps of a suite would, one
run per night (``runtime_version`` nightly-DATE). Causes are planted exactly where the
caller says: a build regression (one model, every machine kind, from a night on) and a
machine-kind slowdown (every model on one kind, from a night on). Used by the perf-history
tests and bench/bench_history.py, so both measure the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np

DAY0 = datetime(2026, 9, 1, tzinfo=UTC)


@dataclass
class Cause:
    kind: str  # build | infrastructure
    night: int  # first night at the new level
    change: float  # relative, +0.05 = 5 % slower
    model: str | None = None  # build: the model it slows
    machine: str | None = None  # infrastructure: the machine kind it slows


@dataclass
class PerfMatrix:
    dag_id: str = "perf_matrix"
    models: list[str] = field(default_factory=lambda: ["m0", "m1", "m2", "m3"])
    machines: list[str] = field(default_factory=lambda: ["k0", "k1", "k2"])
    nights: int = 60
    cv: float = 0.02
    causes: list[Cause] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=lambda: {"step_time": 1.0})
    seed: int = 0

    def cell(self, model: str, machine: str) -> str:
        return f"model={model},machine={machine}"

    def date(self, night: int) -> datetime:
        return DAY0 + timedelta(days=night)

    def value(self, rng: np.random.Generator, model: str, machine: str, night: int, base: float):
        factor = 1.0
        for c in self.causes:
            hit = (c.kind == "build" and c.model == model) or (
                c.kind == "infrastructure" and c.machine == machine
            )
            if hit and night >= c.night:
                factor *= 1 + c.change
        return (
            base
            * (1 + 0.1 * self.models.index(model))
            * factor
            * (1 + self.cv * rng.standard_normal())
        )

    def plant(self, store, nights: range | None = None) -> None:
        """Write the runs of ``nights`` (default: all) to ``store``."""
        rng = np.random.default_rng(self.seed)
        values = {
            (n, mo, ma, me): self.value(rng, mo, ma, n, base)
            for n in range(self.nights)
            for mo in self.models
            for ma in self.machines
            for me, base in self.metrics.items()
        }
        for n in nights if nights is not None else range(self.nights):
            ld = self.date(n)
            run_id = f"scheduled__{ld.isoformat()}"
            store.upsert_run(
                self.dag_id,
                run_id,
                suite=self.dag_id,
                logical_date=ld,
                run_type="scheduled",
                runtime_version=f"nightly-{ld:%Y-%m-%d}",
                started_at=ld + timedelta(hours=1),
                state="passed",
            )
            for mo in self.models:
                for ma in self.machines:
                    cid = self.cell(mo, ma)
                    store.upsert_cell(
                        self.dag_id,
                        run_id,
                        cid,
                        axes={"model": mo, "machine": ma},
                        machine=ma,
                        backend="local",
                        state="passed",
                    )
                    store.replace_metrics(
                        self.dag_id,
                        run_id,
                        cid,
                        [
                            {"name": me, "value": values[(n, mo, ma, me)], "step": None}
                            for me in self.metrics
                        ],
                    )
