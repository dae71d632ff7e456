"""Planner of `workers_started`. Model: accelmatrix.spec.checks.cluster."""

from __future__ import annotations

import re
from typing import Any

from accelmatrix.evaluation.check_plan import CheckPlan, Expect, num
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.cluster import WorkersStartedCheck


def worker_starts(log_lines: Any, pattern: str) -> dict[str, float]:
    """Worker id -> its first logged start time (epoch seconds)."""
    regex = re.compile(pattern)
    starts: dict[str, float] = {}
    for line in log_lines:
        m = regex.search(line)
        if m:
            try:
                starts.setdefault(m.group("worker"), float(m.group("ts")))
            except ValueError:
                continue
    return starts


@planner(WorkersStartedCheck)
def plan_workers_started(c: WorkersStartedCheck, p: CheckPlan, inp: CellInputs) -> None:
    n_col, late_col = f"{p.prefix}__workers_started", f"{p.prefix}__last_start_s"
    p.expected = f"{c.workers} worker(s) started, each within {num(c.within)} s of the job start"
    log_path = inp.outputs.log_path
    if not log_path.is_file():
        p.observed = "log missing"
        p.failure = f"log file {log_path} does not exist (did the workload run?)"
        p.columns = {n_col: None, late_col: None}
    else:
        with log_path.open(encoding="utf-8", errors="replace") as fh:
            starts = worker_starts(fh, c.pattern)
        status = inp.outputs.status or {}
        began = status.get("started_at")
        origin = "job start"
        if not isinstance(began, int | float) and starts:
            began, origin = min(starts.values()), "first worker"
        last = None if not starts or began is None else max(starts.values()) - began
        p.columns = {n_col: len(starts), late_col: last}
        p.observed = f"{len(starts)} worker(s)" + (
            f", last started {num(round(last, 3))} s after the {origin}" if last is not None else ""
        )
        if len(starts) < c.workers:
            p.failure = f"only {len(starts)} of {c.workers} worker(s) logged a start" + (
                f" ({', '.join(sorted(starts))})" if starts else ""
            )
        else:
            slowest = max(starts, key=starts.__getitem__)
            p.failure = (
                f"worker {slowest} started {num(round(last or 0, 3))} s after the {origin}; "
                f"the cutoff is {num(c.within)} s"
            )
        p.success = p.observed
    p.expectations = [
        Expect(n_col, f"workers started >= {c.workers}", min_value=c.workers),
        Expect(
            late_col, f"last start <= {num(c.within)} s after the job start", max_value=c.within
        ),
    ]
