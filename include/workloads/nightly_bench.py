#!/usr/bin/env python3
"""A stand-in for "benchmark the nightly build of DATE": times a small fixed computation.

The nightly_perf suite passes the build under test (``--build nightly-2026-03-01``,
rendered from the DAG run's logical date), so a backfill re-tests each historical build.
Real suites point the image or runtime at that build; this stdlib script only prints it,
and ``--slow-from DATE`` simulates a regression landing in the build of DATE (builds of
that day and later take ``--slowdown`` extra seconds per step), which is how the example
and its test show regression detection over a backfill.

    build nightly-2026-03-01 step 3 step_time: 0.002100s
"""

from __future__ import annotations

import argparse
import re
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--slow-from", default="", help="YYYY-MM-DD: first slow build (simulated)")
    p.add_argument("--slowdown", type=float, default=0.05)
    a = p.parse_args()
    m = re.search(r"(\d{4}-\d{2}-\d{2})", a.build)
    day = m.group(1) if m else ""
    extra = a.slowdown if a.slow_from and day and day >= a.slow_from else 0.0
    for step in range(a.steps):
        t0 = time.perf_counter()
        sum(i * i for i in range(20_000))
        time.sleep(0.002 + extra)
        print(f"build {a.build} step {step} step_time: {time.perf_counter() - t0:.6f}s", flush=True)
    print(f"Finished benchmark of {a.build}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
