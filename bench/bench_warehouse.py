#!/usr/bin/env python3
"""The warehouse export against the BigQuery emulator (bqemulator on loopback): time and
memory of exporting one run, for a 64-cell run (goal: <= 5 s) and a 1,024-cell run (goal:
its rows in one load job), and the rows counted in the warehouse afterwards (goal: no
duplicated and no missing row after every repeat).

Each run has 4 metric points and 2 check verdicts per cell (a 1,024-cell run: 7,169 rows).
The first export of a fresh dataset also creates the tables and views: it is reported
apart ("first"); the repeats re-export the same run (each replaces it), and the median is
the figure. Memory: Python's peak allocation during one repeat (tracemalloc: collecting the
rows from the store, encoding, uploading) and the process's peak RSS at the end. "diff":
rows in the warehouse minus rows sent (duplicated if above 0, missing if below).

    .venv/bin/python bench/bench_warehouse.py            # 64 and 1,024 cells, 3 repeats (~1 min)
    .venv/bin/python bench/bench_warehouse.py --long     # also 4,096 cells, 7 repeats
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "tests")]

from accelmatrix.results.store import ResultsStore  # noqa: E402
from accelmatrix.warehouse.config import WarehouseConfig  # noqa: E402
from accelmatrix.warehouse.export import Warehouse, collect  # noqa: E402
from accelmatrix_testkit.bq_emulator import PROJECT, BigQueryEmulator  # noqa: E402
from accelmatrix_testkit.warehouse_runs import expected_rows, fill_run  # noqa: E402

NIGHT = datetime(2026, 11, 20, 2, 0, tzinfo=UTC)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="add 4,096 cells; 7 repeats")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args()
    sizes = [64, 1024, 4096] if args.long else [64, 1024]
    repeats = args.repeats or (7 if args.long else 3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-warehouse-"))
    store = ResultsStore(f"sqlite:///{tmp / 'results.db'}")
    for n in sizes:
        fill_run(store, "bench", f"cells{n}", cells=n, logical_date=NIGHT, failed=frozenset({1}))
    print(f"{'cells':>6} {'rows':>6} {'first s':>8} {'median s':>9} {'max s':>6} "
          f"{'load jobs':>9} {'peak MB':>8} {'in warehouse':>13} {'diff':>5}")  # fmt: skip
    failed = False
    with BigQueryEmulator() as bq:
        for n in sizes:
            config = WarehouseConfig(
                dataset=f"bench_{n}", project=PROJECT, endpoint=bq.endpoint, deadline_s=120
            )
            wh = Warehouse(config)
            key = [("bench", f"cells{n}")]
            times, jobs, peaks = [], set(), []
            for i in range(repeats + 1):
                tracemalloc.start()
                t0 = time.perf_counter()
                result = wh.write(collect(store, key))
                took = time.perf_counter() - t0
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
                jobs.add(result.load_jobs)
                if i:
                    times.append(took)
                    peaks.append(peak)
                else:  # tables and views made, the client's modules imported
                    first = took
            want = expected_rows(n)
            got = {t: wh.count(t, f"run_id = 'cells{n}'") for t in want}
            diff = sum(got.values()) - sum(want.values())  # duplicated (+) or missing (-)
            rows = sum(want.values())
            print(f"{n:>6} {rows:>6} {first:>8.2f} {statistics.median(times):>9.2f} "
                  f"{max(times):>6.2f} {','.join(map(str, sorted(jobs))):>9} "
                  f"{max(peaks):>8.1f} {sum(got.values()):>13} {diff:>5}")  # fmt: skip
            failed |= got != want or jobs != {1}
            if n == 64 and statistics.median(times) > 5.0:
                failed = True
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS: {rss:.0f} MB (the store, the client and every export above)")
    print("goals: 64 cells <= 5 s; one load job per run; rows in warehouse == rows sent:",
          "NOT MET" if failed else "met")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
