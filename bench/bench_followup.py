#!/usr/bin/env python
"""Confirm and bisect on a real Airflow: what a re-test session costs against running the
same samples directly.

One real Airflow (scheduler, dag-processor, triggerer, api-server; SQLite; the
PreloadedLocalExecutor) started by ``accelmatrix_testkit.AirflowStack`` runs the
``weekly_perf`` example with 0.5 s workloads (5 steps of ``--step-ms`` 100). Eight good
Mondays of history are written to the results store first (each from a direct run of the
workload on its build, as its nightly would have measured it), then one run of the 9th
Monday is triggered with a 5 % regression landing in the Thursday build before it. Its
gate sees the newest point stand out and starts the re-test: one session run of the
suite, one machine for the suspect cell, the two Mondays and the six days between
interleaved on it.

Printed: the time from the end of the gate that saw the candidate to the end of the last
session run (the culprit stored), and the time to run the same samples directly, one after
another, with the same builds and arguments (``subprocess``, no Airflow), and their ratio
(goal: <= 1.5x); and the machines provisioned (goal: one per suspect cell). Prints
figures; it is not a test.

    .venv/bin/python bench/bench_followup.py [--step-ms 100] [--parallelism 4] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "tests"))  # the test kit: accelmatrix_testkit

from accelmatrix import settings  # noqa: E402
from accelmatrix.backends.interleave import MARK  # noqa: E402
from accelmatrix.contracts.run_records import MetricValue  # noqa: E402
from accelmatrix_testkit import AirflowStack  # noqa: E402

DAG = "weekly_perf"
BENCH = ROOT / "include" / "workloads" / "nightly_bench.py"
STEP = re.compile(r"step (\d+) step_time: ([0-9.]+)s")


def workload(build: str, slow_from: str, step_ms: float) -> list[str]:
    return [
        sys.executable,
        str(BENCH),
        "--build",
        build,
        "--slow-from",
        slow_from,
        "--base-ms",
        str(step_ms),
    ]


def run_direct(build: str, slow_from: str, step_ms: float) -> list[float]:
    out = subprocess.run(  # noqa: S603 (argv list)
        workload(build, slow_from, step_ms), capture_output=True, text=True, check=True
    ).stdout
    return [float(m.group(2)) for m in STEP.finditer(out)]


def plant_history(store, mondays: list[date], slow_from: str, step_ms: float) -> None:
    """The good Mondays as their nightly runs would have stored them."""
    for d in mondays:
        ld = datetime(d.year, d.month, d.day, tzinfo=UTC)
        run_id = f"scheduled__{ld.isoformat()}"
        build = f"nightly-{d.isoformat()}"
        store.upsert_run(
            DAG,
            run_id,
            suite=DAG,
            logical_date=ld,
            run_type="scheduled",
            runtime_version=build,
            started_at=ld,
            state="passed",
        )
        store.upsert_cell(
            DAG,
            run_id,
            "model=small",
            axes={"model": "small"},
            machine="cpu-small",
            backend="local",
            state="passed",
        )
        steps = run_direct(build, slow_from, step_ms)
        store.replace_metrics(
            DAG,
            run_id,
            "model=small",
            [MetricValue(name="step_time", value=v, step=i) for i, v in enumerate(steps)],
        )


def ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    a = ap.parse_args()
    from accelmatrix.results.store import ResultsStore

    tmp = Path(tempfile.mkdtemp(prefix="bench-followup-"))
    include = tmp / "include"
    shutil.copytree(ROOT / "include", include, ignore=shutil.ignore_patterns("__pycache__"))
    suites = tmp / "suites"
    suites.mkdir()
    shutil.copy(ROOT / "include" / "suites" / f"{DAG}.yaml", suites / f"{DAG}.yaml")
    today = datetime.now(UTC).date()
    last_monday = today - timedelta(days=today.weekday() or 7)
    mondays = [last_monday - timedelta(weeks=8 - k) for k in range(9)]
    slow = (mondays[7] + timedelta(days=3)).isoformat()
    home = tmp / "airflow"
    try:
        with AirflowStack(
            home=home,
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            parallelism=a.parallelism,
            env_extra={
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                "ACCELMATRIX_INCLUDE_DIR": str(include),
            },
        ) as stack:
            stack.create_pool("accelmatrix_cpu_small", a.parallelism, include_deferred=True)
            stack.wait_for_dag(DAG)
            store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
            plant_history(store, mondays[:8], slow, a.step_ms)
            ld = datetime(mondays[8].year, mondays[8].month, mondays[8].day, tzinfo=UTC)
            run = stack.api(
                "POST",
                f"dags/{DAG}/dagRuns",
                json={
                    "logical_date": ld.isoformat(),
                    "conf": {"slow_from": slow, "step_ms": a.step_ms},
                },
            )
            t0 = time.monotonic()
            while True:
                retests = store.get_confirmations(DAG)
                if retests and all(r.state not in ("confirming", "bisecting") for r in retests):
                    runs = stack.api("GET", f"dags/{DAG}/dagRuns", params={"limit": 100})
                    if all(r["state"] in ("success", "failed") for r in runs["dag_runs"]):
                        break
                if time.monotonic() - t0 > 3600:
                    raise TimeoutError(json.dumps([(r.id, r.state) for r in retests]))
                time.sleep(2)
            (retest,) = retests
            gate = next(
                t for t in stack.task_instances(DAG, run["dag_run_id"]) if t["task_id"] == "gate"
            )
            by_id = {r["dag_run_id"]: r for r in runs["dag_runs"]}
            ends = [ts(by_id[r]["end_date"]) for r in retest.run_ids]
            t_airflow = max(ends) - ts(gate["end_date"])
            cells = [c.cell_id for r in retest.run_ids for c in store.get_cells(DAG, r)]
            # Every sample the sessions ran, in their order (the session logs' markers).
            samples = []
            for r in retest.run_ids:
                for cid in (c.cell_id for c in store.get_cells(DAG, r)):
                    log = (
                        home / "accelmatrix" / "artifacts" / settings.safe_name(DAG)
                        / settings.safe_name(r) / settings.safe_name(cid) / "output.log"
                    )  # fmt: skip
                    for line in log.read_text().splitlines():
                        if line.startswith(MARK) and '"begin"' in line:
                            samples.append(json.loads(line[len(MARK) :])["build"])
            store.close()
        t = time.perf_counter()
        for build in samples:
            run_direct(build, slow, a.step_ms)
        t_direct = time.perf_counter() - t
        print(
            f"re-test: {retest.state}, culprit {retest.culprit} (slow from {slow}), "
            f"{len(retest.run_ids)} session run(s), {len(cells)} machine(s) provisioned for "
            f"1 suspect cell, {len(samples)} samples of {5 * a.step_ms / 1000:.2f} s"
        )
        print(
            f"gate end -> culprit stored: {t_airflow:.0f} s on Airflow; the same samples run "
            f"directly one after another: {t_direct:.0f} s; ratio {t_airflow / t_direct:.2f} "
            f"(goal <= 1.5: {'met' if t_airflow / t_direct <= 1.5 else 'NOT met'})"
        )
        print(f"(Airflow up in {stack.startup_seconds:.0f} s; parallelism {a.parallelism})")
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
