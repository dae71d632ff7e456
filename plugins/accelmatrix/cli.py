"""`python -m accelmatrix validate|plan|pools` for pre-commit, CI and operators.

validate      check suite files exactly as the DAG factory does; exit 1 on any error
plan          print the run plan (cells to run, cells excluded and why) of each suite
pools         print the Airflow pools the suites need; --apply creates them via the airflow CLI
changepoints  the change points of a series in a CSV file (time,value), or the stored
              change points of a suite (--suite DAG_ID)
triage        set the state of a change group or change point (who and when are recorded)
bounds        export FILE: print a bounds file with the bounds re-centered since (stored in
              the results store) applied, comments kept, for a PR; history FILE: the rows
compare       SUITE --base BUILD --head BUILD: run both builds on one machine per cell,
              interleaved, and print their comparison (--json for the JSON)
export        --dag-id D --run-id R, or --since DATE: runs to the warehouse (BigQuery)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec

from accelmatrix import settings
from accelmatrix.demo import run_suite
from accelmatrix.evaluation.bounds import BoundsError, bounds_key, export_text, load_bounds
from accelmatrix.history.bounds.bounds_job import reason_line
from accelmatrix.history.change_points.report import changes_json, changes_table
from accelmatrix.history.change_points.triage import TRIAGE_STATES, apply_triage
from accelmatrix.history.series.csv_series import SeriesFileError, read_series
from accelmatrix.history.series.detector import detect
from accelmatrix.notifications.pull_request import report_run
from accelmatrix.results import results_store
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import COMPARE_KEY
from accelmatrix.spec.include_paths import include_file
from accelmatrix.spec.loader import (
    SuiteError,
    load_suite,
    load_suites,
    resolve_suite,
    suite_files,
    suite_id,
)
from accelmatrix.spec.params import ParamsError, check_run_conf, parse_params
from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.warehouse.command import add_export_command


def _paths(args: argparse.Namespace) -> list[Path]:
    """The suite files named on the command line; a folder stands for its suite files."""

    if not args.files:
        return suite_files(settings.suites_dir())
    out: list[Path] = []
    for f in map(Path, args.files):
        out += suite_files(f) if f.is_dir() else [f]
    return out


def _no_files(args: argparse.Namespace) -> bool:
    """Nothing to check is a mistake (a wrong folder, a wrong suffix), not a success."""
    where = ", ".join(args.files) if args.files else str(settings.suites_dir())
    print(f"no suite files (*.yaml, *.yml) in {where}", file=sys.stderr)
    return True


def cmd_validate(args: argparse.Namespace) -> int:

    paths = _paths(args)
    if not paths and _no_files(args):
        return 1
    good, bad = load_suites(paths)
    for path in good:
        print(f"ok       {path}")
    for err in bad.values():
        print(f"INVALID  {err}", file=sys.stderr)
    print(f"{len(good)} valid, {len(bad)} invalid")
    return 1 if bad else 0


def cmd_plan(args: argparse.Namespace) -> int:

    paths = _paths(args)
    if not paths and _no_files(args):
        return 1
    good, bad = load_suites(paths)
    failed = bool(bad)
    for path, suite in good.items():
        try:
            # Checked like the trigger form: unknown names and out-of-range values refused.
            params = parse_params(args.params, suite, f"{path}: --params")
            plan = expand(suite, suite_id(path), params=params, only=args.cells or None)
        except (ParamsError, PlanError) as e:
            print(f"INVALID  {e}", file=sys.stderr)
            failed = True
            continue
        print(plan.table())
        print()
    for err in bad.values():
        print(f"INVALID  {err}", file=sys.stderr)
    return 1 if failed else 0


def cmd_pools(args: argparse.Namespace) -> int:

    good, bad = load_suites(_paths(args))
    pools: dict[str, int] = {}
    for suite in good.values():
        for name, machine in suite.machines.items():
            pools[suite.pool_for(name)] = max(
                pools.get(suite.pool_for(name), 0), machine.pool_slots
            )
    for name, slots in sorted(pools.items()):
        print(f"{name}\t{slots}")
        if args.apply:
            airflow = shutil.which("airflow") or str(Path(sys.executable).with_name("airflow"))
            # include_deferred: a deferred `run` task still occupies the machine.
            subprocess.run(  # noqa: S603 (argv list; names validated by the spec)
                [
                    airflow,
                    "pools",
                    "set",
                    name,
                    str(slots),
                    "accelmatrix machine pool",
                    "--include-deferred",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    return 1 if bad else 0


def cmd_changepoints(args: argparse.Namespace) -> int:
    """Exit 0 with JSON (or a table) on stdout; exit 2 with one line on stderr for bad
    input: the file, the field and what is allowed, never a traceback."""
    import json

    if args.suite:
        if args.file:
            return _usage_error("give either FILE.csv or --suite DAG_ID, not both")

        store = results_store()
        known = set(store.suite_dag_ids())
        if args.suite not in known:
            allowed = ", ".join(sorted(known)) or "(none has results yet)"
            return _usage_error(f"--suite {args.suite!r}: no results for it; suites: {allowed}")
        if args.json:
            print(json.dumps(changes_json(store, args.suite), indent=2))
        else:
            print(changes_table(store, args.suite, only_open=False) or "no change points")
        return 0
    if not args.file:
        return _usage_error("give FILE.csv (header time,value) or --suite DAG_ID")

    try:
        times, values = read_series(Path(args.file))
    except SeriesFileError as e:
        return _usage_error(str(e))
    found = detect(values)
    out = []
    for cp in found:
        d = cp.as_dict()
        out.append(
            {
                "index": cp.index,
                "time": times[cp.index],
                **{k: v for k, v in d.items() if k != "index"},
            }
        )
    print(json.dumps({"change_points": out}, indent=2))
    return 0


def cmd_triage(args: argparse.Namespace) -> int:
    import getpass

    if args.state not in TRIAGE_STATES:
        return _usage_error(f"--state {args.state!r}: allowed {', '.join(TRIAGE_STATES)}")
    by = args.user or getpass.getuser()
    try:
        result = apply_triage(
            results_store(),
            args.what,
            args.id,
            args.state,
            by=by,
            note=args.note,
            dag_id=args.suite,
        )
    except KeyError as e:
        return _usage_error(str(e).strip("'\""))
    print(result.line())
    return 0


def _bounds_file(arg: str) -> tuple[Path, str] | str:
    """The bounds file named on the command line and its key in the store, or why not.

    Relative to the include dir (as a suite's check names it), or a path to a file in it:
    ``bounds/nightly_perf_bounds.yaml`` and ``include/bounds/nightly_perf_bounds.yaml``
    from the checkout are the same file."""

    include = settings.include_dir().resolve()
    given = Path(arg)
    if given.is_file() and include in given.resolve().parents:
        path = given.resolve()
    else:
        try:
            path = include_file(include, arg, field="FILE")
        except ValueError as e:
            return f"{e}; a bounds file is named relative to the include dir"
        if not path.is_file():
            return f"bounds file {arg!r} not found under the include dir {include}"
    return path, bounds_key(path, include)


def cmd_bounds(args: argparse.Namespace) -> int:
    """export: the file's text with its stored rows in force applied on stdout, what
    changed (from, to, who, when, why) on stderr; history: the stored rows, newest first."""
    import json

    found = _bounds_file(args.file)
    if isinstance(found, str):
        return _usage_error(found)
    path, key = found
    store = results_store()
    if args.action == "history":
        rows = store.get_bounds_history([key])
        if args.json:
            print(json.dumps(msgspec.to_builtins(rows), indent=2))
            return 0
        for r in rows:
            print(
                f"{r.at:%Y-%m-%d %H:%M} UTC  {r.benchmark}  "
                f"[{r.step_time_lower_bound}, {r.step_time_upper_bound}]  "
                f"by {r.by}: {reason_line(r)}" + (f" ({r.note})" if r.note else "")
            )
        if not rows:
            print(f"no stored bounds for {key}: the file's values are in force", file=sys.stderr)
        return 0
    try:
        stored = store.bounds_in_force(key)
        text, changes = export_text(path, stored)
        file_bounds = load_bounds(path)
    except BoundsError as e:
        return _usage_error(str(e))
    sys.stdout.write(text)
    for name, fields in changes.items():
        old = file_bounds.benchmarks[name]
        row = stored[name]
        moved = ", ".join(f"{k} {getattr(old, k)} -> {v}" for k, v in fields.items())
        print(
            f"{key}: {name}: {moved} (by {row.by} {row.at:%Y-%m-%d %H:%M} UTC: {reason_line(row)})",
            file=sys.stderr,
        )
    for name, row in stored.items():
        if name not in changes and name in file_bounds.benchmarks:
            print(
                f"{key}: {name}: the file already has the stored bounds or changed since the "
                f"newest row ({row.at:%Y-%m-%d %H:%M} UTC): nothing to change",
                file=sys.stderr,
            )
    if not changes:
        print(f"{key}: no stored bounds to apply: the file is printed as it is", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Run a comparison of two builds with ``dag.test()`` (this machine, no scheduler; a
    deployment triggers the DAG with the same conf block over REST) and print it."""
    import json

    try:
        path = resolve_suite(args.suite, settings.suites_dir())
        suite = load_suite(path)
        dag_id = suite_id(path)
        params = json.loads(args.params) if args.params else {}
        if not isinstance(params, dict):
            return _usage_error(f"--params: expected a JSON object, got {args.params!r}")
        request = {"base": args.base, "head": args.head, "cells": args.cells or ["*"]}
        conf = {**params, COMPARE_KEY: {**request, "pairs": args.pairs}}
        check_run_conf(suite, dag_id, conf, f"{path}: compare")
    except (SuiteError, ParamsError, PlanError, ValueError) as e:
        return _usage_error(str(e))
    state, run_id = run_suite(str(path), conf)
    report = (
        settings.artifacts_dir() / settings.safe_name(dag_id) / settings.safe_name(run_id)
    ) / "compare.json"
    if not report.is_file():
        print(f"error: run {run_id} ended {state} without a comparison", file=sys.stderr)
        return 1
    data = json.loads(report.read_text())
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print((report.parent / "compare.txt").read_text())
        print(f"report: {report.with_name('compare.html')}")
    return 0 if state == "success" else 1


def cmd_pr_report(args: argparse.Namespace) -> int:
    """The gate's report to the pull request, posted again (notifications.pull_request)."""

    path = next((p for p in suite_files(settings.suites_dir()) if suite_id(p) == args.dag_id), None)
    if path is None:
        return _usage_error(f"no suite {args.dag_id!r} in {settings.suites_dir()}")
    gh = load_suite(path).github
    if gh is None:
        return _usage_error(f"suite {args.dag_id!r} has no github block")
    store = ResultsStore.from_settings()
    try:
        report = report_run(
            store, args.dag_id, args.run_id,
            context=gh.context or f"accelmatrix/{args.dag_id}", conn_id=gh.conn_id,
        )  # fmt: skip
    finally:
        store.close()
    if report is None:
        return _usage_error(f"{args.dag_id} {args.run_id} was not started for a pull request")
    print(f"{report.state}: {report.description}")
    return 0


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m accelmatrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="validate suite files")
    v.add_argument(
        "files", nargs="*", help="suite YAML files or folders of them (default: every suite)"
    )
    v.set_defaults(func=cmd_validate)
    p = sub.add_parser("plan", help="print the run plan")
    p.add_argument("files", nargs="*")
    p.add_argument("--params", help="JSON object of param values")
    p.add_argument("--cells", nargs="*", help="cell id globs, like the `cells` UI param")
    p.set_defaults(func=cmd_plan)
    o = sub.add_parser("pools", help="list (or --apply) the Airflow pools of the suites")
    o.add_argument("files", nargs="*")
    o.add_argument("--apply", action="store_true")
    o.set_defaults(func=cmd_pools)
    c = sub.add_parser(
        "changepoints",
        help="change points of a CSV series (time,value) or of a suite's stored series",
    )
    c.add_argument("file", nargs="?", help="CSV with the header time,value (ISO date or integer)")
    c.add_argument("--suite", help="list the stored change points of this suite (its DAG id)")
    c.add_argument("--json", action="store_true", help="with --suite: JSON instead of a table")
    c.set_defaults(func=cmd_changepoints)
    t = sub.add_parser("triage", help="set the state of a change group or change point")
    t.add_argument("what", choices=["group", "change"])
    t.add_argument("id", type=int)
    t.add_argument(
        "--state",
        required=True,
        help="untriaged, acknowledged, accepted, invalid, infrastructure or fixed",
    )
    t.add_argument("--note", help="why (kept with the state)")
    t.add_argument("--user", help="who sets it (default: the login name)")
    t.add_argument("--suite", help="refuse unless the group/change is of this suite")
    t.set_defaults(func=cmd_triage)
    b = sub.add_parser(
        "bounds",
        help="print a bounds file with the stored (re-centered) bounds applied, for a PR",
    )
    b.add_argument("action", choices=["export", "history"])
    b.add_argument(
        "file", help="the bounds file, relative to the include dir (or a path to it inside it)"
    )
    b.add_argument("--json", action="store_true", help="history: JSON instead of lines")
    b.set_defaults(func=cmd_bounds)
    k = sub.add_parser(
        "compare", help="compare two builds of a suite on one machine per cell, interleaved"
    )
    k.add_argument("suite", help="a suite name (local_smoke) or file")
    k.add_argument("--base", required=True, help="the build to compare against")
    k.add_argument("--head", required=True, help="the build under question")
    k.add_argument("--cells", nargs="*", help="cell id globs (default: every cell)")
    k.add_argument(
        "--pairs",
        type=int,
        default=10,
        help="samples of each build a cell (8-200: the fewest whose two-sided p can reach 0.01)",
    )
    k.add_argument("--params", help="JSON object of param values for the runs")
    k.add_argument("--json", action="store_true", help="print the comparison as JSON")
    k.set_defaults(func=cmd_compare)
    r = sub.add_parser(
        "pr-report",
        help="post a pull request run's status and comment to GitHub again (after an outage)",
    )
    r.add_argument("--dag-id", required=True, help="the suite's DAG id")
    r.add_argument("--run-id", required=True, help="the run started for the pull request")
    r.set_defaults(func=cmd_pr_report)
    add_export_command(sub)
    args = ap.parse_args(argv)
    return args.func(args)
