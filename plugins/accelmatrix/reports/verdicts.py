"""The cells' verdicts in one line, for every page that summarises a run.

A red run's "run Data Docs" opened with "Validation passed: 3 of 3 checks passed": true of
what it validated (the run's table: every planned cell reported once, with a verdict), but
read by on-call as "the run is fine". Every summary of a run therefore leads with the
cells' verdicts ("1 of 3 cells failed: c=1 (failed its checks)") and says what its own
checks cover. The run report (run_page.py), the run's Data Docs (``lead_run_docs``) and the
matrix page use this one line.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from accelmatrix.cell_state import CellState

__all__ = ["RUN_TABLE_SCOPE", "CellVerdicts", "lead_html", "lead_run_docs"]

MAX_NAMED = 5  # cells named in the line before "and k more"
# What the run's Data Docs validate (evaluation.run_table), said on the page itself.
RUN_TABLE_SCOPE = (
    "This page validates the run's table: every planned cell reported once, each with a "
    "verdict, and no passed cell with a failed check (plus the suite's run checks). It does "
    "not re-judge the cells: each cell's own checks are in that cell's Data Docs."
)


@dataclass(frozen=True)
class CellVerdicts:
    """How many of a run's cells (excluded ones aside) failed, and which."""

    total: int
    failed: tuple[tuple[str, str], ...]  # (cell id, state), quarantined cells aside
    quarantined_failed: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, cells: Iterable[tuple[str, str | None, bool]]) -> CellVerdicts:
        """From (cell id, state, quarantined) of each planned cell; an excluded cell is not
        counted, a cell without a state (never reported) counts as failed ("missing")."""
        total, failed, quarantined = 0, [], []
        for cell_id, state, is_quarantined in cells:
            if state == CellState.EXCLUDED:
                continue
            total += 1
            if state == CellState.PASSED:
                continue
            (quarantined if is_quarantined else failed).append((cell_id, state or "missing"))
        return cls(total, tuple(failed), tuple(quarantined))

    @property
    def passed(self) -> bool:
        return not self.failed

    def line(self) -> str:
        """ "1 of 3 cells failed: c=1 (failed its checks)", or "all 3 cells passed"."""
        plural = "s" if self.total != 1 else ""
        if self.passed:
            out = f"all {self.total} cell{plural} passed" if self.total else "no cell ran"
        else:
            named = ", ".join(f"{c} ({_why(s)})" for c, s in self.failed[:MAX_NAMED])
            more = len(self.failed) - MAX_NAMED
            named += f" and {more} more" if more > 0 else ""
            out = f"{len(self.failed)} of {self.total} cell{plural} failed: {named}"
        if self.quarantined_failed:
            n = len(self.quarantined_failed)
            out += f" ({n} quarantined cell{'s' if n != 1 else ''} also failed, not counted)"
        return out


def _why(state: str) -> str:
    return "failed its checks" if state == CellState.FAILED else state


def lead_html(verdicts: CellVerdicts) -> str:
    """The line as the first paragraph of a page: red when a cell failed."""
    colour = "#feb2b2" if not verdicts.passed else "#c6f6d5"
    return (
        f'<p id="cells-verdict" data-passed="{str(verdicts.passed).lower()}" '
        f'style="background:{colour};padding:6px 8px;font-weight:600">'
        f"The run's cells: {html.escape(verdicts.line())}.</p>"
    )


def lead_run_docs(index: Path, verdicts: CellVerdicts) -> None:
    """Make the run's Data Docs index (offline_docs writes it) lead with the cells'
    verdicts and say what it validates; its own summary then reads "The run's table:
    validation passed ...", never a bare "Validation passed" above failed cells."""
    text = index.read_text(encoding="utf-8")
    lead = lead_html(verdicts) + f'<p id="scope">{html.escape(RUN_TABLE_SCOPE)}</p>'
    if "</h1>" in text:
        text = text.replace("</h1>", "</h1>" + lead, 1)
    else:
        text = lead + text
    text = text.replace('id="summary">Validation ', 'id="summary">The run\'s table: validation ', 1)
    index.write_text(text, encoding="utf-8")
