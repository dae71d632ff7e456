"""Why a cell did not pass, in one or two lines, and which task's log shows it.

On-call reads the grid, not a tooltip: each non-passing cell carries its cause (the failed
checks with expected and observed, the workload's exit and last log line, the
infrastructure reason, who or what stopped it) and a log link to the task that failed,
not the ``run`` task that is green when a check failed.

Cell states come from the lifecycle (and a helper's newer ``collect_failed`` /
``evaluation_failed``); a state this module does not know is still shown as a failure with
its message, so a new state can never make a red cell look fine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelmatrix.cell_state import WORKLOAD_FAILED, CellState
from accelmatrix.contracts.run_records import CheckRecord

# Where each failure shows up in Airflow: the task (step of the cell's mapped group, or a
# run-level task) whose log holds the cause.
STEP_OF_STATE = {
    CellState.SETUP_FAILED: "setup",
    CellState.RUN_FAILED: "run",
    CellState.TIMED_OUT: "run",
    CellState.HUNG: "run",
    CellState.FAILED: "evaluate",  # the checks: the verdict table is in the evaluate log
    CellState.COLLECT_FAILED: "collect",
    CellState.EVALUATION_FAILED: "evaluate",
    CellState.CANCELLED: "run",
    CellState.PREFLIGHT_FAILED: "preflight",
}
RUN_LEVEL_STEPS = frozenset({"preflight", "plan", "gate"})
# States whose cause is the workload's own exit: its last log line says most.
WORKLOAD_STATES = WORKLOAD_FAILED
MAX_LINE = 160
TAIL_BYTES = 4096


def failing_step(state: str, message: str) -> str:
    """The task whose log explains ``state`` (``run`` for anything unknown: the workload)."""
    if state == CellState.INFRA_FAILED:
        # record_provision_failure writes "provision failed: ...", setup's infrastructure
        # error "... during setup", the workload trigger "infrastructure failure: ...".
        if message.startswith("provision failed"):
            return "provision"
        if "during setup" in message:
            return "setup"
        return "run"
    return STEP_OF_STATE.get(state, "run")


@dataclass
class FailedCheck:
    name: str
    expected: str
    observed: str
    message: str = ""

    def line(self) -> str:
        said = [f"expected {self.expected}"] if self.expected else []
        said += [f"observed {self.observed}"] if self.observed else []
        if not said and self.message:
            said = [self.message]
        return clip(f"{self.name}: {', '.join(said)}" if said else self.name)


def clip(text: str, width: int = MAX_LINE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def last_log_line(log_path: Path) -> str | None:
    """The last non-empty line of a workload's combined log (reads only its tail)."""
    try:
        with log_path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if line.strip():
            return clip(line)
    return None


def cause_lines(
    state: str,
    message: str,
    checks: list[FailedCheck],
    exit_code: int | None,
    log_line: str | None,
) -> list[str]:
    """At most two lines saying why; empty for a passed, excluded or unfinished cell."""
    if state in (CellState.PASSED, CellState.EXCLUDED):
        return []
    if checks:
        lines = [c.line() for c in checks[:2]]
        if len(checks) > 2:
            lines[1] = clip(f"{lines[1]} (+{len(checks) - 2} more)")
        return lines
    lines = []
    if state in WORKLOAD_STATES:
        first = message or state.replace("_", " ")
        if exit_code is not None and "exit" not in first:
            first = f"exit {exit_code}: {first}"
        lines.append(clip(first))
        if log_line:
            lines.append(clip(f"last log line: {log_line}"))
        return lines
    if message:
        return [clip(message, 2 * MAX_LINE)]
    return [state.replace("_", " ")]


def check_rows(rows: list[CheckRecord]) -> dict[str, list[FailedCheck]]:
    """cell_id -> its failed checks (errors, not warnings), from the store's check rows."""
    out: dict[str, list[FailedCheck]] = {}
    for c in rows:
        if c.passed:
            continue
        out.setdefault(c.cell_id, []).append(
            FailedCheck(
                name=str(c.check_name or ""),
                expected=clip(c.expected or "", 60),
                observed=clip(c.observed or "", 60),
                message=clip(c.message or "", 100),
            )
        )
    return out
