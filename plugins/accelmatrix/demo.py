"""`python -m accelmatrix.demo SUITE [SUITE...]`: run suites end to end with `dag.test()`.

What `make demo` runs on a fresh machine: every task of every cell runs for real (real
processes, real Great Expectations, the real results store) in this one process, without
a scheduler. Prints the result table of each run and where its artifacts and Data Docs are.
Exits 0 when every run reached a verdict (pass or fail) with every cell torn down, so a
suite that is meant to catch a failing cell still counts as a working demo.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from accelmatrix import settings


def run_suite(name: str, conf: dict | None = None):
    """Run one suite with dag.test(); return (dag_run_state, run_id)."""
    from accelmatrix.dag_factory import build_dag

    path = settings.suites_dir() / f"{name}.yaml"
    dag = build_dag(path)
    dr = dag.test(run_conf=conf or None)
    return str(dr.state), dr.run_id


def local_suites() -> list[str]:
    """Suites whose selected machines are all `local`: what runs on a fresh machine."""
    from accelmatrix.dag_factory import used_machines
    from accelmatrix.spec.loader import load_suite, suite_id

    names = []
    for path in sorted(settings.suites_dir().glob("*.yaml")):
        suite = load_suite(path)
        if all(suite.machines[m].backend == "local" for m in used_machines(suite)):
            names.append(suite_id(path))
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelmatrix.demo")
    ap.add_argument(
        "suites",
        nargs="*",
        help="suite names; default: every suite whose cells all run on the local backend",
    )
    ap.add_argument("--conf", default=None, help="JSON params for the run")
    args = ap.parse_args(argv)
    import json

    logging.basicConfig(level=logging.INFO)
    from accelmatrix.results.store import ResultsStore

    store = ResultsStore.from_settings()
    ok = True
    summaries = []
    timings = []
    for name in args.suites or local_suites():
        t0 = time.monotonic()
        state, run_id = run_suite(name, json.loads(args.conf) if args.conf else None)
        timings.append((name, state, time.monotonic() - t0))
        cells = store.get_cells(name, run_id)
        planned = [c for c in cells if c["state"] != "excluded"]
        leaked = [
            c["cell_id"] for c in planned if c.get("provisioned_at") and not c.get("teardown_at")
        ]
        ok &= not leaked
        art = settings.artifacts_dir() / settings.safe_name(name) / settings.safe_name(run_id)
        summaries.append(
            f"\n=== {name}  run {run_id}: {state.upper()} ===\n"
            + store.run_table(name, run_id)
            + f"\nrun report (every cell's log and Data Docs): {art / 'index.html'}"
            + (f"\nNOT TORN DOWN: {leaked}" if leaked else "")
        )
    print("\n".join(summaries))
    print("\nwall time per suite (dag.test, one task at a time):")
    for name, state, seconds in timings:
        print(f"  {name:<24} {state:<8} {seconds:6.1f} s")
    print(f"  {'total':<24} {'':<8} {sum(t for *_, t in timings):6.1f} s")
    print(f"\nresults store: {settings.results_url()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
