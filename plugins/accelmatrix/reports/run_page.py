"""One HTML page per run: every cell, its state, failed checks, and links to its log and
Great Expectations Data Docs. The link on-call opens first."""

from __future__ import annotations

import html
import os
from pathlib import Path

from accelmatrix.cell_state import FAILED_COLOUR, STATE_COLOURS
from accelmatrix.contracts.run_records import CellRecord, CheckRecord
from accelmatrix.reports.verdicts import CellVerdicts, lead_html
from accelmatrix.settings import safe_name

__all__ = ["STATE_COLOURS", "write_run_index"]


def write_run_index(
    run_dir: Path,
    dag_id: str,
    run_id: str,
    cells: list[CellRecord],
    checks: list[CheckRecord],
) -> Path:
    failed_by_cell: dict[str, list[str]] = {}
    for c in checks:
        if not c.passed:
            failed_by_cell.setdefault(c.cell_id, []).append(c.check_name)
    rows = []
    for cell in sorted(cells, key=lambda c: (c.cell_index is None, c.cell_index)):
        cid = cell.cell_id
        cell_dir = run_dir / _safe(cid)
        links = []
        for label, rel in (("log", "output.log"), ("Data Docs", "data_docs/index.html")):
            if (cell_dir / rel).exists():
                href = html.escape(os.path.join(_safe(cid), rel), quote=True)
                links.append(f'<a href="{href}">{label}</a>')
        state = cell.state or ""
        colour = STATE_COLOURS.get(state, FAILED_COLOUR)
        detail = ", ".join(failed_by_cell.get(cid, [])) or cell.excluded_reason or ""
        rows.append(
            f'<tr style="background:{colour}"><td>{html.escape(cid)}</td>'
            f"<td>{html.escape(state)}{' (quarantined)' if cell.quarantined else ''}</td>"
            f"<td>{html.escape(detail)}</td><td>{' '.join(links)}</td></tr>"
        )
    # The gate's Great Expectations validation of the run's table of cells.
    run_docs = (
        ' (<a href="data_docs/index.html">run Data Docs</a>)'
        if (run_dir / "data_docs" / "index.html").exists()
        else ""
    )
    # A compare run's report of the two builds (history.retests.build_compare), once written.
    if (run_dir / "compare.html").exists():
        run_docs += ' (<a href="compare.html">comparison of the two builds</a>)'
    # The page leads with the cells' verdicts (reports/verdicts.py).
    verdicts = CellVerdicts.of((c.cell_id, c.state, bool(c.quarantined)) for c in cells)
    page = (
        "<!doctype html><meta charset=utf-8>"
        f"<title>{html.escape(dag_id)} {html.escape(run_id)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 8px;text-align:left}</style>"
        f"<h1>{html.escape(dag_id)}</h1>{lead_html(verdicts)}"
        f"<p>run {html.escape(run_id)}{run_docs}</p>"
        "<table><tr><th>cell</th><th>state</th><th>failed checks / reason</th><th></th></tr>"
        + "".join(rows)
        + "</table>"
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def _safe(cell_id: str) -> str:

    return safe_name(cell_id)
