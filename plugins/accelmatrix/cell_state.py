"""Every state a cell (and a run) can be in, in one place.

The states are plain strings in the results store (``cells.state``, ``runs.state``), the
matrix page and history read them back, and each step of the lifecycle writes them; a
typo in one place used to be a state nobody else knew. ``StrEnum`` members are those same
strings (``CellState.PASSED == "passed"``), so rows written before this module, rows
written with it and comparisons against either all agree. A leaf module: it imports
nothing of accelmatrix, so any layer may use it.
"""

from __future__ import annotations

from enum import StrEnum


class CellState(StrEnum):
    """The ``cells.state`` values, in the order a cell usually passes through them."""

    PLANNED = "planned"  # plan: the cell will run
    EXCLUDED = "excluded"  # plan: an exclude rule matched (excluded_reason says which)
    PROVISIONING = "provisioning"
    PROVISIONED = "provisioned"
    SETUP = "setup"
    RUNNING = "running"
    RAN = "ran"  # the workload exited as expected; checks not judged yet
    # The local runner's status word: no step writes it as a cell state today, but the
    # matrix page has always counted it as in progress, so it stays known.
    EXITED = "exited"
    COLLECTED = "collected"  # a collect that crashed before succeeded on its retry
    PASSED = "passed"
    FAILED = "failed"  # the checks failed
    SETUP_FAILED = "setup_failed"
    RUN_FAILED = "run_failed"  # the workload's exit was not the expected one
    TIMED_OUT = "timed_out"
    HUNG = "hung"
    INFRA_FAILED = "infra_failed"
    COLLECT_FAILED = "collect_failed"
    EVALUATION_FAILED = "evaluation_failed"
    PREFLIGHT_FAILED = "preflight_failed"
    CANCELLED = "cancelled"  # stopped from outside (accelmatrix.cleanup.stopped)


class RunState(StrEnum):
    """The ``runs.state`` values accelmatrix writes (plan and gate)."""

    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    OVER_BUDGET = "over_budget"  # plan refused the run: its estimated cost is over budget


# Cell states before the workload started: evaluated in one of these, the cell never ran.
NEVER_RAN: tuple[str, ...] = (
    CellState.PLANNED,
    CellState.PROVISIONING,
    CellState.PROVISIONED,
    CellState.SETUP,
)
# Written before a step learned its outcome: a cell still in one of these once its tasks
# are over was cut short (or its worker died) and never got a verdict.
IN_FLIGHT = frozenset({*NEVER_RAN, CellState.RUNNING})
# Still on its way (no verdict yet), as the matrix page colours it.
PENDING = frozenset({*IN_FLIGHT, CellState.RAN, CellState.EXITED, CellState.COLLECTED})
# A failure an earlier step recorded: later steps keep it rather than overwrite it.
EARLIER_FAILURES: tuple[str, ...] = (
    CellState.SETUP_FAILED,
    CellState.TIMED_OUT,
    CellState.HUNG,
    CellState.INFRA_FAILED,
    CellState.RUN_FAILED,
    CellState.PREFLIGHT_FAILED,
    CellState.CANCELLED,
    CellState.COLLECT_FAILED,  # the collect step crashed or lost metrics
    CellState.EVALUATION_FAILED,  # the checks could not run at all
)
# A step of the cell's life crashed (collect, evaluation).
STEP_FAILED = frozenset({CellState.COLLECT_FAILED, CellState.EVALUATION_FAILED})
# The workload's own exit is the cause: its last log line says most.
WORKLOAD_FAILED = frozenset({CellState.RUN_FAILED, CellState.TIMED_OUT, CellState.HUNG})

# The run page's row colours (reports/run_page.py). Any state not named here, a failure of
# any kind or a cell that never reported, is FAILED_COLOUR: a gap never looks like a pass.
STATE_COLOURS = {CellState.PASSED: "#d9ead3", CellState.EXCLUDED: "#eeeeee"}
FAILED_COLOUR = "#f4cccc"
