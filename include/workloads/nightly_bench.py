#!/usr/bin/env python3
"""A stand-in for "benchmark the nightly build of DATE", with the noise of a real one.

The nightly_perf suite passes the build under test (``--build nightly-2026-03-01``,
rendered from the DAG run's logical date), so a backfill re-tests each historical build.
Real suites point the image or runtime at that build; this stdlib script simulates one:

* every build has a step time of ``--base-ms`` (4 ms) times a build-to-build noise of
  ``--cv`` (1 %), drawn from the build's name, so re-testing a build lands near where it
  landed before, as a real benchmark does on the same machine;
* each step adds its own jitter (1 %) around the build's level;
* ``--slow-from DATE`` simulates a regression landing in the build of DATE: builds of that
  day and later are ``--slowdown`` (5 %) slower, a step inside the noise band of a
  single night, which is what perf history must find.

It sleeps for each simulated step, so a run takes the time it reports, and prints one
line per step (the suite's ``log_regex`` metric reads every one):

    build nightly-2026-03-01 step 3 step_time: 0.004081s
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--slow-from", default="", help="YYYY-MM-DD: first slow build (simulated)")
    p.add_argument("--slowdown", type=float, default=0.05, help="relative: 0.05 = 5 %% slower")
    p.add_argument("--base-ms", type=float, default=4.0)
    p.add_argument("--cv", type=float, default=0.01, help="build-to-build noise (relative)")
    a = p.parse_args()
    m = re.search(r"(\d{4}-\d{2}-\d{2})", a.build)
    day = m.group(1) if m else ""
    # The build's own level: seeded by its name (not Python's salted hash), so every
    # re-test of a build draws the same level.
    seed = int.from_bytes(hashlib.sha256(a.build.encode()).digest()[:8], "big")
    build_rng = random.Random(seed)
    level = a.base_ms / 1000 * (1 + a.cv * build_rng.gauss(0, 1))
    if a.slow_from and day and day >= a.slow_from:
        level *= 1 + a.slowdown
    step_rng = random.Random()
    for step in range(a.steps):
        step_time = max(0.0, level * (1 + 0.01 * step_rng.gauss(0, 1)))
        time.sleep(step_time)
        print(f"build {a.build} step {step} step_time: {step_time:.6f}s", flush=True)
    print(f"Finished benchmark of {a.build}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
