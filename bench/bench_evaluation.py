#!/usr/bin/env python
"""What evaluating one cell costs: GE import, evaluate_cell cold/warm, with/without Data Docs.

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


def _child(docs: bool, repeat: int) -> None:
    """Runs in a fresh interpreter so 'cold' really is the first call in the process."""
    sys.path.insert(0, str(PLUGINS))
    from accelmatrix.evaluation import CellOutputs, evaluate_cell
    from accelmatrix.spec.checks import parse_checks

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        cell = _write_cell(base / "cell")
        outputs = CellOutputs(status={"exit_code": 0, "timed_out": False}, **cell)
        checks = parse_checks(CHECKS)
        times = []
        for i in range(1 + repeat):
            started = time.perf_counter()
            report = evaluate_cell(
                checks,
                outputs,
                include_dir=ROOT / "include",
                data_docs_dir=base / f"docs{i}" if docs else None,
                suite_name=f"bench.cell{i}",
            )
            times.append(time.perf_counter() - started)
            if not report.passed:
                raise SystemExit(f"benchmark cell should pass:\n{report.format_table()}")
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
    parser.add_argument("--child", choices=("plain", "docs"), help=argparse.SUPPRESS)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
