#!/usr/bin/env python3
"""The perf-history pipeline replayed night by night, as Airflow feeds it, with known answers.

bench_confirm and bench_changepoints judge the detector and the re-test on series handed to
them whole. Users read what the pipeline makes of the nights as they arrive: each nightly
run's gate looks at the history it finds when it ends
(``history.change_points.history_pass``: the window's change points, the candidates and the
newest-point rule, the re-tests), the re-test's sessions run and are judged at their own
gates (``history.retests.followup.advance``), and the maintenance DAG looks at the whole
history now and then. This bench drives that real code (a real SQLite results store, the
planted sessions' logs read back by the session reader) in the orders Airflow produces:

* ``in_order``: one night after the other (cron);
* ``backfill2``: a backfill with two runs at a time, each pair finishing in either order;
* ``today_first``: unpausing runs today's build first, then the backfill, in order;
* ``today_backfill2``: today's build first, then the backfill two at a time;
* ``rerun``: a night after the step fails and is re-run three nights later;
* ``missing``: a night after the step never arrives.

Each trial is a generated suite: three models on one machine kind, one of them a step of
2-10 % (1.5-5 sigma of its night-to-night noise) from a random night, builds that differ
by themselves (each build of each model at its own fixed level, uniform within +-0-2 %),
run noise 1-4 %, 5-14 nights before the step and 3-7 after. The same trials (same seeds)
run in every order.

Printed per order and step size (in sigmas of the night-to-night noise): offline (the gate's
detectors, given the whole series at the end in one piece, place a regression within a
night of the step: what the pipeline should match), found (a change on the stepped series), confirmed (its re-test reproduced it), the first bad build the
story names (the change's build, which a re-test's culprit moves: ``history.retests.placement``)
right / a neighbour / wrong / none, stories that name two builds, pages on the noise
series per 1,000 points, re-tests per 1,000 points, and the gate's cost per night.

    .venv/bin/python bench/bench_replay.py                 # 24 trials per order (~3 min)
    .venv/bin/python bench/bench_replay.py --trials 120    # the figures in BENCHMARKS.md
    .venv/bin/python bench/bench_replay.py --issue --trials 100 --orders today_backfill2
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "tests"))

from accelmatrix_testkit.replay import ORDERS, issue_scenario, scenario, trial  # noqa: E402


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:5.1f} %" if n else "    - "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument(
        "--issue",
        action="store_true",
        help="the case measured on a real Airflow only (14 builds, 6 %% step from the 9th, "
        "2 %% run noise, builds +-1.5 %%), the run noise drawn anew per trial",
    )
    ap.add_argument(
        "--lag",
        type=int,
        default=0,
        help="nightly runs that end while a re-test session runs (0: none)",
    )
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    make = issue_scenario if a.issue else scenario
    scenarios = [make(a.seed * 100_003 + k) for k in range(a.trials)]
    t0 = time.perf_counter()
    what = (
        "draws of the case measured on a real Airflow (14 builds, 6 % step from the 9th, "
        "2 % run noise, builds +-1.5 %)"
        if a.issue
        else "generated suites (3 models, one stepped 2-10 % = 1.5-5 sigma, builds +-0-2 % by "
        "themselves, run noise 1-4 %, 5-14 nights before, 3-7 after)"
    )
    print(f"{a.trials} {what} per order; sessions end {a.lag} night(s) later\n")
    head = (
        f"{'order':12s} {'step':9s} {'n':>4s} {'offline':>7s} {'found':>7s} {'confirmed':>9s} "
        f"{'right':>7s} {'neighbour':>9s} {'wrong':>7s} {'none':>7s} {'2 builds':>8s}"
    )
    print(head)
    summary = []
    for order in a.orders.split(","):
        res = [(sc, trial(sc, order, lag=a.lag)) for sc in scenarios]
        for name, lo, hi in (("<3 sigma", 0, 3.0), (">=3 sigma", 3.0, 99.0)):
            rs = [o for sc, o in res if lo <= sc.sigmas < hi]
            n = len(rs)
            print(
                f"{order:12s} {name:9s} {n:4d} {pct(sum(o.offline for o in rs), n)} "
                f"{pct(sum(o.found for o in rs), n)} "
                f"{pct(sum(o.confirmed for o in rs), n):>9s} "
                f"{pct(sum(o.named == 'right' for o in rs), n)} "
                f"{pct(sum(o.named == 'neighbour' for o in rs), n):>9s} "
                f"{pct(sum(o.named == 'wrong' for o in rs), n)} "
                f"{pct(sum(o.named == 'none' for o in rs), n)} "
                f"{pct(sum(o.two_builds for o in rs), n):>8s}"
            )
        outs = [o for _sc, o in res]
        pages = sum(o.noise_pages for o in outs)
        noise = sum(o.noise_points for o in outs)
        tests = sum(o.retests for o in outs)
        pts = sum(o.points for o in outs)
        gate = [s for o in outs for s in o.gate_s]
        errors = sum(o.errors for o in outs)
        summary.append(
            f"{order:12s} pages on noise {1000 * pages / noise:5.2f} per 1,000 points; "
            f"re-tests {1000 * tests / pts:5.1f} per 1,000 points; gate pass median "
            f"{1000 * statistics.median(gate):.0f} ms, p95 {1000 * np.percentile(gate, 95):.0f} ms; "
            f"{errors} gate error(s)"
        )
    print()
    print("\n".join(summary))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
