"""``python -m accelmatrix export``: runs of the results store to the warehouse, by hand.

    export --dag-id D --run-id R        one run (the command the export task logs on failure)
    export --since 2026-11-01 [--dag-id D]
                                        every run the gate decided since that day (a
                                        backfill of history); exporting a run again replaces it

Exit 0 with one line per export; 1 when the warehouse failed (the error, and what to run
again); 2 for bad input (the option, the value, what is allowed), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date

__all__ = ["add_export_command"]

# A backfill goes in exports of this many runs: one transaction's statement stays far below
# BigQuery's query size limit (1 MB) whatever the runs' ids are.
BACKFILL_CHUNK = 200


def add_export_command(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "export",
        help="export runs to the warehouse (BigQuery): one run, or every run since a day",
    )
    e.add_argument("--dag-id", help="the suite's DAG id")
    e.add_argument("--run-id", help="one run (with --dag-id)")
    e.add_argument("--since", help="YYYY-MM-DD: every run decided since that day (run date)")
    e.set_defaults(func=cmd_export)


def _error(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def cmd_export(args: argparse.Namespace) -> int:
    from accelmatrix.results import results_store
    from accelmatrix.warehouse.config import ConfigError, WarehouseConfig
    from accelmatrix.warehouse.export import Warehouse, collect, finished_runs_since

    if bool(args.run_id) == bool(args.since):
        return _error("give --dag-id D --run-id R, or --since YYYY-MM-DD (not both)")
    if args.run_id and not args.dag_id:
        return _error("--run-id needs --dag-id")
    try:
        config = WarehouseConfig.from_env()
    except ConfigError as e:
        return _error(str(e))
    if config is None:
        return _error(
            "ACCELMATRIX_WAREHOUSE_DATASET is not set: name the dataset (PROJECT.DATASET)"
        )
    store = results_store()
    if args.since:
        try:
            since = date.fromisoformat(args.since)
        except ValueError:
            return _error(f"--since {args.since!r}: a day as YYYY-MM-DD")
        keys = finished_runs_since(store, since, args.dag_id)
        if not keys:
            print(f"no run decided since {since} in the results store: nothing to export")
            return 0
    else:
        if store.get_run(args.dag_id, args.run_id) is None:
            return _error(f"--dag-id {args.dag_id!r} --run-id {args.run_id!r}: no such run")
        keys = [(args.dag_id, args.run_id)]
    wh = Warehouse(config)
    total = 0
    for i in range(0, len(keys), BACKFILL_CHUNK):
        part = keys[i : i + BACKFILL_CHUNK]
        try:
            result = wh.write(collect(store, part))
        except Exception as e:  # noqa: BLE001 - one line, and what to run again
            done = f"{total} of {len(keys)} run(s) exported; " if total else ""
            again = (
                f"--since {args.since}"
                if args.since
                else f"--dag-id {args.dag_id} --run-id {args.run_id}"
            )
            return _error(f"{done}warehouse: {type(e).__name__}: {e}; run again: "
                          f"python -m accelmatrix export {again}", 1)  # fmt: skip
        total += result.runs
        rows = ", ".join(f"{k} {v}" for k, v in result.rows.items())
        print(
            f"exported {result.runs} run(s) to {config.dataset} in {result.seconds:.2f} s "
            f"({result.load_jobs} load job(s)): {rows}"
        )
    return 0
