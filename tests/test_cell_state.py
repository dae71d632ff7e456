"""The one list of cell and run states (accelmatrix.cell_state)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from accelmatrix import cell_state
from accelmatrix.cell_state import CellState, RunState
from accelmatrix.contracts.change_point_records import TRIAGE_STATES
from accelmatrix.results.store import ResultsStore

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "accelmatrix"


def test_values_are_the_strings_stored_before_the_enum() -> None:
    # Rows already in results databases hold these strings: renaming one orphans them.
    assert {s.value for s in CellState} == {
        "planned", "excluded", "provisioning", "provisioned", "setup", "running", "ran",
        "exited", "collected", "passed", "failed", "setup_failed", "run_failed", "timed_out",
        "hung", "infra_failed", "collect_failed", "evaluation_failed", "preflight_failed",
        "cancelled",
    }  # fmt: skip
    assert {s.value for s in RunState} == {"running", "passed", "failed", "over_budget"}


def test_groups_are_consistent() -> None:
    assert set(cell_state.NEVER_RAN) < cell_state.IN_FLIGHT < cell_state.PENDING
    verdicts = set(cell_state.EARLIER_FAILURES) | {CellState.PASSED, CellState.FAILED}
    assert not verdicts & cell_state.PENDING
    assert cell_state.STEP_FAILED | cell_state.WORKLOAD_FAILED <= set(cell_state.EARLIER_FAILURES)


def test_every_state_literal_the_steps_write_is_a_member() -> None:
    """A new state written as a bare string (or a typo) must be added to the enum first."""
    known = {s.value for s in CellState} | {s.value for s in RunState}
    known |= set(TRIAGE_STATES)  # a change point's or group's triage: its own vocabulary
    written = {}
    for path in PLUGIN.rglob("*.py"):
        if path.parts[-2] in ("backends", "testing"):  # runner/node states, not cell states
            continue
        if path.name == "notifiers.py":  # GitHub issue states (open/closed)
            continue
        for m in re.finditer(r"\bstate=\"([a-z_]+)\"", path.read_text()):
            written.setdefault(m.group(1), path.name)
    assert {s: f for s, f in written.items() if s not in known} == {}


def test_store_keeps_plain_strings(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = ResultsStore(f"sqlite:///{db}")
    store.upsert_cell("d", "r", "c", state=CellState.TIMED_OUT)
    store.upsert_run("d", "r", state=RunState.OVER_BUDGET)
    store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT state, typeof(state) FROM cells").fetchall() == [
            ("timed_out", "text")
        ]
        assert conn.execute("SELECT state FROM runs").fetchall() == [("over_budget",)]
    fresh = ResultsStore(f"sqlite:///{db}")
    fresh.upsert_cell("d", "r", "c2")  # the column default is the enum's first state
    assert fresh.get_cell("d", "r", "c2").state == "planned" == CellState.PLANNED
    fresh.close()
