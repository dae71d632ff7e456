"""`python -m accelmatrix validate|plan|pools` for pre-commit, CI and operators.

validate  check suite files exactly as the DAG factory does; exit 1 on any error
plan      print the run plan (cells to run, cells excluded and why) of each suite
pools     print the Airflow pools the suites need; --apply creates them via the airflow CLI
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from accelmatrix import settings


def _paths(args: argparse.Namespace) -> list[Path]:
    """The suite files named on the command line; a folder stands for its suite files."""
    from accelmatrix.spec.loader import suite_files

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
    from accelmatrix.spec.loader import load_suites

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
    from accelmatrix.spec.loader import load_suites, suite_id
    from accelmatrix.spec.params import ParamsError, parse_params
    from accelmatrix.spec.plan import PlanError, expand

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
    from accelmatrix.spec.loader import load_suites

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
    args = ap.parse_args(argv)
    return args.func(args)
