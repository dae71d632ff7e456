"""Plant runs in a results store the way the lifecycle records them: for the matrix page's
tests and its benchmark (bench/bench_page.py).

``plant_run`` writes one run (run row, cell rows, a scalar ``step_time`` metric per cell and
its ``step_time_within_bounds`` check with benchmark and bounds, plus any failed checks) in
one transaction, so a 1,024-cell run with a month of history is planted in seconds instead
of one transaction per row. ``synthetic_suite`` builds such a history with every state the
page colours, regressions and flaky series included.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

from sqlalchemy import delete, insert

from accelmatrix.results import schema
from accelmatrix.results.store import ResultsStore

__all__ = [
    "BOUNDS",
    "END",
    "PlantedCell",
    "cell_id",
    "plant_demo",
    "plant_run",
    "planted_docs",
    "synthetic_suite",
]

# The demo suite of the page's tests: its last run and the bounds of its two benchmarks.
END = datetime(2026, 11, 20, 2, 0, tzinfo=UTC)
BOUNDS = {"a": (0.9, 1.1), "b": (1.8, 2.2)}


@dataclass
class PlantedCell:
    cell_id: str
    axes: dict[str, str]
    index: int | None  # None: an excluded cell (the plan gives it no index)
    machine: str = "cpu"
    state: str = "passed"
    quarantined: bool = False
    excluded_reason: str | None = None
    message: str = ""
    data_docs: str | None = None
    step_time: float | None = None
    benchmark: str | None = None
    lower: float | None = None
    upper: float | None = None
    # A name, or (name, expected, observed) as the evaluate step stores them.
    failed_checks: Sequence[str | tuple[str, str, str]] = field(default_factory=tuple)
    attempt: int = 1
    exit_code: int | None = None


def cell_id(axes: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in axes.items())


def plant_run(
    store: ResultsStore,
    dag_id: str,
    run_id: str,
    cells: Sequence[PlantedCell],
    *,
    logical_date: datetime | None,
    started_at: datetime,
    state: str = "failed",
    run_type: str = "scheduled",
) -> None:
    """Replace the run's rows with ``cells`` in one write transaction."""
    store.ensure_schema()
    run = {
        "dag_id": dag_id,
        "run_id": run_id,
        "suite": dag_id,
        "logical_date": logical_date,
        "run_type": run_type,
        "params": {},
        "state": state,
        "started_at": started_at,
        "finished_at": started_at + timedelta(minutes=5),
        "created_at": started_at,
        "updated_at": started_at,
    }
    cell_rows, metric_rows, check_rows = [], [], []
    key = {"dag_id": dag_id, "run_id": run_id}
    for c in cells:
        cell_rows.append(
            {
                **key,
                "cell_id": c.cell_id,
                "cell_index": c.index,
                "axes": c.axes,
                "machine": c.machine if c.index is not None else None,
                "backend": "local",
                "quarantined": c.quarantined,
                "excluded_reason": c.excluded_reason,
                "state": c.state,
                "message": c.message,
                "attempt": c.attempt,
                "exit_code": c.exit_code,
                "data_docs": c.data_docs,
                "updated_at": started_at,
            }
        )
        if c.step_time is not None:
            metric_rows.append(
                {
                    **key,
                    "cell_id": c.cell_id,
                    "name": "step_time",
                    "step": schema.SCALAR_STEP,
                    "value": c.step_time,
                    "unit": "s",
                    "source": "profiler_trace",
                }
            )
            if c.benchmark is not None:
                inside = (c.lower is None or c.step_time >= c.lower) and (
                    c.upper is None or c.step_time <= c.upper
                )
                check_rows.append(
                    {
                        **key,
                        "cell_id": c.cell_id,
                        "check_name": f"step_time_within_bounds[{c.benchmark}]",
                        "check_type": "step_time_within_bounds",
                        "passed": inside,
                        "benchmark": c.benchmark,
                        "metric": "step_time",
                        "value": c.step_time,
                        "lower_bound": c.lower,
                        "upper_bound": c.upper,
                        "expected": f"step time within [{c.lower}, {c.upper}] s",
                        "observed": f"{c.step_time:.4g} s",
                        "message": "" if inside else "step time out of bounds",
                    }
                )
        for check in c.failed_checks:
            name, expected, observed = check if isinstance(check, tuple) else (check, None, None)
            check_rows.append(
                {
                    **key,
                    "cell_id": c.cell_id,
                    "check_name": name,
                    "check_type": "log_contains",
                    "passed": False,
                    "expected": expected,
                    "observed": observed,
                    "message": f"{name} failed",
                    # executemany needs every row to carry the same keys
                    "benchmark": None,
                    "metric": None,
                    "value": None,
                    "lower_bound": None,
                    "upper_bound": None,
                }
            )
    tables = (schema.metrics, schema.checks, schema.cells, schema.runs)
    with store._writing() as conn:  # noqa: SLF001 - bulk planting for tests and bench
        for t in tables:
            conn.execute(delete(t).where(t.c.dag_id == dag_id, t.c.run_id == run_id))
        conn.execute(insert(schema.runs), [run])
        for table, rows in (
            (schema.cells, cell_rows),
            (schema.metrics, metric_rows),
            (schema.checks, check_rows),
        ):
            if rows:
                conn.execute(insert(table), rows)


