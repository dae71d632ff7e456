"""The fault matrix's own judging, without a server: rows lost or stored twice, "n/a" where
no workload ran, and the phase list (accelmatrix_testkit/fault_matrix.py).

Found in a read of tests/test_fault_matrix.py: ``rows_lost`` was ``max(0, printed -
stored)``, so a metric row stored twice was never flagged; a setup or provision fault
(no workload ever ran) showed "0 rows lost", 0 compared with 0; and an empty
ACCELMATRIX_FAULT_PHASES passed with no case run.
"""

from __future__ import annotations

import pytest

from accelmatrix_testkit.fault_matrix import (
    FAULTS,
    NO_WORKLOAD,
    PHASES,
    Outcome,
    details,
    phases_from,
    render_table,
)


def outcome(**kw) -> Outcome:
    o = Outcome("workload fails", "local", state="run_failed", **kw)
    o.problems.extend(o.row_problems())
    return o


def test_every_row_stored_once_passes():
    o = outcome(expected_rows=5, stored_rows=5)
    assert (o.rows_lost, o.rows_extra, o.problems, o.failing) == (0, 0, [], False)
    assert o.text() == "run_failed, 0 leaked, 0 rows lost"


def test_a_lost_row_fails():
    o = outcome(expected_rows=5, stored_rows=3)
    assert o.rows_lost == 2 and o.failing
    assert o.problems == [
        "2 of the 5 metric rows the workload printed are not in the results store (3 stored)"
    ]
    assert "ROWS LOST: 2 of 5" in o.text()


def test_a_row_stored_twice_fails():
    o = outcome(expected_rows=5, stored_rows=7)
    assert o.rows_lost == 0 and o.rows_extra == 2 and o.failing
    assert o.problems == ["7 metric rows stored for the 5 the workload printed: 2 stored twice"]
    assert "ROWS STORED TWICE: 2 of 7" in o.text()
    assert "stored twice" in details([o])


def test_no_workload_ran_is_not_applicable_not_zero_of_zero():
    o = outcome(workload_ran=False, stored_rows=0)
    assert o.rows_lost is None and o.rows_extra is None and not o.failing
    assert o.text() == "run_failed, 0 leaked, rows n/a (no workload ran)"
    assert "0 rows lost" not in o.text()
    # ...and a row stored for a workload that never ran is a problem.
    ghost = outcome(workload_ran=False, stored_rows=1)
    assert ghost.failing and ghost.problems == ["1 metric rows stored, but the workload never ran"]


def test_the_faults_before_the_workload_are_setup_and_provision():
    assert set(NO_WORKLOAD) == {"setup", "provision"} <= set(FAULTS.values())


def test_the_table_shows_n_a_for_a_fault_before_the_workload():
    table = render_table(
        [
            Outcome("setup fails", "ssh", state="setup_failed", workload_ran=False, stored_rows=0),
            Outcome("workload fails", "ssh", state="run_failed", expected_rows=4, stored_rows=4),
        ]
    )
    row = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    assert "setup_failed, 0 leaked, rows n/a (no workload ran)" in row["setup fails"]
    assert "run_failed, 0 leaked, 0 rows lost" in row["workload fails"]


def test_phases_unset_is_every_phase_and_some_are_some():
    assert phases_from(None) == list(PHASES)
    assert phases_from("triggerer, cloud") == ["triggerer", "cloud"]


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_phase_list_is_refused(value):
    with pytest.raises(ValueError, match="names no phase"):
        phases_from(value)


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="not phases"):
        phases_from("per_cell,schedular")
