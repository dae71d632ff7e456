"""The run's results as a fixed-width text table, for task logs and the CLI."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from accelmatrix.contracts.run_records import CellRecord
from accelmatrix.results.store import ResultsStore

__all__ = ["run_table"]

from accelmatrix.pricing import load_pricing


def _currency() -> str:
    """The currency of the pricing file the costs were computed with (USD by default)."""
    try:
        return load_pricing().currency
    except Exception:  # a run table must render even when the pricing file is broken
        return "(currency of include/pricing.yaml)"


def _one_line(text_: str | None, width: int) -> str:
    s = re.sub(r"\s+", " ", text_ or "").strip()
    return s if len(s) <= width else s[: width - 3] + "..."


def _fmt_seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1f}"


def _join_names(names: Sequence[str], width: int) -> str:
    """Comma-joined names that fit ``width``, with a "+N more" tail when some do not."""
    if not names:
        return "-"
    out: list[str] = []
    for i, n in enumerate(names):
        rest = len(names) - i - 1
        candidate = ", ".join([*out, n])
        tail = f" (+{rest} more)" if rest else ""
        if out and len(candidate) + len(tail) > width:
            return ", ".join(out) + f" (+{len(names) - len(out)} more)"
        out.append(n)
    return ", ".join(out)


def run_table(store: ResultsStore, dag_id: str, run_id: str) -> str:
    """The run's cells as a fixed-width table for task logs and the CLI.

    Cells that only have check rows (their cell row was never written, e.g. a task
    crashed before reporting) are listed too, so a failure is never hidden by a gap.
    """
    cell_rows = store.get_cells(dag_id, run_id)
    failed: dict[str, list[str]] = {}
    for c in store.get_checks(dag_id, run_id):
        if not c.passed:
            failed.setdefault(c.cell_id, []).append(c.check_name)
    known = {c.cell_id for c in cell_rows}
    for cid in sorted(set(failed) - known):
        cell_rows.append(
            CellRecord(
                dag_id=dag_id, run_id=run_id, cell_id=cid, state="?", message="no cell row recorded"
            )
        )

    if not cell_rows:
        return f"No cells recorded for {dag_id} / {run_id}"

    header = ("cell", "state", "exit", "held s", "workload s", "failed checks", "message")
    numeric = {2, 3, 4}
    table: list[tuple[str, ...]] = [header]
    counts: dict[str, int] = {}
    for c in cell_rows:
        state = c.state or "-"
        counts[state] = counts.get(state, 0) + 1
        if c.quarantined:
            state += " (quarantined)"
        exit_code = c.exit_code
        message = c.message or c.excluded_reason or ""
        table.append(
            (
                c.cell_id,
                state,
                "-" if exit_code is None else str(exit_code),
                _fmt_seconds(c.resource_held_seconds),
                _fmt_seconds(c.workload_seconds),
                _join_names(failed.get(c.cell_id, []), 60),
                _one_line(message, 80),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]

    def fmt(r: tuple[str, ...]) -> str:
        cells_ = [
            r[i].rjust(widths[i]) if i in numeric else r[i].ljust(widths[i])
            for i in range(len(widths))
        ]
        return ("  ".join(cells_) + "  " + r[-1]).rstrip()

    lines = [fmt(r) for r in table]
    lines.insert(1, "-" * max(len(x) for x in lines))
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    head = f"Results of {dag_id} / {run_id}: {len(cell_rows)} cell(s): {summary}"
    costs = [c.cost for c in cell_rows if c.cost is not None]
    if costs:
        head += f"; cost {sum(costs):.6f} {_currency()}"
    return head + "\n" + "\n".join(lines)
