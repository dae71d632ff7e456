"""Classify every (benchmark, cell, metric) series of a perf history: one vectorised pass.

A series is the values of one metric of one cell of one benchmark over runs, oldest first,
each judged against its bounds (``violated`` = outside [lower, upper]). Verdicts, in the
order they are decided:

``insufficient_data``  fewer than ``min_points`` points in the window
``regression``         the last ``regression_run`` (>= 2) or more points all violate
``flaky``              pass/fail flipped at least ``flaky_flips`` times in the window
``suspicious``         an earlier run of ``suspicious_run`` (>= 3) or more consecutive
                       violations, which has since recovered
``ok``                 none of the above

Why one pandas pass instead of a loop per series: a nightly job classifies thousands of
series over a history of millions of rows (bench/bench_history.py measures it), and a
Python loop per series is ~100x slower than grouped vector operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

SERIES_KEY = ("benchmark", "cell_id", "metric")
STATUSES = ("insufficient_data", "regression", "flaky", "suspicious", "ok")


@dataclass(frozen=True)
class Rules:
    min_points: int = 3
    regression_run: int = 2
    suspicious_run: int = 3
    flaky_flips: int = 3

    def __post_init__(self) -> None:
        if self.regression_run < 2 or self.suspicious_run < 3:
            raise ValueError("regression_run must be >= 2 and suspicious_run >= 3")
        if self.min_points < 1 or self.flaky_flips < 1:
            raise ValueError("min_points and flaky_flips must be >= 1")


def mark_violations(history: pd.DataFrame) -> pd.DataFrame:
    """``history`` with a boolean ``violated`` column: value outside [lower, upper].

    Needs columns ``value``, ``lower``, ``upper`` (NaN bound = unbounded on that side). A
    ``violated`` column already present (e.g. from a pass/fail check) is kept as is.
    """
    if "violated" in history.columns:
        return history
    out = history.copy()
    below = out["value"] < out["lower"].fillna(float("-inf"))
    above = out["value"] > out["upper"].fillna(float("inf"))
    out["violated"] = below | above
    return out


def classify(history: pd.DataFrame, rules: Rules | None = None) -> pd.DataFrame:
    """One row per series: its key, ``status``, ``points``, ``flips``, ``trailing_violations``,
    ``longest_earlier_violations``, ``last_value`` and ``last_time``.

    ``history`` needs the SERIES_KEY columns, ``time`` (sortable: logical date) and either
    ``violated`` or ``value``/``lower``/``upper``.
    """
    import numpy as np
    import pandas as pd

    rules = rules or Rules()
    key = list(SERIES_KEY)
    cols = ["points", "flips", "trailing_violations", "longest_earlier_violations"]
    if history.empty:
        return pd.DataFrame(columns=[*key, "status", *cols, "last_value", "last_time"])
    df = mark_violations(history)
    df = df.sort_values([*key, "time"], kind="mergesort").reset_index(drop=True)
    sid = df.groupby(key, sort=False, observed=True).ngroup().to_numpy()
    v = df["violated"].to_numpy(dtype=bool)
    n = len(df)

    new_series = np.ones(n, dtype=bool)
    new_series[1:] = sid[1:] != sid[:-1]
    changed = np.zeros(n, dtype=bool)
    changed[1:] = (v[1:] != v[:-1]) & ~new_series[1:]
    # Runs of equal pass/fail inside a series: id, length, and whether the run is the last.
    run_id = np.cumsum(new_series | changed) - 1
    run_len = np.bincount(run_id)
    run_viol = np.zeros(run_len.size, dtype=bool)
    run_viol[run_id] = v
    run_sid = np.zeros(run_len.size, dtype=np.int64)
    run_sid[run_id] = sid
    n_series = int(sid.max()) + 1
    last_run_of_series = np.full(n_series, -1, dtype=np.int64)
    np.maximum.at(last_run_of_series, run_sid, np.arange(run_len.size))
    is_last_run = np.zeros(run_len.size, dtype=bool)
    is_last_run[last_run_of_series] = True

    points = np.bincount(sid, minlength=n_series)
    flips = np.bincount(sid, weights=changed, minlength=n_series).astype(np.int64)
    trailing = np.where(run_viol[last_run_of_series], run_len[last_run_of_series], 0)
    earlier = np.zeros(n_series, dtype=np.int64)
    mask = run_viol & ~is_last_run
    np.maximum.at(earlier, run_sid[mask], run_len[mask])

    status = np.full(n_series, "ok", dtype=object)
    status[earlier >= rules.suspicious_run] = "suspicious"
    status[flips >= rules.flaky_flips] = "flaky"
    status[trailing >= rules.regression_run] = "regression"
    status[points < rules.min_points] = "insufficient_data"

    last_idx = np.full(n_series, -1, dtype=np.int64)
    np.maximum.at(last_idx, sid, np.arange(n))
    out = df.loc[last_idx, key].reset_index(drop=True)
    out["status"] = status
    out["points"] = points
    out["flips"] = flips
    out["trailing_violations"] = trailing
    out["longest_earlier_violations"] = earlier
    out["last_value"] = df["value"].to_numpy()[last_idx] if "value" in df else np.nan
    out["last_time"] = df["time"].to_numpy()[last_idx]
    return out
