#!/usr/bin/env python
"""What evaluating costs: GE import, evaluate_cell cold/warm, with/without Data Docs, a
typical training cell's metrics table, and the run's table of 1,024 cells at the gate.

Why: every mapped ``evaluate`` task runs in a fresh worker process, so the cold figure (GE
import included) is what each cell pays in production; the warm figure is the marginal cost
when cells share a process (tests, ``dag.test``). Prints figures; it is not a test.

    .venv/bin/python bench/bench_evaluation.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"

# The smoke suite's checks plus a log_not_contains and a final_loss: 8 checks, one per type.
CHECKS = [
    {"type": "exit_status", "expected": 0},
    {"type": "log_contains", "pattern": "Finished training run"},
    {"type": "log_not_contains", "pattern": r"NCCL timeout|Traceback \(most recent"},
    {"type": "artifact_count", "glob": "out/*.pt.trace.json", "count": 1},
    {"type": "metric_between", "name": "final loss below 1.5", "metric": "loss", "max": 1.5},
    {"type": "final_loss", "target": 0.1, "tolerance": 0.5},
    {"type": "loss_decreasing", "window": 3},
    {
        "type": "step_time_within_bounds",
        "bounds_file": "bounds/step_time_bounds.yaml",
        "benchmark": "tiny-mlp",
    },
]
STEPS = 500

# A typical training cell: 1,000 steps x 5 metrics, 8 checks judged by Great Expectations
# over its metrics table (every step, a median, the last step, completeness), Data Docs on.
TABLE_STEPS = 1000
TABLE_METRICS = ("loss", "step_time", "learning_rate", "grad_norm", "tokens_per_s")
TABLE_CHECKS = [
    {"type": "exit_status", "expected": 0},
    {"type": "log_contains", "pattern": "Finished training run"},
    {"type": "steps_complete", "metrics": list(TABLE_METRICS), "steps": TABLE_STEPS},
    {"type": "metric_between", "metric": "loss", "min": 0, "max": 10, "reduce": "each"},
    {"type": "metric_between", "metric": "grad_norm", "max": 5, "reduce": "each", "mostly": 0.99},
    {"type": "metric_between", "metric": "tokens_per_s", "min": 1000, "reduce": "median"},
    {"type": "final_loss", "target": 0.1, "tolerance": 0.5},
    {
        "type": "step_time_within_bounds",
        "bounds_file": "bounds/step_time_bounds.yaml",
        "benchmark": "tiny-mlp",
        "mostly": 0.95,
        "skip_first": 5,
    },
]
RUN_CELLS = 1024


def _write_cell(base: Path) -> dict:
    """A realistic cell: 500-step log and loss series, a trace file, 5 profiled steps."""
    files = base / "files" / "out"
    files.mkdir(parents=True)
    (files / "trace.pt.trace.json").write_text("{}")
    (files / "metrics.jsonl").write_text("{}\n" * STEPS)
    losses = [1.0 / (1 + 0.05 * i) for i in range(STEPS)]
    lines = [f"step {i} loss: {v:.6f} step_time: 0.0004s" for i, v in enumerate(losses)]
    (base / "output.log").write_text("\n".join([*lines, "Finished training run", ""]))
    metrics = [
        {"name": "loss", "value": v, "step": i, "unit": None, "source": "jsonl"}
        for i, v in enumerate(losses)
    ]
    metrics += [
        {"name": "step_time", "value": 0.0004, "step": i, "unit": "s", "source": "trace"}
        for i in range(3, 8)
    ]
    return {"files_dir": base / "files", "log_path": base / "output.log", "metrics": metrics}


def _write_training_cell(base: Path) -> dict:
    """1,000 steps of 5 metrics, as collect leaves them."""
    import math

    files = base / "files"
    files.mkdir(parents=True)
    (base / "output.log").write_text("step 999\nFinished training run\n")
    values = {
        "loss": lambda i: 2.0 * math.exp(-i / 300) + 0.1,
        "step_time": lambda i: 0.0004,
        "learning_rate": lambda i: 1e-3,
        "grad_norm": lambda i: 1.0,
        "tokens_per_s": lambda i: 5000.0,
    }
    metrics = [
        {"name": m, "value": values[m](i), "step": i, "unit": None, "source": "jsonl"}
        for i in range(TABLE_STEPS)
        for m in TABLE_METRICS
    ]
    return {"files_dir": files, "log_path": base / "output.log", "metrics": metrics}


def _evaluations(
    checks: list, outputs: object, base: Path, name: str, repeat: int, *, docs: bool = True
) -> list[float]:
    """Seconds of 1 + ``repeat`` evaluations of one cell in this process (the first cold)."""
    from accelmatrix.evaluation import evaluate_cell

    times = []
    for i in range(1 + repeat):
        started = time.perf_counter()
        report = evaluate_cell(
            checks,
            outputs,  # type: ignore[arg-type]
            include_dir=ROOT / "include",
            data_docs_dir=base / f"docs{i}" if docs else None,
            suite_name=f"bench.{name}{i}",
        )
        times.append(time.perf_counter() - started)
        if not report.passed:
            raise SystemExit(f"benchmark cell should pass:\n{report.format_table()}")
    return times


def _child_training(repeat: int) -> None:
    sys.path.insert(0, str(PLUGINS))
    from accelmatrix.evaluation import CellOutputs
    from accelmatrix.spec.checks import parse_checks

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outputs = CellOutputs(
            status={"exit_code": 0, "timed_out": False}, **_write_training_cell(base / "cell")
        )
        times = _evaluations(parse_checks(TABLE_CHECKS), outputs, base, "training", repeat)
    print(json.dumps({"cold": times[0], "warm_median": statistics.median(times[1:])}))


def _child_run(repeat: int) -> None:
    sys.path.insert(0, str(PLUGINS))
    from accelmatrix.contracts.run_records import CellRecord, CheckRecord
    from accelmatrix.evaluation.gx_suite import import_gx
    from accelmatrix.evaluation.run_table import validate_run
    from accelmatrix.spec.run_checks import CellsAgreeCheck

    import_gx()
    planned = [
        {
            "id": f"model=m{i % 16},runtime=r{i // 16}",
            "axes": {"model": f"m{i % 16}", "runtime": f"r{i // 16}"},
            "machine_spec": {"backend": "local"},
        }
        for i in range(RUN_CELLS)
    ]
    rows = [
        CellRecord(
            dag_id="bench",
            run_id="run",
            cell_id=c["id"],
            state="passed",
            exit_code=0,
            resource_held_seconds=12.0,
        )
        for c in planned
    ]
    checks = [
        CheckRecord(
            dag_id="bench",
            run_id="run",
            cell_id=c["id"],
            check_name=n,
            passed=True,
            metric=m,
            value=0.01,
        )
        for c in planned
        for n, m in (("exit_status", None), ("step_time_within_bounds", "step_time"))
    ]
    agree = [CellsAgreeCheck(by=["model"], within=1.2)]
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 + repeat):
            started = time.perf_counter()
            result = validate_run(
                planned,
                rows,
                checks,
                run_checks=agree,
                suite_name=f"bench.run{i}",
                data_docs_dir=Path(tmp) / f"docs{i}",
            )
            times.append(time.perf_counter() - started)
            if not result.passed:
                raise SystemExit(f"benchmark run should pass: {result.failures}")
    print(json.dumps({"cold": times[0], "warm_median": statistics.median(times[1:])}))


def _child(docs: bool, repeat: int) -> None:
    """Runs in a fresh interpreter so 'cold' really is the first call in the process."""
    sys.path.insert(0, str(PLUGINS))
    from accelmatrix.evaluation import CellOutputs
    from accelmatrix.spec.checks import parse_checks

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        cell = _write_cell(base / "cell")
        outputs = CellOutputs(status={"exit_code": 0, "timed_out": False}, **cell)
        times = _evaluations(parse_checks(CHECKS), outputs, base, "cell", repeat, docs=docs)
        docs_bytes = sum(f.stat().st_size for f in (base / "docs0").rglob("*")) if docs else 0
    print(
        json.dumps(
            {
                "cold": times[0],
                "warm": times[1],
                "warm_median": statistics.median(times[1:]),
                "rss_before_mb": rss_before,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "docs_mb": docs_bytes / 2**20,
            }
        )
    )


def _run(args: list[str]) -> str:
    # Fixed interpreter and arguments; a fresh process per measurement.
    return subprocess.run(  # noqa: S603
        [sys.executable, *args], capture_output=True, text=True, check=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="warm calls per process")
    parser.add_argument(
        "--child", choices=("plain", "docs", "training", "run"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child == "training":
        _child_training(args.repeat)
        return
    if args.child == "run":
        _child_run(args.repeat)
        return
    if args.child:
        _child(args.child == "docs", args.repeat)
        return

    code = (
        "import time; t = time.perf_counter(); import great_expectations; "
        "print(time.perf_counter() - t)"
    )
    gx_import = float(_run(["-c", code]).strip().splitlines()[-1])
    runs = {
        mode: json.loads(_run([__file__, "--child", mode, "--repeat", str(args.repeat)]))
        for mode in ("plain", "docs")
    }
    print(f"evaluation of one {len(CHECKS)}-check cell ({STEPS}-step log and loss series)")
    print(f"  import great_expectations (fresh process): {gx_import:6.2f} s")
    for mode, label in (("plain", "without Data Docs"), ("docs", "with Data Docs")):
        r = runs[mode]
        print(f"  evaluate_cell {label}:")
        print(f"    cold (1st call, GE import included): {r['cold']:6.2f} s")
        print(f"    warm (2nd call):                     {r['warm']:6.2f} s")
        print(f"    warm (median of {args.repeat}):                {r['warm_median']:6.2f} s")
        print(
            f"    peak RSS: {r['peak_rss_mb']:.0f} MiB "
            f"(before the first call: {r['rss_before_mb']:.0f} MiB)"
        )
        if r["docs_mb"]:
            print(f"    Data Docs size per cell: {r['docs_mb']:.1f} MiB")
    training = json.loads(_run([__file__, "--child", "training", "--repeat", str(args.repeat)]))
    print(
        f"typical training cell: {TABLE_STEPS} steps x {len(TABLE_METRICS)} metrics, "
        f"{len(TABLE_CHECKS)} checks over its metrics table, Data Docs on (goal <= 0.5 s warm)"
    )
    print(f"    cold (1st call, GE import included): {training['cold']:6.2f} s")
    print(f"    warm (median of {args.repeat}):                {training['warm_median']:6.2f} s")
    run = json.loads(_run([__file__, "--child", "run", "--repeat", str(args.repeat)]))
    print(
        f"run table at the gate: {RUN_CELLS} cells, 3 run expectations + cells_agree, "
        "Data Docs on (goal <= 2 s)"
    )
    print(f"    first (GE imported before):          {run['cold']:6.2f} s")
    print(f"    warm (median of {args.repeat}):                {run['warm_median']:6.2f} s")


if __name__ == "__main__":
    main()
