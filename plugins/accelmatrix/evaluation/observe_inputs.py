"""A cell's outputs as the check planners read them: parsed once, shared by every check.

``CellInputs`` holds what the planners (``accelmatrix.evaluation.checks``) look at: the log
scanned in a single pass for every log check (``_scan_log``), the cell's metrics tables
(``MetricsTable``: one row per step, one column per metric, plus the scalars; the same
reading as ``write_train_metrics``), and the bounds files, loaded once each with the bounds
re-centered since stored in the results store applied (``load_bounds_in_force``): the file
is only the initial baseline. Separate from the planners, which turn checks into
``CheckPlan``s: this is the reading of the outputs, they are the judging of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix.contracts.check_verdicts import CellOutputs
from accelmatrix.evaluation.bounds import BoundsError, BoundsFile, Stored, load_bounds_in_force
from accelmatrix.evaluation.metrics_table import MetricsTable, Rows
from accelmatrix.spec.checks import Check
from accelmatrix.spec.checks.steps import StepsCompleteCheck
from accelmatrix.spec.checks.workload import LogContainsCheck, LogNotContainsCheck
from accelmatrix.spec.include_paths import include_file

if TYPE_CHECKING:
    import pandas as pd

MAX_SHOWN_LINES = 3  # matching log lines quoted in an observation
MAX_LINE_CHARS = 160


class CellInputs:
    """Cell outputs, parsed once and shared by all checks of the cell."""

    def __init__(
        self,
        checks: list[Check],
        outputs: CellOutputs,
        include_dir: Path,
        stored_bounds: Callable[[str], Stored] | None = None,
    ) -> None:
        self.outputs = outputs
        self.include_dir = include_dir
        # bounds file key -> its stored rows in force; None: this process's results store.
        self.stored_bounds = stored_bounds
        self.log_hits = _scan_log(checks, outputs.log_path)
        # steps_complete needs a row for every step it expects, logged or not.
        expected = [
            r
            for c in checks
            if isinstance(c, StepsCompleteCheck) and (r := c.expected_steps()) is not None
        ]
        self.tables = MetricsTable(outputs.metrics, expected)
        self._bounds: dict[Path, BoundsFile | BoundsError] = {}

    @property
    def metric_names(self) -> str:
        return ", ".join(sorted(self.tables.names)) or "(no metrics at all)"

    def rows(self, name: str, *, skip_first: int = 0) -> Rows | None:
        """The rows of metric ``name`` in the metrics tables (None: never collected)."""
        return self.tables.rows(name, skip_first=skip_first)

    def series(self, name: str) -> pd.Series | None:
        """The values of metric ``name`` in step order, for checks observed in Python."""
        import pandas as pd

        rows = self.tables.rows(name)
        return None if rows is None else pd.Series(rows.values, dtype="float64")

    def bounds(self, rel: str) -> BoundsFile | BoundsError:
        """The bounds file ``rel`` under the include dir with its stored bounds applied,
        loaded once; a problem as the error.

        The include-dir rule is applied again here: the suite validated the text with its
        placeholders, and a rendered ``${axis.model}`` could still lead outside.
        """
        path = self.include_dir / rel
        if path not in self._bounds:
            try:
                include_file(self.include_dir, rel)
                self._bounds[path] = load_bounds_in_force(
                    path, include_dir=self.include_dir, stored=self.stored_bounds
                )
            except BoundsError as exc:
                self._bounds[path] = exc
            except ValueError as exc:
                self._bounds[path] = BoundsError(str(exc))
        return self._bounds[path]


@dataclass
class _LogHits:
    count: int | None  # None: log missing or pattern unusable
    lines: list[tuple[int, str]] = field(default_factory=list)
    error: str | None = None


def _scan_log(checks: list[Check], log_path: Path) -> dict[int, _LogHits]:
    """Count matching lines for every log check in a single pass over the log."""
    matchers: dict[int, Callable[[str], bool]] = {}
    hits: dict[int, _LogHits] = {}
    for i, check in enumerate(checks):
        if not isinstance(check, LogContainsCheck | LogNotContainsCheck):
            continue
        if check.regex:
            try:
                matchers[i] = re.compile(check.pattern).search  # type: ignore[assignment]
            except re.error as exc:
                # Placeholders are resolved after suite validation, so this can still happen.
                hits[i] = _LogHits(None, error=f"invalid regular expression: {exc}")
                continue
        else:
            pattern = check.pattern
            matchers[i] = lambda line, p=pattern: p in line
        hits[i] = _LogHits(0)
    if not matchers:
        return hits
    if not log_path.is_file():
        for i in matchers:
            hits[i] = _LogHits(None, error=f"log file {log_path} does not exist")
        return hits
    with log_path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip("\r\n")
            for i, match in matchers.items():
                if match(line):
                    h = hits[i]
                    h.count += 1  # type: ignore[operator]
                    if len(h.lines) < MAX_SHOWN_LINES:
                        h.lines.append((lineno, line[:MAX_LINE_CHARS]))
    return hits
