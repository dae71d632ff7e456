"""The check models of suite YAML: every validation rule gives a clear error."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from accelmatrix.spec.checks import CHECK_TYPES, Check, parse_checks


def one(raw: dict) -> Check:
    return parse_checks([raw])[0]


def error_of(raw: dict) -> str:
    with pytest.raises(ValidationError) as info:
        one(raw)
    return str(info.value)


def test_check_types_match_the_union() -> None:
    union = typing.get_args(typing.get_args(Check)[0])
    assert tuple(m.model_fields["type"].default for m in union) == CHECK_TYPES


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ({"type": "exit_status"}, "exit_status[0]"),
        (
            {"type": "log_contains", "pattern": "Finished training run"},
            "log_contains[Finished training run]",
        ),
        ({"type": "log_not_contains", "pattern": "Traceback"}, "log_not_contains[Traceback]"),
        ({"type": "artifact_count", "glob": "out/*.pt", "count": 1}, "artifact_count[out/*.pt]"),
        ({"type": "metric_between", "metric": "acc", "min": 0.5}, "metric_between[acc]"),
        ({"type": "final_loss", "target": 0.1, "tolerance": 0.05}, "final_loss[loss]"),
        ({"type": "loss_decreasing"}, "loss_decreasing[loss]"),
        (
            {"type": "step_time_within_bounds", "bounds_file": "b.yaml", "benchmark": "m"},
            "step_time_within_bounds[m]",
        ),
    ],
)
def test_every_type_parses_with_a_derived_name(raw: dict, name: str) -> None:
    check = one(raw)
    assert check.type == raw["type"]
    assert check.display_name == name
    assert one({**raw, "name": "mine"}).display_name == "mine"
    # A dumped check validates again unchanged (the lead serialises checks into the plan).
    assert one(check.model_dump()) == check


def test_defaults() -> None:
    assert one({"type": "exit_status"}).expected == 0
    lc = one({"type": "log_contains", "pattern": "x"})
    assert (lc.regex, lc.min_count) == (False, 1)
    assert one({"type": "log_not_contains", "pattern": "x"}).regex is True
    assert one({"type": "metric_between", "metric": "m", "max": 1}).reduce == "last"
    assert one({"type": "loss_decreasing"}).window == 3
    st = one({"type": "step_time_within_bounds", "bounds_file": "b.yaml", "benchmark": "m"})
    assert st.metric == "step_time"


def test_count_is_shorthand_for_min_and_max() -> None:
    check = one({"type": "artifact_count", "glob": "*.pt", "count": 2})
    assert (check.min, check.max) == (2, 2)


def test_placeholders_are_plain_strings() -> None:
    check = one(
        {
            "type": "step_time_within_bounds",
            "bounds_file": "bounds/${axis.model}.yaml",
            "benchmark": "${axis.model}",
        }
    )
    assert check.benchmark == "${axis.model}"
    assert one({"type": "log_not_contains", "pattern": "${axis.model} failed"}).regex


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "nope"}, "does not match any of the expected tags: 'exit_status'"),
        ({"type": "exit_status", "expect": 0}, "Extra inputs are not permitted"),
        ({"type": "log_contains"}, "Field required"),
        ({"type": "log_contains", "pattern": ""}, "at least 1 character"),
        ({"type": "log_contains", "pattern": "x", "min_count": 0}, "min_count must be >= 1"),
        ({"type": "log_contains", "pattern": "(", "regex": True}, "not a valid regular expression"),
        ({"type": "log_not_contains", "pattern": "[a-"}, "not a valid regular expression"),
        (
            {"type": "artifact_count", "glob": "/abs/*.pt", "count": 1},
            "glob must be a relative path",
        ),
        ({"type": "artifact_count", "glob": "out/../../x", "count": 1}, "must not contain '..'"),
        ({"type": "artifact_count", "glob": "..\\x", "count": 1}, "must not contain '..'"),
        ({"type": "artifact_count", "glob": "*.pt"}, "needs count, min or max"),
        (
            {"type": "artifact_count", "glob": "*.pt", "count": 1, "max": 3},
            "either count or min/max",
        ),
        (
            {"type": "artifact_count", "glob": "*.pt", "min": 3, "max": 1},
            "min (3) must be <= max (1)",
        ),
        ({"type": "artifact_count", "glob": "*.pt", "min": -1}, "greater than or equal to 0"),
        ({"type": "metric_between", "metric": "m"}, "needs at least one of min or max"),
        ({"type": "metric_between", "metric": "m", "min": 2, "max": 1}, "must be <= max"),
        ({"type": "metric_between", "metric": "m", "max": float("inf")}, "finite number"),
        ({"type": "metric_between", "metric": "m", "max": 1, "reduce": "sum"}, "'last', 'min'"),
        ({"type": "final_loss", "tolerance": 0.1}, "needs target and tolerance"),
        ({"type": "final_loss", "target": 0.1, "tolerance": -0.1}, "tolerance must be >= 0"),
        ({"type": "loss_decreasing", "window": 0}, "window must be >= 1"),
        (
            {"type": "step_time_within_bounds", "bounds_file": "/etc/b.yaml", "benchmark": "m"},
            "bounds_file must be a relative path",
        ),
        (
            {"type": "step_time_within_bounds", "bounds_file": "../b.yaml", "benchmark": "m"},
            "bounds_file must not contain '..'",
        ),
        ({"type": "step_time_within_bounds", "bounds_file": "b.yaml"}, "benchmark"),
    ],
)
def test_validation_errors(raw: dict, message: str) -> None:
    assert message in error_of(raw)


def test_error_names_the_check_position_and_field() -> None:
    with pytest.raises(ValidationError) as info:
        parse_checks(
            [{"type": "exit_status"}, {"type": "final_loss", "target": 1, "tolerance": -1}]
        )
    assert "1.final_loss.tolerance" in str(info.value)
