"""DAG parse time: accelmatrix's DAG file versus a DAG file that only imports airflow.sdk.

Each measurement is a fresh Python process (cold imports, like the DAG processor's parse
of a changed file): it imports Airflow's DagBag, then times DagBag parsing one file. The
figure that matters is the difference to the baseline file: what accelmatrix adds.
Goal: <= 0.5 s above the baseline.

    python bench/bench_parse.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASELINE = """
from datetime import datetime
from airflow.sdk import DAG, task

with DAG("baseline", start_date=datetime(2026, 1, 1), schedule=None):
    @task
    def noop():
        pass
    noop()
"""

PROBE = r"""
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
path = sys.argv[1]
t0 = time.perf_counter()
bag = DagBag(dag_folder=path, safe_mode=False)
dt = time.perf_counter() - t0
heavy = sorted(m for m in ("great_expectations", "pandas", "torch", "sqlalchemy.orm",
                           "kubernetes", "googleapiclient") if m in sys.modules)
print(json.dumps({"seconds": dt, "dags": len(bag.dags), "errors": len(bag.import_errors),
                  "heavy_modules_loaded": heavy}))
"""


def measure(path: Path, runs: int) -> dict:
    env = dict(os.environ)
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    env["PYTHONPATH"] = str(ROOT / "plugins")
    samples, last = [], {}
    for _ in range(runs):
        out = subprocess.run(  # noqa: S603
            [sys.executable, "-c", PROBE, str(path)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        last = json.loads(out.stdout.strip().splitlines()[-1])
        samples.append(last["seconds"])
    return {**last, "median": statistics.median(samples), "min": min(samples)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base_file = Path(tmp) / "baseline_dag.py"
        base_file.write_text(BASELINE)
        base = measure(base_file, args.runs)
        print(f"{'DAG file':40} {'DAGs':>5} {'median s':>9} {'min s':>7} {'above base':>10}")
        print(
            f"{'baseline (imports airflow.sdk only)':40} {base['dags']:>5} "
            f"{base['median']:>9.3f} {base['min']:>7.3f} {'-':>10}"
        )
        for f in sorted((ROOT / "dags").glob("*.py")):
            m = measure(f, args.runs)
            print(
                f"{f.name:40} {m['dags']:>5} {m['median']:>9.3f} {m['min']:>7.3f} "
                f"{m['median'] - base['median']:>+10.3f}"
                + (f"  import errors: {m['errors']}" if m["errors"] else "")
            )
            print(f"  heavy modules loaded while parsing: {m['heavy_modules_loaded'] or 'none'}")


if __name__ == "__main__":
    main()
