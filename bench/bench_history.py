"""Bounds re-computation + classification over a large synthetic perf history.

Goal (issue 6): 1,000 series over a 1,000,000-row history in <= 10 s on the project
machine. The history has the columns ``history.frame.history`` returns and
``history.regression.classify`` reads (benchmark, cell_id, metric, time, value, lower,
upper); 100 benchmarks x 10 cells = 1,000 series of 1,000 runs each, some regressed,
flaky or drifting, so every verdict occurs. Prints seconds per phase and peak RSS.

    python bench/bench_history.py [--rows 1000000] [--series 1000]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--series", type=int, default=1_000)
    ap.add_argument("--confidence", type=float, default=0.95)
    a = ap.parse_args()

    t0 = time.perf_counter()
    import pandas  # noqa: F401 - counted apart from the work
    import scipy.stats  # noqa: F401

    from accelmatrix.history.bounds_job import bounds_table
    from accelmatrix.history.regression import Rules, classify

    t_import = time.perf_counter() - t0
    h = synthetic(a.rows, a.series)
    t_gen = time.perf_counter() - t0 - t_import

    t1 = time.perf_counter()
    # Bounds per series (what re-centering computes per benchmark, here per series so the
    # work is 1,000 groups over all 1,000,000 rows).
    h["series"] = h["benchmark"].astype(str) + "|" + h["cell_id"].astype(str)
    bounds = bounds_table(h, a.confidence, by="series")
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


if __name__ == "__main__":
    main()
