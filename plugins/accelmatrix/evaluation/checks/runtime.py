"""Planners of the runtime checks (`report_items`, `notebooks`).

Models: accelmatrix.spec.checks.runtime. Notebook errors are read from the executed
notebooks themselves (nbformat JSON: a code cell whose outputs contain an `error` output),
not from the log, so the verdict holds even if the workload's own reporting was lost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelmatrix.evaluation.check_plan import CheckPlan, Expect
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.evaluation.observe_inputs import CellInputs
from accelmatrix.spec.checks.runtime import NotebooksCheck, ReportItemsCheck

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXCERPT_CHARS = 120
MAX_LISTED = 5


@dataclass
class NotebookError:
    """The first failing cell of one executed notebook."""

    notebook: str
    cell: int  # index in the SOURCE notebook (papermill's inserted cells not counted)
    execution_count: int | None
    source: str
    ename: str
    evalue: str
    traceback: str

    def describe(self) -> str:
        excerpt = " / ".join(line.strip() for line in self.source.splitlines() if line.strip())
        if len(excerpt) > EXCERPT_CHARS:
            excerpt = excerpt[: EXCERPT_CHARS - 3] + "..."
        return (
            f"{self.notebook} cell {self.cell} (In [{self.execution_count}]) raised "
            f"{self.ename}: {self.evalue} (source: {excerpt})"
        )


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def notebook_errors(path: Path) -> list[NotebookError]:
    """Every code cell of an executed notebook that has an error output.

    Raises ValueError when the file is not a notebook. Cells that papermill inserted (its
    error banner and the injected-parameters cell) do not count in the cell index, so the
    index is the one a person sees when opening the source notebook.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cells = data["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{Path(path).name} is not a readable notebook: {e}") from None
    errors: list[NotebookError] = []
    index = -1
    for cell in cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if tags & {"papermill-error-cell-tag", "injected-parameters"}:
            continue
        index += 1
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(
                    NotebookError(
                        notebook=Path(path).name,
                        cell=index,
                        execution_count=cell.get("execution_count"),
                        source=_text(cell.get("source")),
                        ename=str(out.get("ename", "")),
                        evalue=str(out.get("evalue", "")),
                        traceback=ANSI.sub("", "\n".join(out.get("traceback", []))),
                    )
                )
                break
    return errors


@planner(NotebooksCheck)
def plan_notebooks(c: NotebooksCheck, p: CheckPlan, inp: CellInputs) -> None:
    files_dir: Path = inp.outputs.files_dir
    found = sorted(x for x in files_dir.glob(c.glob) if x.is_file()) if files_dir.is_dir() else []
    names = {x.name for x in found}
    missing = [n for n in c.expected_names if Path(n).name not in names]
    problems: list[str] = []
    failing = 0
    for nb in found:
        try:
            errs = notebook_errors(nb)
        except ValueError as e:
            errs, problems = [], [*problems, str(e)]
            failing += 1
            continue
        if errs:
            failing += 1
            problems.append(errs[0].describe())
    problems += [f"{n} was not executed (no {c.glob} output)" for n in missing]

    n_col, err_col, miss_col = (
        f"{p.prefix}__executed",
        f"{p.prefix}__failing",
        f"{p.prefix}__missing",
    )
    want = ", ".join(c.expected_names) or "none required"
    p.expected = f"no notebook raised; executed: {want}"
    p.observed = f"{len(found)} executed, {failing} failing, {len(missing)} missing"
    shown = "; ".join(problems[:MAX_LISTED])
    more = f"; ... ({len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    p.failure = f"{shown}{more}"
    p.success = f"{len(found)} notebook(s) ran without error"
    p.columns = {n_col: len(found), err_col: failing, miss_col: len(missing)}
    p.expectations = [
        Expect.equals(err_col, "notebooks with an error cell == 0", 0),
        Expect.equals(miss_col, "expected notebooks not executed == 0", 0),
    ]


@planner(ReportItemsCheck)
def plan_report_items(c: ReportItemsCheck, p: CheckPlan, inp: CellInputs) -> None:
    n_col, failed_col = f"{p.prefix}__items", f"{p.prefix}__failed_items"
    path = inp.outputs.files_dir / c.path
    p.expected = f">= {c.min_items} item(s) in {c.path}, all passed"
    items: list[dict[str, Any]] | None = None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        raw = data.get("items") if isinstance(data, dict) else None
        if isinstance(raw, list) and all(isinstance(i, dict) for i in raw):
            items = raw
        else:
            p.failure = f"{c.path} has no list of items ({{'items': [...]}})"
    except FileNotFoundError:
        p.failure = f"report {c.path} not found in the collected files (did the workload run?)"
    except (OSError, ValueError) as e:
        p.failure = f"report {c.path} is not readable JSON: {e}"
    if items is None:
        p.observed = "no report"
        p.columns = {n_col: None, failed_col: None}
    else:
        bad = [i for i in items if i.get("passed") is not True]
        p.observed = f"{len(items) - len(bad)} of {len(items)} item(s) passed"
        listed = [
            f"{i.get('name', '?')}: expected {i.get('expected', '?')}, found {i.get('observed', '?')}"
            for i in bad
        ]
        if bad:
            p.failure = f"{len(bad)} of {len(items)} item(s) failed: " + "; ".join(listed)
        else:
            p.failure = f"{len(items)} item(s) in {c.path}, need at least {c.min_items}"
        p.success = f"all {len(items)} item(s) passed"
        p.columns = {n_col: len(items), failed_col: len(bad)}
    p.expectations = [
        Expect(n_col, f"items in {c.path} >= {c.min_items}", min_value=c.min_items),
        Expect.equals(failed_col, "failed items == 0", 0),
    ]
