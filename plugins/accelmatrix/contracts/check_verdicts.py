"""A cell evaluation's inputs and outputs: the check verdict crosses from the evaluate step to
the trigger, the operator, the store and the pages.

Kept free of pandas and Great Expectations so that callers (the Airflow task, the results
store, the CLI) can import these types without paying for the heavy imports.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CellOutputs", "CheckVerdict", "EvaluationReport"]


@dataclass
class CellOutputs:
    """Everything a cell's workload left behind, already collected onto the worker."""

    files_dir: Path  # artifacts copied from the workload's work dir (relative paths kept)
    log_path: Path  # combined stdout+stderr (may not exist if the workload never ran)
    status: dict | None  # {"exit_code": int | None, "timed_out": bool, ...}; None: never ran
    metrics: list[dict] = field(default_factory=list)  # long-form metric rows


@dataclass
class CheckVerdict:
    """The outcome of one check, with enough text to act on it without opening Data Docs."""

    name: str
    type: str
    passed: bool
    expected: str
    observed: str
    message: str
    # A failed check of severity "warning": passed stays True (it never fails the cell),
    # the table shows WARN and the message says what tripped.
    warning: bool = False
    # Perf checks: benchmark, metric, value, lower_bound, upper_bound (None elsewhere).
    perf: dict | None = None


# Column widths keep the table readable in the Airflow log. A longer value wraps onto more
# lines of its row instead of being cut: an expected range or an observed value cut with
# "..." hid exactly the part on-call needed.
_WIDTHS = {"check": 44, "expected": 46, "observed": 40}


def _cell(text: str, width: int) -> list[str]:
    """The lines of one table cell: the whole value, wrapped at ``width``."""
    text = " ".join(text.split())  # newlines in an observed value must not break the table
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


@dataclass
class EvaluationReport:
    """All verdicts of one cell; ``passed`` iff every check passed (vacuously true for none)."""

    verdicts: list[CheckVerdict]
    passed: bool
    data_docs_index: Path | None
    seconds: float

    def format_table(self) -> str:
        """A fixed-width table for the task log (long values wrap within their column), then
        the full message of each failure."""
        rows: list[tuple[str, ...]] = []
        for v in self.verdicts:
            cells = [
                ["WARN" if v.warning else "PASS" if v.passed else "FAIL"],
                _cell(v.name, _WIDTHS["check"]),
                _cell(v.expected, _WIDTHS["expected"]),
                _cell(v.observed, _WIDTHS["observed"]),
            ]
            height = max(map(len, cells))
            rows += [tuple(c[i] if i < len(c) else "" for c in cells) for i in range(height)]
        header = ("RESULT", "CHECK", "EXPECTED", "OBSERVED")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]

        def line(r: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

        out = [line(header), line(tuple("-" * w for w in widths))]
        out += [line(r) for r in rows]
        n_ok = sum(v.passed for v in self.verdicts)
        verdict = "PASSED" if self.passed else "FAILED"
        out.append(
            f"{verdict}: {n_ok}/{len(self.verdicts)} check(s) passed "
            f"(evaluated in {self.seconds:.2f} s)"
        )
        for v in self.verdicts:
            if not v.passed:
                out.append(f"FAIL {v.name}: {v.message}")
            elif v.warning:
                out.append(f"WARN {v.name}: {v.message}")
        if self.data_docs_index:
            out.append(f"Data Docs: {self.data_docs_index}")
        return "\n".join(out)