def synthetic_suite(
    store: ResultsStore,
    dag_id: str,
    axes: dict[str, int],
    *,
    history: int,
    end: datetime,
    seed: int = 7,
    regressions: int = 8,
    flaky: int = 8,
) -> list[str]:
    """Nightly runs (one per day up to ``end``) of the product of ``axes`` (name -> number
    of values); returns the run ids, oldest first. The benchmark is the first axis' value.
    The last run has failed, infra-failed, quarantined and excluded cells; ``regressions``
    cells end with 2 points over their bounds and ``flaky`` cells flip in and out."""
    rng = random.Random(seed)
    labels = {a: [f"{a}{i}" for i in range(n)] for a, n in axes.items()}
    combos = [dict(zip(labels, vals, strict=True)) for vals in itertools.product(*labels.values())]
    first = next(iter(axes))
    base = {v: 0.01 * (1 + i) for i, v in enumerate(labels[first])}
    ids = [cell_id(a) for a in combos]
    picks = rng.sample(range(len(combos)), k=min(len(combos), regressions + flaky))
    regressing = set(picks[:regressions])
    flapping = set(picks[regressions:])
    run_ids = []
    for day in range(history):
        last = day == history - 1
        when = end - timedelta(days=history - 1 - day)
        run_id = f"scheduled__{when:%Y-%m-%dT%H:%M:%S}+00:00"
        cells = []
        index = 0
        for i, (a, cid) in enumerate(zip(combos, ids, strict=True)):
            mean = base[a[first]]
            lo, hi = mean * 0.9, mean * 1.1
            value = mean * (1 + rng.uniform(-0.04, 0.04))
            if i in regressing and day >= history - 2:
                value = hi * 1.3
            if i in flapping and (history - 1 - day) % 2 == 1:
                value = hi * 1.2
            state = "passed" if lo <= value <= hi else "failed"
            c = PlantedCell(
                cell_id=cid,
                axes=a,
                index=index,
                state=state,
                step_time=value,
                benchmark=a[first],
                lower=lo,
                upper=hi,
                data_docs=None,
            )
            if last:
                roll = rng.random()
                if roll < 0.03:
                    c.state, c.failed_checks = "failed", ("log_contains[Finished]",)
                elif roll < 0.05:
                    c.state, c.message = "infra_failed", "infrastructure failure: stockout"
                elif roll < 0.08:
                    c.quarantined = True
                elif roll < 0.11:
                    c.index, c.state, c.step_time = None, "excluded", None
                    c.excluded_reason = "not supported on this machine"
            if c.index is not None:
                index += 1
            cells.append(c)
        plant_run(store, dag_id, run_id, cells, logical_date=when, started_at=when)
        run_ids.append(run_id)
    return run_ids


def planted_docs(dag_id: str, run_id: str, cell: str) -> dict[str, Any]:
    """Paths of a cell's Data Docs index under the artifacts dir (created, tiny)."""
    from accelmatrix import settings

    d = settings.cell_artifacts_dir(dag_id, run_id, cell) / "data_docs"
    d.mkdir(parents=True, exist_ok=True)
    index = d / "index.html"
    index.write_text(f"<!doctype html><title>Data Docs</title><h1>Data Docs of {escape(cell)}</h1>")
    return {"dir": d, "index": index}


def _runs(n: int = 7) -> list[tuple[str, datetime]]:
    return [
        (f"scheduled__{d:%Y-%m-%dT%H:%M:%S}+00:00", d)
        for d in (END - timedelta(days=n - 1 - i) for i in range(n))
    ]


def plant_demo(store: ResultsStore, dag_id: str = "demo") -> list[str]:
    """Suite `demo`: model {a, b} x config {x, y, z}; model a on machine cpu, b on gpu.

    Latest run: a,x passed (Data Docs); a,y failed (and its step time regressed over the
    last two runs); a,z infrastructure failure; b,x passed but quarantined; b,y excluded;
    b,z passed with a step time that flipped in and out of bounds (flaky).
    """
    runs = _runs()
    for i, (run_id, when) in enumerate(runs):
        last = i == len(runs) - 1
        cells = []
        index = 0
        for m in ("a", "b"):
            for c in ("x", "y", "z"):
                axes = {"model": m, "config": c}
                lo, hi = BOUNDS[m]
                mean = (lo + hi) / 2
                value = mean
                if (m, c) == ("a", "y") and i >= len(runs) - 2:
                    value = hi * 1.5
                if (m, c) == ("b", "z") and i % 2 == 1:
                    value = hi * 1.2
                pc = PlantedCell(
                    cell_id=cell_id(axes),
                    axes=axes,
                    index=index,
                    machine="cpu" if m == "a" else "gpu",
                    step_time=value,
                    benchmark=m,
                    lower=lo,
                    upper=hi,
                )
                if last:
                    if (m, c) == ("a", "x"):
                        docs = planted_docs(dag_id, run_id, pc.cell_id)
                        pc.data_docs = str(docs["index"])
                    elif (m, c) == ("a", "y"):
                        pc.state, pc.failed_checks = "failed", ("final_loss",)
                    elif (m, c) == ("a", "z"):
                        pc.state, pc.step_time = "infra_failed", None
                        pc.message = "infrastructure failure: stockout"
                    elif (m, c) == ("b", "x"):
                        pc.quarantined = True
                    elif (m, c) == ("b", "y"):
                        pc.index, pc.state, pc.step_time = None, "excluded", None
                        pc.excluded_reason = "y is not supported on b"
                if pc.index is not None:
                    index += 1
                cells.append(pc)
        plant_run(store, dag_id, run_id, cells, logical_date=when, started_at=when)
    return [r for r, _ in runs]
