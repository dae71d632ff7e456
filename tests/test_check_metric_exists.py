"""The ``metric_exists`` check: the model, its planner and the verdict with real GE."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from accelmatrix.evaluation import CellOutputs, evaluate_cell
from accelmatrix.evaluation.observe import plan_checks
from accelmatrix.spec.checks import CHECK_TYPES, parse_checks


def rows(name: str, values: list[float | str]) -> list[dict]:
    return [{"name": name, "value": v, "step": i, "source": "test"} for i, v in enumerate(values)]


def outputs(tmp_path: Path, metrics: list[dict]) -> CellOutputs:
    return CellOutputs(
        files_dir=tmp_path / "files",
        log_path=tmp_path / "log.txt",
        status={"exit_code": 0, "timed_out": False},
        metrics=metrics,
    )


def test_is_a_check_type_of_suites() -> None:
    assert "metric_exists" in CHECK_TYPES
    check = parse_checks([{"type": "metric_exists", "metric": "tokens_per_s"}])[0]
    assert check.display_name == "metric_exists[tokens_per_s]"
    assert parse_checks([check.model_dump()])[0] == check


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "metric_exists"}, "metric\n  Field required"),
        ({"type": "metric_exists", "metric": ""}, "at least 1 character"),
        ({"type": "metric_exists", "metric": "m", "min": 1}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_checks_are_refused(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_checks([raw])
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("values", "finite", "observed"),
    [
        ([0.5, "nan", 0.7], 2, "2 finite value(s)"),
        (["nan", "nan"], 0, "only NaN"),
        ([math.inf, "nan"], 0, "only NaN/inf"),
    ],
)
def test_planner_counts_finite_values(
    tmp_path: Path, values: list, finite: int, observed: str
) -> None:
    checks = parse_checks([{"type": "metric_exists", "metric": "acc"}])
    (plan,) = plan_checks(checks, outputs(tmp_path, rows("acc", values)), include_dir=tmp_path)
    assert plan.columns == {"c00_metric_exists__finite_acc": finite}
    assert (plan.expected, plan.observed) == ("present", observed)
    assert [(e.column, e.min_value, e.max_value) for e in plan.expectations] == [
        ("c00_metric_exists__finite_acc", 1, None)
    ]


def test_verdicts_with_great_expectations(tmp_path: Path) -> None:
    checks = parse_checks(
        [
            {"type": "metric_exists", "metric": "acc"},
            {"type": "metric_exists", "metric": "loss"},
            {"type": "metric_exists", "metric": "tokens_per_s"},
        ]
    )
    metrics = rows("acc", [0.9]) + rows("loss", ["nan", "nan"])
    report = evaluate_cell(checks, outputs(tmp_path, metrics), include_dir=tmp_path)
    acc, loss, absent = report.verdicts
    assert acc.passed and acc.observed == "1 finite value(s)"
    assert acc.message == "metric 'acc' present: 1 finite value(s)"
    assert not loss.passed
    assert (loss.expected, loss.observed) == ("present", "only NaN")
    assert "metric 'loss' has 2 value(s), none finite" in loss.message
    assert not absent.passed
    assert (absent.expected, absent.observed) == ("present", "absent")
    assert "metric 'tokens_per_s' is absent" in absent.message
    assert "metrics collected: acc, loss" in absent.message
    assert not report.passed
