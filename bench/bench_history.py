"""Perf history at scale: bounds re-computation, change points, and one alert per cause.

Prints figures against the goals of issue 6 (bounds) and issue 26 (change points). A
script that prints, not a timed test; every figure says which goal it answers:

``bounds``       Bounds re-computation + the old bounds-window classification over a
                 1,000,000-row history of 1,000 series: <= 10 s (issue 6). The history has
                 the columns ``history.series.frame.history`` returns and
                 ``history.series.regression.classify`` reads; some series regressed, flaky or
                 drifting, so every verdict occurs. Prints JSON with seconds per phase.
``maintenance``  The maintenance DAG's full pass: 10,000 series of 365 points (level ~100,
                 noise CV 2 %, a few % of them with a step), ``detect_many`` over all of
                 them on one core: <= 60 s. Also ``find_changes`` over the equivalent history
                 frame (3.65 M rows), to show what the frame handling adds.
``gate``         The gate's incremental pass for a 1,024-cell run, 3 metrics per cell, 60
                 points each (3,072 series): ``find_changes(window=60)`` over the window
                 frame <= 2 s (the goal's figure: detection). Then, apart, a real
                 ``update_changes`` against a SQLite results store in a temp dir planted
                 with that history: reading the history plus writing the store.
``grouping``     4 models x 3 machine kinds x 60 nights, one build regression (model m1,
                 every machine kind, +5 % from night 30) and one machine-kind slowdown
                 (kind k2, every model, +8 % from night 45), planted night by night into
                 a SQLite store with ``update_changes`` after each night as the gate runs
                 it. Notifications (the groups the gate hands to alerts.deliver_groups, all passes) /
                 causes <= 1.1, and
                 each final group names its cause; over several seeds, with the delay
                 from each cause to its group's creation.

The timed sections run pinned to one CPU, with every BLAS/OpenMP pool set to one thread
before NumPy is imported. ``--quick`` runs a smaller version of everything (not the goals'
sizes: for checking that the script works).

    python bench/bench_history.py [--quick] [--only maintenance,gate,grouping,bounds]
                                  [--seeds 10] [--rows 1000000] [--series 1000]
"""

from __future__ import annotations

import os

# One core, before NumPy (and its BLAS) is imported anywhere.
for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "tests"))  # accelmatrix_testkit.perf_matrix

DAY0 = datetime(2026, 1, 1, tzinfo=UTC)
GATE_METRICS = ("step_time", "tokens_per_s", "peak_memory_gb")
HIGHER_IS_BETTER = {"tokens_per_s"}


def _higher_is_better(metric: str) -> bool:
    return metric in HIGHER_IS_BETTER


@contextmanager
def one_core():
    """Pin this process to one CPU for the block (where the OS allows it)."""
    if not hasattr(os, "sched_setaffinity"):
        yield "one thread (affinity not supported here)"
        return
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield f"pinned to CPU {cpu}, 1 thread"
    finally:
        os.sched_setaffinity(0, before)


def _met(value: float, goal: float) -> str:
    return "MET" if value <= goal else "MISSED"


# -- bounds (issue 6) ---------------------------------------------------------------------


