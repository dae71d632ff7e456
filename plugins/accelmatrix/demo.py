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
from accelmatrix.dag_factory import build_dag, used_machines
from accelmatrix.reports.text_table import run_table
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.loader import SuiteError, load_suite, resolve_suite, suite_files, suite_id
from accelmatrix.spec.params import ParamsError, parse_params


def run_suite(suite: str, conf: dict | None = None):
    """Run one suite (a name or a file path) with dag.test(); return (dag_run_state, run_id)."""

    dag = build_dag(resolve_suite(suite, settings.suites_dir()))
    dr = dag.test(run_conf=conf or None)
    return str(dr.state), dr.run_id


def _checked(suites: list[str], conf: str | None) -> list[tuple[str, str, dict | None]]:
    """(dag id, file, params) of every suite asked for, each loaded and its params checked like
    the trigger form checks them, before anything runs; raises SuiteError or ParamsError
    (a message for the user, not a traceback)."""

    out = []
    for arg in suites:
        path = resolve_suite(arg, settings.suites_dir())
        suite = load_suite(path)
        params = parse_params(conf, suite, f"{path}: --conf") or None
        out.append((suite_id(path), str(path), params))
    return out


def local_suites() -> list[str]:
    """Suites whose selected machines are all `local`: what runs on a fresh machine."""

    names = []
    for path in suite_files(settings.suites_dir()):
        suite = load_suite(path)
        if all(suite.machines[m].backend == "local" for m in used_machines(suite)):
            names.append(suite_id(path))
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelmatrix.demo")
    ap.add_argument(
        "suites",
        nargs="*",
        help="suite names or files (like validate and plan take); default: every suite whose "
        "cells all run on the local backend",
    )
    ap.add_argument("--conf", default=None, help="JSON params for the run")
    args = ap.parse_args(argv)

    try:
        runs = _checked(args.suites or local_suites(), args.conf)
    except (SuiteError, ParamsError) as e:
        print(f"INVALID  {e}", file=sys.stderr)
        return 2

    logging.basicConfig(level=logging.INFO)

    store = ResultsStore.from_settings()
    ok = True
    summaries = []
    timings = []
    for name, path, conf in runs:
        t0 = time.monotonic()
        state, run_id = run_suite(path, conf)
        timings.append((name, state, time.monotonic() - t0))
        cells = store.get_cells(name, run_id)
        planned = [c for c in cells if c.state != "excluded"]
        leaked = [c.cell_id for c in planned if c.provisioned_at and not c.teardown_at]
        ok &= not leaked
        art = settings.artifacts_dir() / settings.safe_name(name) / settings.safe_name(run_id)
        summaries.append(
            f"\n=== {name}  run {run_id}: {state.upper()} ===\n"
            + run_table(store, name, run_id)
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
