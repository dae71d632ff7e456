"""Inputs and outputs of a cell evaluation, as plain dataclasses.

Kept free of pandas and Great Expectations so that callers (the Airflow task, the results
store, the CLI) can import these types without paying for the heavy imports.
"""

from __future__ import annotations

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


# Column caps keep one verdict per line in the Airflow log; full text follows the table.
_WIDTHS = {"check": 44, "expected": 46, "observed": 40}


def _cell(text: str, width: int) -> str:
    text = " ".join(text.split())  # one line per row, whatever the observed text holds
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass
class EvaluationReport:
    """All verdicts of one cell; ``passed`` iff every check passed (vacuously true for none)."""

    verdicts: list[CheckVerdict]
    passed: bool
    data_docs_index: Path | None
    seconds: float

    def format_table(self) -> str:
        """A fixed-width table for the task log, then the full message of each failure."""
        rows = [
            (
                "WARN" if v.warning else "PASS" if v.passed else "FAIL",
                _cell(v.name, _WIDTHS["check"]),
                _cell(v.expected, _WIDTHS["expected"]),
                _cell(v.observed, _WIDTHS["observed"]),
            )
            for v in self.verdicts
        ]
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