def synthetic(rows: int, series: int, seed: int = 0):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    per = rows // series
    n_bench = max(1, series // 10)
    sid = np.repeat(np.arange(series), per)
    t = np.tile(np.arange(per), series)
    base = 0.1 + (sid % n_bench) * 0.01
    value = base * (1 + rng.normal(0, 0.01, sid.size))
    kind = sid % 10
    value[(kind == 1) & (t >= per - 3)] *= 1.5  # regressed at the end
    value[(kind == 2) & (t % 2 == 1)] *= 1.5  # flaky
    value[(kind == 3) & (t > per // 2) & (t < per // 2 + 4)] *= 1.5  # recovered
    return pd.DataFrame(
        {
            "benchmark": pd.Categorical([f"bench-{b:03d}" for b in sid % n_bench]),
            "cell_id": pd.Categorical([f"model=m{c:02d}" for c in sid // n_bench]),
            "metric": pd.Categorical(["step_time"] * sid.size),
            "time": pd.to_datetime(t, unit="D", origin="2026-01-01", utc=True),
            "value": value,
            "lower": base * 0.95,
            "upper": base * 1.05,
        }
    )


def bench_bounds(rows: int, series: int, confidence: float) -> None:
    print(f"== bounds (issue 6): {rows:,} rows, {series:,} series")
    t0 = time.perf_counter()
    import pandas  # noqa: F401 - counted apart from the work
    import scipy.stats  # noqa: F401

    from accelmatrix.history.bounds.bounds_job import bounds_table
    from accelmatrix.history.series.regression import Rules, classify

    t_import = time.perf_counter() - t0
    h = synthetic(rows, series)
    t_gen = time.perf_counter() - t0 - t_import

    t1 = time.perf_counter()
    # Bounds per series (what re-centering computes per benchmark, here per series so the
    # work is 1,000 groups over all 1,000,000 rows).
    h["series"] = h["benchmark"].astype(str) + "|" + h["cell_id"].astype(str)
    bounds = bounds_table(h, confidence, by="series")
    t_bounds = time.perf_counter() - t1
    t2 = time.perf_counter()
    verdicts = classify(h.drop(columns="series"), Rules())
    t_classify = time.perf_counter() - t2
    total = t_bounds + t_classify
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "rows": len(h),
        "series": int(len(verdicts)),
        "bounds_rows": int(len(bounds)),
        "statuses": {k: int(v) for k, v in verdicts["status"].value_counts().items()},
        "import_s": round(t_import, 2),
        "generate_s": round(t_gen, 2),
        "bounds_s": round(t_bounds, 2),
        "classify_s": round(t_classify, 2),
        "bounds_plus_classify_s": round(total, 2),
        "goal_s": 10,
        "met": total <= 10,
        "peak_rss_mib": round(peak_mib),
    }
    print(json.dumps(out, indent=1))


# -- generated perf series ----------------------------------------------------------------


def perf_series(count: int, points: int, *, step_share: float, seed: int):
    """(values[count, points], step index or -1 per series): level ~100 (50..150), noise
    CV 2 %, ``step_share`` of the series with one step of 3..10 % (either way) at a
    random night between a quarter in and 10 nights before the end."""
    import numpy as np

    rng = np.random.default_rng(seed)
    level = rng.uniform(50, 150, count)[:, None]
    x = level * (1 + 0.02 * rng.standard_normal((count, points)))
    stepped = rng.random(count) < step_share
    at = np.where(stepped, rng.integers(points // 4, points - 10, count), -1)
    size = rng.uniform(0.03, 0.10, count) * rng.choice([-1, 1], count)
    cols = np.arange(points)[None, :]
    x *= np.where(stepped[:, None] & (cols >= at[:, None]), 1 + size[:, None], 1.0)
    return x, at


def history_frame(values, cells: list[str], metrics: list[str], machines: list[str]):
    """A frame with the columns ``find_changes`` reads, as ``history.series.frame.history`` gives
    them (plain object strings, UTC times): one row per (night, series), nights oldest first.
    Series i is (cells[i], metrics[i]) on machines[i]."""
    import numpy as np
    import pandas as pd

    count, points = values.shape
    nights = pd.date_range(DAY0, periods=points, freq="D")
    run_ids = np.array([f"scheduled__{t.isoformat()}" for t in nights], dtype=object)
    builds = np.array([f"nightly-{t:%Y-%m-%d}" for t in nights], dtype=object)
    night = np.repeat(np.arange(points), count)
    sid = np.tile(np.arange(count), points)
    cell_arr = np.array(cells, dtype=object)
    metric_arr = np.array(metrics, dtype=object)
    machine_arr = np.array(machines, dtype=object)
    return pd.DataFrame(
        {
            "run_id": run_ids[night],
            "time": nights[night],
            "runtime_version": builds[night],
            "cell_id": cell_arr[sid],
            "machine": machine_arr[sid],
            "backend": "local",
            "benchmark": "",
            "metric": metric_arr[sid],
            "value": values.T.reshape(-1),
        }
    )


# -- maintenance: full pass -----------------------------------------------------------------


def bench_maintenance(series: int, points: int) -> None:

    from accelmatrix.history.change_points.tracking import find_changes
    from accelmatrix.history.series.detector import detect_many

    print(f"== maintenance full pass: {series:,} series x {points} points")
    values, at = perf_series(series, points, step_share=0.03, seed=1)
    arrays = list(values)
    with one_core() as how:
        t0 = time.perf_counter()
        found = detect_many(arrays)
        t_detect = time.perf_counter() - t0
    stepped = at >= 0
    hit = sum(
        any(abs(c.index - a) <= 1 for c in f) for f, a in zip(found, at, strict=True) if a >= 0
    )
    false = sum(len(f) for f, a in zip(found, at, strict=True) if a < 0)
    print(f"  one core ({how})")
    print(
        f"  series with a planted step: {int(stepped.sum())}; found within +-1: {hit}; "
        f"change points on step-free series: {false} "
        f"({false / max(1, (~stepped).sum() * points) * 1000:.3f} per 1,000 points)"
    )
    print(
        f"  detect_many:  {t_detect:6.1f} s   goal <= 60 s: {_met(t_detect, 60)} "
        f"({t_detect / series * 1000:.2f} ms per series)"
    )

    per_cell = len(GATE_METRICS) + 1
    metric_names = [*GATE_METRICS, "final_loss"]
    cells = [f"model=m{i // per_cell // 4:04d},machine=k{i // per_cell % 4}" for i in range(series)]
    metrics = [metric_names[i % per_cell] for i in range(series)]
    machines = [f"k{i // per_cell % 4}" for i in range(series)]
    t0 = time.perf_counter()
    frame = history_frame(values, cells, metrics, machines)
    t_frame = time.perf_counter() - t0
    with one_core():
        t0 = time.perf_counter()
        cps, analysed = find_changes(frame, higher_is_better=_higher_is_better)
        t_find = time.perf_counter() - t0
    print(
        f"  find_changes over the history frame ({len(frame):,} rows, {len(analysed):,} "
        f"series, {len(cps):,} change points): {t_find:6.1f} s   goal <= 60 s: "
        f"{_met(t_find, 60)} (frame handling adds {t_find - t_detect:+.1f} s to detection; "
        f"building the frame, not counted: {t_frame:.1f} s)"
    )
    del frame, values, arrays


# -- gate: incremental pass -----------------------------------------------------------------


def gate_matrix(models: int, machines: int, batches: int):
    """Cell ids and machine kinds of a models x machines x batch-sizes matrix."""
    cells, kinds = [], []
    for mo in range(models):
        for ma in range(machines):
            for b in range(batches):
                cells.append(f"model=m{mo:03d},machine=k{ma},batch={2**b}")
                kinds.append(f"k{ma}")
    return cells, kinds


def gate_values(n_cells: int, nights: int, *, seed: int):
    """values[cell, metric, night]: 3 metrics per cell, noise CV 2 %; the cells of 2 % of
    the models slow down 5 % from 8 nights before the end (a build regression)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = np.array([1.0, 5000.0, 40.0])  # step_time s, tokens/s, GiB
    level = rng.uniform(0.5, 2.0, (n_cells, 1, 1)) * base[None, :, None]
    v = level * (1 + 0.02 * rng.standard_normal((n_cells, len(GATE_METRICS), nights)))
    hit = rng.random(n_cells) < 0.02
    v[hit, 0, nights - 8 :] *= 1.05
    v[hit, 1, nights - 8 :] /= 1.05
    return v


def plant_bulk(store, dag_id: str, cells, kinds, values, nights) -> None:
    """Write the runs of ``nights`` (values[cell, metric, night]) as ``upsert_run`` /
    ``upsert_cell`` / ``replace_metrics`` write them (same tables, same columns), in one
    transaction per night: the public calls take ~5 ms per cell here, 5 minutes for
    61,440 cells, which is the run's steps' time and not the pass measured."""
    from accelmatrix.results import schema

    store.ensure_schema()
    for n in nights:
        ld = DAY0 + timedelta(days=n)
        run_id = f"scheduled__{ld.isoformat()}"
        now = datetime.now(UTC)
        with store._writing() as conn:  # noqa: SLF001 - bulk planting, see docstring
            conn.execute(
                schema.runs.insert(),
                [
                    {
                        "dag_id": dag_id,
                        "run_id": run_id,
                        "suite": dag_id,
                        "logical_date": ld,
                        "run_type": "scheduled",
                        "runtime_version": f"nightly-{ld:%Y-%m-%d}",
                        "started_at": ld + timedelta(hours=1),
                        "state": "passed",
                        "created_at": now,
                        "updated_at": now,
                    }
                ],
            )
            conn.execute(
                schema.cells.insert(),
                [
                    {
                        "dag_id": dag_id,
                        "run_id": run_id,
                        "cell_id": c,
                        "axes": dict(kv.split("=") for kv in c.split(",")),
                        "machine": k,
                        "backend": "local",
                        "state": "passed",
                        "updated_at": now,
                    }
                    for c, k in zip(cells, kinds, strict=True)
                ],
            )
            conn.execute(
                schema.metrics.insert(),
                [
                    {
                        "dag_id": dag_id,
                        "run_id": run_id,
                        "cell_id": c,
                        "name": m,
                        "step": schema.SCALAR_STEP,
                        "value": float(values[i, j, n]),
                    }
                    for i, c in enumerate(cells)
                    for j, m in enumerate(GATE_METRICS)
                ],
            )


def plant_night_public(store, dag_id: str, cells, kinds, values, n: int) -> None:
    """The last night as the run's steps write it, through the public store calls."""
    from accelmatrix.contracts.run_records import MetricValue

    ld = DAY0 + timedelta(days=n)
    run_id = f"scheduled__{ld.isoformat()}"
    store.upsert_run(
        dag_id,
        run_id,
        suite=dag_id,
        logical_date=ld,
        run_type="scheduled",
        runtime_version=f"nightly-{ld:%Y-%m-%d}",
        started_at=ld + timedelta(hours=1),
        state="passed",
    )
    for i, (c, k) in enumerate(zip(cells, kinds, strict=True)):
        store.upsert_cell(
            dag_id,
            run_id,
            c,
            axes=dict(kv.split("=") for kv in c.split(",")),
            machine=k,
            backend="local",
            state="passed",
        )
        store.replace_metrics(
            dag_id,
            run_id,
            c,
            [
                MetricValue(name=m, value=float(values[i, j, n]), step=None)
                for j, m in enumerate(GATE_METRICS)
            ],
        )


def bench_gate(models: int, nights: int, store_pass: bool) -> None:

    from accelmatrix.history.change_points.tracking import find_changes, update_changes
    from accelmatrix.history.series.detector import detect_many
    from accelmatrix.history.series.frame import history
    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite_parts import HistorySpec

    cells, kinds = gate_matrix(models, 4, 4)
    n_series = len(cells) * len(GATE_METRICS)
    print(
        f"== gate incremental pass: {len(cells):,} cells x {len(GATE_METRICS)} metrics = "
        f"{n_series:,} series, {nights} points each"
    )
    values = gate_values(len(cells), nights, seed=2)
    flat = values.reshape(n_series, nights)
    frame = history_frame(
        flat,
        [c for c in cells for _ in GATE_METRICS],
        [m for _ in cells for m in GATE_METRICS],
        [k for k in kinds for _ in GATE_METRICS],
    )
    spec = HistorySpec(confirm={"enabled": False})  # notifications on nightly points alone
    with one_core() as how:
        t0 = time.perf_counter()
        detect_many(list(flat[:, -spec.window :]))
        t_detect = time.perf_counter() - t0
        t0 = time.perf_counter()
        cps, _ = find_changes(frame, higher_is_better=_higher_is_better, window=spec.window)
        t_find = time.perf_counter() - t0
    print(f"  one core ({how})")
    print(f"  detect_many alone over the {n_series:,} windows: {t_detect:.2f} s")
    print(
        f"  find_changes(window={spec.window}) over the window frame ({len(frame):,} rows, "
        f"{len(cps)} change points): {t_find:.2f} s   goal <= 2 s: {_met(t_find, 2)}"
        "  <- the goal's figure (detection)"
    )
    if not store_pass:
        return
    dag_id = "gate_bench"
    tracked = dict.fromkeys(GATE_METRICS, "median")
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultsStore(f"sqlite:///{tmp}/results.db")
        t0 = time.perf_counter()
        plant_bulk(store, dag_id, cells, kinds, values, range(nights - 1))
        warm = update_changes(store, dag_id, spec, tracked)  # the previous night's pass
        plant_night_public(store, dag_id, cells, kinds, values, nights - 1)
        t_plant = time.perf_counter() - t0
        with one_core():
            t0 = time.perf_counter()
            hist = history(store, metric=None, dag_id=dag_id, stats=tracked)
            t_read = time.perf_counter() - t0
            t0 = time.perf_counter()
            up = update_changes(store, dag_id, spec, tracked, hist=hist)
            t_update = time.perf_counter() - t0
        store.close()
    print(
        f"  real gate pass on a SQLite store ({len(hist):,} history rows; planting and the "
        f"previous night's pass, not counted: {t_plant:.0f} s, {warm.inserted} change "
        f"points stored then):"
    )
    print(
        f"    history() read {t_read:.2f} s + update_changes {t_update:.2f} s = "
        f"{t_read + t_update:.2f} s  ({up.line()})"
    )
    print(
        "    this figure adds reading the history and writing the store; the <= 2 s goal "
        f"is the detection above ({_met(t_read + t_update, 2)} if it were held to it)"
    )


# -- grouping -------------------------------------------------------------------------------


BUILD_NIGHT, BUILD_CHANGE, BUILD_MODEL = 30, 0.05, "m1"
INFRA_NIGHT, INFRA_CHANGE, INFRA_MACHINE = 45, 0.08, "k2"


def grouping_seed(seed: int, confirm: bool = False) -> dict:
    """One seed of the planted matrix, night by night, ``update_changes`` after each.

    ``confirm``: as a suite with re-tests on (the default) runs it: after each night's pass
    the gate starts the re-tests of new groups, and their follow-up runs report what the
    builds really are (the planted levels, fresh machine noise: ``plant_followup``); a group
    notifies once its re-test confirmed it or could not."""
    import numpy as np

    from accelmatrix.history.change_points.tracking import groups_to_notify, update_changes
    from accelmatrix.history.retests.followup import advance, start_confirmations
    from accelmatrix.history.series.detector import DEFAULT
    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.followup_plan import FOLLOWUP_KEY, Followup
    from accelmatrix.spec.loader import load_suite
    from accelmatrix.spec.suite_parts import HistorySpec
    from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix

    logging.disable(logging.INFO)
    pm = PerfMatrix(
        seed=seed,
        causes=[
            Cause("build", BUILD_NIGHT, BUILD_CHANGE, model=BUILD_MODEL),
            Cause("infrastructure", INFRA_NIGHT, INFRA_CHANGE, machine=INFRA_MACHINE),
        ],
    )
    spec = HistorySpec(confirm={"enabled": confirm})
    tracked = {"step_time": "median"}
    notified: list[dict] = []
    created: dict[int, int] = {}
    followups = 0
    rng = np.random.default_rng(seed + 1000)  # the re-runs' machine noise
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultsStore(f"sqlite:///{tmp}/results.db")
        suite_path = Path(tmp) / f"{pm.dag_id}.yaml"
        suite_path.write_text(pm.suite_yaml())
        suite = load_suite(suite_path)
        queue: list[tuple[str, dict]] = []

        def trigger(run_id: str, conf: dict) -> bool:
            queue.append((run_id, conf))
            return True

        for n in range(pm.nights):
            pm.plant(store, range(n, n + 1))
            up = update_changes(store, pm.dag_id, spec, tracked)
            for g in up.new_groups:
                created.setdefault(g["id"], n)
            due = up.to_notify
            if confirm:
                start_confirmations(store, suite, pm.dag_id, {}, trigger)
                while queue:
                    run_id, conf = queue.pop(0)
                    fu = Followup.model_validate(conf[FOLLOWUP_KEY])
                    pm.plant_followup(store, suite, run_id, fu, rng, now=n)
                    advance(store, suite, pm.dag_id, run_id, fu, {}, trigger)
                    followups += 1
                due = groups_to_notify(store, pm.dag_id, DEFAULT, confirming=True)
            # The groups the gate hands to alerts.deliver_groups; it records notified_at
            # once a sink took the notification.
            for g in due:
                created.setdefault(g.id, n)
                store.save_change_group(pm.dag_id, notified_at=datetime.now(UTC), id=g.id)
                notified.append(
                    {
                        "night": n,
                        "kind": g.kind,
                        "machine": g.machine,
                        "cells": g.cells,
                    }
                )
        groups = store.get_change_groups(pm.dag_id)
        members: dict[int, set[str]] = {}
        for p in store.get_change_points(pm.dag_id):
            if p.group_id is not None:
                members.setdefault(p.group_id, set()).add(p.cell_id)
        store.close()
    build_cells = {pm.cell(BUILD_MODEL, ma) for ma in pm.machines}
    infra_cells = {pm.cell(mo, INFRA_MACHINE) for mo in pm.models}
    final = []
    build_ok = infra_ok = False
    build_delay = infra_delay = None
    for g in groups:
        cells = members.get(g.id, set())  # the members' cells (an emptied group has none)
        final.append(
            {
                "id": g.id,
                "kind": g.kind,
                "direction": g.direction,
                "machine": g.machine,
                "night": (g.logical_date - pm.date(0)).days,
                "cells": sorted(cells),
                "created": created.get(g.id),
                "state": g.state,
            }
        )
        if g.direction != "regression" or not cells:
            continue
        if cells & build_cells and cells <= build_cells:
            build_delay = created.get(g.id, 0) - BUILD_NIGHT
            build_ok = build_ok or (g.kind == "build" and cells == build_cells)
        if cells & infra_cells and cells <= infra_cells:
            infra_delay = created.get(g.id, 0) - INFRA_NIGHT
            infra_ok = infra_ok or (
                g.kind == "infrastructure"
                and g.machine == INFRA_MACHINE
                and len(cells & infra_cells) >= len(pm.models) - 1
            )
    return {
        "seed": seed,
        "followups": followups,
        "notified": notified,
        "final": final,
        "build_ok": build_ok,
        "infra_ok": infra_ok,
        "build_delay": build_delay,
        "infra_delay": infra_delay,
    }


def bench_grouping(seeds: int, workers: int, confirm: bool = False) -> None:
    causes = 2
    print(
        f"== grouping{' with re-tests' if confirm else ' (re-tests off)'}: 4 models x 3 "
        f"machine kinds x 60 nights, build +{BUILD_CHANGE:.0%} "
        f"({BUILD_MODEL}, night {BUILD_NIGHT}), infrastructure +{INFRA_CHANGE:.0%} "
        f"({INFRA_MACHINE}, night {INFRA_NIGHT}); update_changes after every night; "
        f"{seeds} seeds"
    )
    t0 = time.perf_counter()
    run = functools.partial(grouping_seed, confirm=confirm)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(run, range(seeds)))
    else:
        results = [run(s) for s in range(seeds)]
    wall = time.perf_counter() - t0
    ratios = []
    for r in results:
        notes = len(r["notified"])
        ratio = notes / causes
        ratios.append(ratio)
        first_kinds = ", ".join(
            f"n{x['night']}:{x['kind']}{'@' + x['machine'] if x['machine'] else ''}"
            f"[{len(x['cells'])}]"
            for x in r["notified"]
        )
        print(
            f"  seed {r['seed']:2d}: {notes} notification(s) / {causes} causes = {ratio:.2f} "
            f"({_met(ratio, 1.1)}); build group names its cause: {r['build_ok']}, "
            f"infrastructure group: {r['infra_ok']}; delay build {r['build_delay']}, "
            f"infra {r['infra_delay']} night(s); notified as: {first_kinds}"
        )
        for g in r["final"]:
            if not _names_cause(g):
                print(f"           final group {g}")
    met = sum(x <= 1.1 for x in ratios)
    both = sum(r["build_ok"] and r["infra_ok"] for r in results)
    all_ok = sum(
        x <= 1.1 and r["build_ok"] and r["infra_ok"] for x, r in zip(ratios, results, strict=True)
    )
    print(
        f"  notifications / causes: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
        f"seeds meeting <= 1.1: {met}/{seeds}"
    )
    print(f"  seeds where each final group names its cause: {both}/{seeds}")
    print(f"  seeds meeting both: {all_ok}/{seeds}")
    first_kind = Counter((_cause_of(x), x["kind"]) for r in results for x in r["notified"])
    print(
        "  kind of each notification when sent (cause -> kind: count): "
        + ", ".join(f"{c} -> {k}: {v}" for (c, k), v in sorted(first_kind.items()))
    )
    for name, night in (("build", BUILD_NIGHT), ("infra", INFRA_NIGHT)):
        d = []
        for r in results:
            sent = [x["night"] for x in r["notified"] if _cause_of(x) == name]
            if sent:
                d.append(min(sent) - night)
        missing = seeds - len(d)
        print(
            f"  {name}: nights from the cause to its notification: "
            f"{sorted(d)}, median {statistics.median(d) if d else 'n/a'}"
            + (f"; never notified in {missing} seed(s)" if missing else "")
        )
    if confirm:
        runs = [r["followups"] for r in results]
        print(f"  follow-up runs per seed: {runs}, median {statistics.median(runs)}")
    print(f"  ({wall:.0f} s wall, {workers} process(es))")


def _cause_of(x: dict) -> str:
    cells = set(x["cells"])
    if all(f"model={BUILD_MODEL}," in c for c in cells):
        return "build"
    if all(c.endswith(f"machine={INFRA_MACHINE}") for c in cells):
        return "infra"
    return "other"


def _names_cause(g: dict) -> bool:
    if g["direction"] != "regression":
        return False
    if g["kind"] == "build":
        return len(g["cells"]) == 3 and all(f"model={BUILD_MODEL}," in c for c in g["cells"])
    return g["kind"] == "infrastructure" and g["machine"] == INFRA_MACHINE


# -- main -----------------------------------------------------------------------------------


SECTIONS = ("bounds", "maintenance", "gate", "grouping")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller run of every section")
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    ap.add_argument("--rows", type=int, default=None, help="bounds: history rows")
    ap.add_argument("--series", type=int, default=None, help="bounds: series")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seeds", type=int, default=None, help="grouping: seeds")
    ap.add_argument("--workers", type=int, default=2, help="grouping: processes")
    ap.add_argument(
        "--confirm", action="store_true", help="grouping: with re-tests (history.confirm)"
    )
    a = ap.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    q = a.quick
    print(f"bench_history{' --quick (not the goals sizes)' if q else ''}: {', '.join(only)}")
    t0 = time.perf_counter()
    if "bounds" in only:
        bench_bounds(
            a.rows or (100_000 if q else 1_000_000), a.series or (100 if q else 1_000), a.confidence
        )
    if "maintenance" in only:
        bench_maintenance(1_000 if q else 10_000, 365)
    if "gate" in only:
        bench_gate(8 if q else 64, 60, store_pass=True)
    if "grouping" in only:
        bench_grouping(a.seeds or (2 if q else 10), a.workers, confirm=a.confirm)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"total {time.perf_counter() - t0:.0f} s, peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
