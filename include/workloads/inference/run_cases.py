"""Replay a golden case file against the running server and judge every case.

    run_cases.py --cases cases/tiny-gen.yaml --port-file ${work_dir}/server.port \
        --num-shard 2 --strategy approximate --epsilon 0.01 --out-dir out

Prints the case plan before (what runs, what is skipped and why) and the result table
after; writes out/results.jsonl (one row per case and variant: name, variant, status,
passed, reason) and out/case_metrics.json (counts and latency) for the suite's checks.
Exits 0 when it could run the cases, whatever their verdict: the `golden_cases` check
decides pass/fail from results.jsonl, so a failing case is reported as a failed check with
its name and first difference, not as a crashed workload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client import call  # noqa: E402
from golden import STRATEGIES, CaseResult, compare, load_cases, plan_cases  # noqa: E402


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "-" * max(len(x) for x in lines))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, type=Path)
    ap.add_argument("--port-file", required=True, type=Path)
    ap.add_argument("--num-shard", type=int, default=1)
    ap.add_argument("--strategy", choices=STRATEGIES, default="approximate")
    ap.add_argument("--epsilon", type=float, default=1e-2)
    ap.add_argument("--threshold", type=float, default=0.90)
    ap.add_argument(
        "--stream", default="true", help="also run the [stream] variant of unary cases (true/false)"
    )
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args(argv)

    port = int(args.port_file.read_text().strip())
    planned = plan_cases(
        load_cases(args.cases), num_shard=args.num_shard, stream=args.stream.lower() == "true"
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:  # noqa: S310
        health = json.loads(r.read())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "server_health.json").write_text(json.dumps(health, indent=1))
    print(f"server: {json.dumps(health, sort_keys=True)}")
    print(f"Case plan: {args.cases.name} against 127.0.0.1:{port}, strategy {args.strategy}")
    print(
        table(
            [("case", "action")]
            + [
                (
                    p.id,
                    f"skip: {p.skip_reason}"
                    if p.skip_reason
                    else "run" + ("" if p.check else " (skip_check: not compared)"),
                )
                for p in planned
            ]
        ),
        flush=True,
    )

    results: list[CaseResult] = []
    for p in planned:
        if p.skip_reason:
            results.append(CaseResult(p.name, p.variant, "skipped", True, p.skip_reason))
            continue
        t0 = time.perf_counter()
        try:
            actual = call(port, p.case, p.variant)
        except (OSError, ValueError) as e:
            actual = {"error": {"code": "TRANSPORT", "message": f"{type(e).__name__}: {e}"}}
        dt = time.perf_counter() - t0
        diff = compare(
            p.case, actual, strategy=args.strategy, epsilon=args.epsilon, threshold=args.threshold
        )
        if not p.check:
            results.append(CaseResult(p.name, p.variant, "unchecked", True, diff or "", dt))
        elif diff:
            results.append(CaseResult(p.name, p.variant, "failed", False, diff, dt))
        else:
            results.append(CaseResult(p.name, p.variant, "passed", True, "", dt))

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r.to_json()) + "\n")
    ran = [r for r in results if r.status != "skipped"]
    lat = sorted(r.seconds * 1000 for r in ran) or [0.0]
    metrics = {
        "cases_total": len(results),
        "cases_passed": sum(r.status == "passed" for r in results),
        "cases_failed": sum(r.status == "failed" for r in results),
        "cases_unchecked": sum(r.status == "unchecked" for r in results),
        "cases_skipped": sum(r.status == "skipped" for r in results),
        "latency_ms_p50": statistics.median(lat),
        "latency_ms_max": lat[-1],
    }
    (args.out_dir / "case_metrics.json").write_text(json.dumps(metrics, indent=1))
    print("\nCase results:")
    print(
        table(
            [("case", "status", "seconds", "first difference")]
            + [(r.to_json()["id"], r.status, f"{r.seconds:.3f}", r.reason[:160]) for r in results]
        )
    )
    print(
        f"\n{metrics['cases_passed']} passed, {metrics['cases_failed']} failed, "
        f"{metrics['cases_unchecked']} unchecked, {metrics['cases_skipped']} skipped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
