"""The check registry: one table of models, one of planners, in step; the include-dir rule."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Literal

import pytest

from accelmatrix.evaluation.checks import planner_for, planners
from accelmatrix.evaluation.checks.registry import planner
from accelmatrix.spec.checks import CHECK_TYPES, Check, CheckBase
from accelmatrix.spec.checks.registry import check_type_of, register, registered
from accelmatrix.spec.include_paths import include_file, relative_path


def test_union_and_check_types_are_the_registry() -> None:
    union = typing.get_args(typing.get_args(Check)[0])
    assert list(union) == list(registered().values())
    assert CHECK_TYPES == tuple(registered())
    # The checks of every workload lead the union (pydantic lists tags in this order).
    assert CHECK_TYPES[:4] == ("exit_status", "log_contains", "log_not_contains", "artifact_count")


def test_every_check_type_has_exactly_one_planner() -> None:
    assert set(planners()) == set(CHECK_TYPES)
    for tag, model in registered().items():
        fn = planner_for(tag)
        # A family's planner lives in the module of the same name as its model's family.
        assert fn.__module__.rsplit(".", 1)[1] == model.__module__.rsplit(".", 1)[1], tag


def test_every_family_module_pairs_a_model_module() -> None:
    spec_dir = Path(registered()["exit_status"].__module__.replace(".", "/")).parent.name
    assert spec_dir == "checks"
    import accelmatrix.evaluation.checks as ev
    import accelmatrix.spec.checks as sp

    def families(pkg: typing.Any) -> set[str]:
        return {p.stem for p in Path(pkg.__file__).parent.glob("*.py")} - {
            "__init__",
            "registry",
            "check_fields",
        }

    assert families(ev) == families(sp)


def test_a_second_model_under_a_known_type_is_refused() -> None:
    class Impostor(CheckBase):
        type: Literal["exit_status"] = "exit_status"

    with pytest.raises(ValueError, match="registered twice: .*ExitStatusCheck and .*Impostor"):
        register(Impostor)
    with pytest.raises(ValueError, match="two planners"):
        planner(Impostor)(lambda c, p, inp: None)
    assert registered()["exit_status"].__name__ == "ExitStatusCheck"


def test_a_model_without_a_type_tag_is_refused() -> None:
    class Untagged(CheckBase):
        pass

    with pytest.raises(TypeError, match="needs a field `type"):
        check_type_of(Untagged)


def test_unknown_planner_names_the_known_types() -> None:
    with pytest.raises(KeyError, match="no planner for check type 'nope'.*exit_status"):
        planner_for("nope")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("/etc/x.yaml", "must be a relative path"),
        ("C:\\x.yaml", "must be a relative path"),
        ("bounds/../../x.yaml", "must not contain '..'"),
        ("..\\x.yaml", "must not contain '..'"),
    ],
)
def test_relative_path_rule(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        relative_path(value, "bounds_file")


def test_include_file_stays_inside_even_through_a_symlink(tmp_path: Path) -> None:
    include = tmp_path / "include"
    (include / "bounds").mkdir(parents=True)
    (include / "bounds" / "b.yaml").write_text("benchmarks: {}\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, include / "out")
    assert include_file(include, "bounds/b.yaml") == (include / "bounds" / "b.yaml").resolve()
    with pytest.raises(ValueError, match="'out/x.yaml' is outside the include dir"):
        include_file(include, "out/x.yaml")
    with pytest.raises(ValueError, match="bounds_files must not contain '..'"):
        include_file(include, "../x.yaml", field="bounds_files")
    with pytest.raises(ValueError, match="outside the include dir"):
        include_file(include, ".")
