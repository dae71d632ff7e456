"""Fencing a cell's row against a superseded task try.

Airflow may start a new try of a task while an older one still runs: the older try's
Execution API calls outlasted an api-server restart, or a worker lost its heartbeat. The
server then tells the old try to stop, but until it is killed it goes on and may write to
the results store, after the new try and the cell's later steps have moved the row on. A
row moved backwards (``provisioning`` after ``collected``) makes teardown settle a passing
cell as cut short.

So every step that writes a cell row says which task try it is (``StepTry``). The store
keeps the newest try each task of the cell has written with, and refuses a write from an
older one by raising ``SupersededTry``: the stale try stops there, and the row keeps what
the newer try wrote. Airflow's try numbers only grow for a task instance (a cleared task
gets the next one); a run planned again starts its fences afresh (``reset_run``).

Stdlib only: the lifecycle imports it, and DAG files import the lifecycle's package.
"""

from __future__ import annotations

from typing import NamedTuple


class StepTry(NamedTuple):
    """The task try a write comes from: the task's id (``cell.provision``) and try number."""

    task_id: str
    try_number: int


class SupersededTry(RuntimeError):
    """A newer try of the same task has written this cell's row: this try must stop."""

    def __init__(self, cell_id: str, mine: StepTry, newest: int):
        self.cell_id = cell_id
        self.mine = mine
        self.newest = newest
        super().__init__(
            f"try {mine.try_number} of task {mine.task_id} for cell {cell_id} is superseded: "
            f"try {newest} has written the cell's results since. This try stops without "
            f"writing, and the cell keeps what the newer try recorded."
        )
