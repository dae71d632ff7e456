"""Great Expectations over the run's table of cells (``evaluation.run_table``): what makes a
run's verdict true, and the suite's ``run_checks``, each failure naming its cells."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from pydantic import ValidationError

from accelmatrix.contracts.run_records import CellRecord, CheckRecord
from accelmatrix.evaluation.run_table import run_frame, validate_run
from accelmatrix.spec.run_checks import CellsAgreeCheck
from accelmatrix.spec.suite import Suite
from accelmatrix_testkit import records


def _planned() -> list[dict]:
    return [
        {"id": f"model={m},rt={r}", "axes": {"model": m, "rt": r}, "machine_spec": {"backend": k}}
        for m in ("a", "b")
        for r, k in (("x", "local"), ("y", "local"), ("z", "ssh"))
    ]


def _rows(planned: list[dict]) -> list[CellRecord]:
    return [
        records.cell(c["id"], state="passed", exit_code=0, resource_held_seconds=2.0)
        for c in planned
    ]


def _checks(planned: list[dict], step_times: dict[str, float] | None = None) -> list[CheckRecord]:
    step_times = step_times or {}
    return [
        records.check(c["id"], True, metric="step_time", value=step_times.get(c["id"], 1.0))
        for c in planned
    ]


def test_a_complete_run_passes() -> None:
    planned = _planned()
    result = validate_run(planned, _rows(planned), _checks(planned))
    assert result.passed and result.failures == []


def test_missing_unplanned_unjudged_and_inconsistent_cells_are_named(tmp_path: Path) -> None:
    planned = _planned()
    rows = _rows(planned)[:-1]  # model=b,rt=z never reported
    rows[1] = msgspec.structs.replace(rows[1], state="running")  # no verdict
    rows.append(records.cell("stray", state="passed"))  # not planned
    rows.append(records.cell("skipped", state="excluded"))  # an excluded cell is no fault
    checks = [*_checks(planned), records.check(planned[0]["id"], False)]
    result = validate_run(planned, rows, checks, data_docs_dir=tmp_path / "docs")
    assert not result.passed
    assert result.failures == [
        "every planned cell reported once: never reported: model=b,rt=z; "
        "reported but not planned: stray",
        "every planned cell has a verdict: no verdict: model=a,rt=y (running), "
        "model=b,rt=z (missing)",
        "no passed cell has a failed check: passed with a failed check: "
        "model=a,rt=x (1 failed check(s))",
    ]
    index = result.data_docs_index.read_text()
    assert "cell=model=b,rt=z" in index and "cell=stray" in index


def test_cells_agree_names_the_cells_beyond_the_ratio_within_their_group() -> None:
    planned = _planned()
    # model=a on local: 1.0 and 1.5 (beyond 1.2x); on ssh its own group of one.
    slow = {"model=a,rt=y": 1.5, "model=a,rt=z": 9.0, "model=b,rt=x": 1.1}
    check = CellsAgreeCheck(by=["model"], within=1.2)
    result = validate_run(planned, _rows(planned), _checks(planned, slow), run_checks=[check])
    assert result.failures == [
        "cells_agree[step_time by model]: 1 cell(s) more than 1.2x the fastest of their "
        "group on step_time: model=a,rt=y (1.50x)"
    ]
    lenient = CellsAgreeCheck(by=["model"], within=1.6)
    assert validate_run(
        planned, _rows(planned), _checks(planned, slow), run_checks=[lenient]
    ).passed


def test_the_frame_has_one_row_per_planned_cell() -> None:
    planned = _planned()
    frame = run_frame(planned, _rows(planned)[:2], _checks(planned))
    assert frame["cell"].tolist() == [c["id"] for c in planned]
    assert frame["reported"].tolist() == [1, 1, 0, 0, 0, 0]
    assert frame["perf:step_time"].tolist() == [1.0] * 6


def test_run_checks_name_axes_that_exist() -> None:
    suite = {
        "axes": {"model": ["a"]},
        "machines": {"m": {"backend": "local"}},
        "workload": {"run": ["true"]},
    }
    Suite.model_validate(
        {**suite, "run_checks": [{"type": "cells_agree", "by": ["model"], "within": 1.1}]}
    )
    with pytest.raises(
        ValidationError, match=r"run_checks\[0\]\.by: \['size'\] are not axes \(axes: model\)"
    ):
        Suite.model_validate(
            {**suite, "run_checks": [{"type": "cells_agree", "by": ["size"], "within": 1.1}]}
        )
