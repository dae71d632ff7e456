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
from typing import Any

import numpy as np

from accelmatrix.contracts.run_records import MetricValue

DAY0 = datetime(2026, 9, 1, tzinfo=UTC)

# A suite file for a planted matrix (models x machine kinds, builds named by date): what a
# re-test plans its follow-up runs from (``spec.followup.expand_followup``).
SUITE_YAML = """
description: planted perf matrix
owners: [ml-infra]
runtime_version: nightly-${{run.ds}}
axes:
  model: [{models}]
  machine: [{machines}]
machines:
{machine_specs}
workload:
  run: ["${{python}}", "-c", "print('step_time: 1s')"]
  timeout: 60
  metrics:
    - {{type: log_regex, name: step_time, pattern: 'step_time: ([0-9.e+-]+)s', series: true}}
checks:
  - {{type: log_contains, pattern: step_time}}
"""


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
    # Builds that differ by themselves: each build of each model sits at its own level,
    # uniform within +-build_sd, fixed (a re-test of that build sees it too).
    build_sd: float = 0.0

    def cell(self, model: str, machine: str) -> str:
        return f"model={model},machine={machine}"

    def date(self, night: int) -> datetime:
        return DAY0 + timedelta(days=night)

    def value(
        self,
        rng: np.random.Generator,
        model: str,
        machine: str,
        night: int,
        base: float,
        build_night: int | None = None,
    ):
        """The metric of one cell on ``night``, testing the build of ``build_night`` (default:
        that night's): a build cause follows the build, an infrastructure cause the night
        (the machine kind is slow now, whatever build it runs)."""
        factor = 1.0
        build_night = night if build_night is None else build_night
        for c in self.causes:
            if c.kind == "build" and c.model == model and build_night >= c.night:
                factor *= 1 + c.change
            if c.kind == "infrastructure" and c.machine == machine and night >= c.night:
                factor *= 1 + c.change
        return (
            base
            * (1 + 0.1 * self.models.index(model))
            * factor
            * self.build_level(model, build_night)
            * (1 + self.cv * rng.standard_normal())
        )

    def build_level(self, model: str, build_night: int) -> float:
        """The fixed level of one build of one model (``build_sd``)."""
        if not self.build_sd:
            return 1.0
        own = np.random.default_rng([self.seed, 1_000 + build_night, self.models.index(model)])
        return 1.0 + float(own.uniform(-self.build_sd, self.build_sd))

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
                            MetricValue(name=me, value=values[(n, mo, ma, me)], step=None)
                            for me in self.metrics
                        ],
                    )

    def suite_yaml(self, extra: str = "") -> str:
        """The text of a suite file for this matrix (``extra`` appended: a history block)."""
        specs = "\n".join(f"  {m}: {{backend: local, hourly_cost: 1.0}}" for m in self.machines)
        return (
            SUITE_YAML.format(
                models=", ".join(self.models),
                machines=", ".join(self.machines),
                machine_specs=specs,
            )
            + extra
        )

    def plant_followup(
        self,
        store,
        suite: Any,
        run_id: str,
        followup: Any,
        rng: np.random.Generator,
        *,
        now: int | None = None,
        empty: bool = False,
        machine_sd: float = 0.03,
    ) -> None:
        """Write a re-test session as its cells would leave it: the run, one session cell per
        suspect cell, and that cell's log (``output.log`` in its artifacts, where the session
        reader finds it), with the interleave driver's markers around each sample and the
        value its build has (the level of the build's night with the planted causes) on
        this session's one machine (a speed factor drawn once per session, ``machine_sd``)
        with fresh noise per sample, on the machines as they are on night ``now`` (default:
        the build's night); ``empty``: the samples print nothing (an infrastructure
        failure)."""
        import json

        from accelmatrix import settings
        from accelmatrix.backends.interleave import MARK
        from accelmatrix.spec.followup_plan import (
            FOLLOWUP_KEY,
            base_cell,
            expand_followup,
            session_order,
        )

        store.upsert_run(
            self.dag_id,
            run_id,
            suite=self.dag_id,
            run_type=followup.kind,
            params={FOLLOWUP_KEY: followup.model_dump()},
            started_at=datetime.now(UTC),
            state="passed",
        )
        order = session_order(len(followup.builds), followup.pairs)
        for c in expand_followup(suite, self.dag_id, followup).cells:
            model, machine = c.axes["model"], c.axes["machine"]
            assert base_cell(c.id) == self.cell(model, machine)
            store.upsert_cell(
                self.dag_id, run_id, c.id, axes=c.axes, machine=machine, state="passed"
            )
            log = settings.cell_artifacts_dir(self.dag_id, run_id, c.id) / "output.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            speed = 1 + machine_sd * rng.standard_normal()
            lines = []
            for i, k in enumerate(order):
                build = followup.builds[k]
                day = datetime.strptime(build[-10:], "%Y-%m-%d").replace(tzinfo=UTC)
                night = (day - DAY0).days
                lines.append(MARK + json.dumps({"i": i, "build": build, "event": "begin"}))
                if not empty:
                    at = night if now is None else now
                    for me, base in self.metrics.items():
                        value = self.value(rng, model, machine, at, base, build_night=night)
                        lines.append(f"{me}: {value * speed!r}s")
                end = {"i": i, "build": build, "event": "end", "exit": 0}
                lines.append(MARK + json.dumps(end))
            log.write_text("\n".join(lines) + "\n")
