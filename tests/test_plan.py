"""Plan expansion: ids, exclusions, quarantine, params, placeholders."""

from __future__ import annotations

import pytest

from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.spec.suite import Suite


def suite(**extra) -> Suite:
    data = {
        "axes": {
            "runtime": {"pt213": {"image": "pt:2.13"}, "pt212": {"image": "pt:2.12"}},
            "machine": ["cpu-small", "cpu-big"],
            "steps": [10, 20],
        },
        "machines": {
            "cpu-small": {"backend": "local"},
            "cpu-big": {"backend": "local", "pool": "big"},
        },
        "workload": {
            "run": [
                "run",
                "--image",
                "${axis.runtime.image}",
                "--steps",
                "${axis.steps}",
                "--id",
                "${cell.id}",
                "--dir",
                "${work_dir}",
                "--n",
                "${params.n}",
            ],
            "env": {"IMAGE": "${axis.runtime.image}"},
        },
        "params": {"n": {"type": "integer", "default": 3}},
    }
    data.update(extra)
    return Suite.model_validate(data)


def test_every_combination_with_stable_readable_ids():
    plan = expand(suite(), "s")
    ids = [c.id for c in plan.cells]
    assert len(ids) == 8 == len(set(ids))
    assert ids[0] == "runtime=pt213,machine=cpu-small,steps=10"
    assert [c.index for c in plan.cells] == list(range(8))
    assert expand(suite(), "s").cells[5].id == ids[5]  # deterministic


def test_placeholders_resolved_per_cell_backend_vars_kept():
    c = expand(suite(), "s", params={"n": 7}).cells[0]
    run = c.workload.run
    assert run[2] == "pt:2.13" and run[4] == "10" and run[6] == c.id
    assert run[8] == "${work_dir}"  # only the backend knows it
    assert run[10] == "7"
    assert c.workload.env["IMAGE"] == "pt:2.13"
    assert c.values["runtime"] == {"image": "pt:2.13"}


def test_exclusions_carry_reasons_and_globs():
    s = suite(
        exclude=[
            {
                "match": {"runtime": "pt212", "machine": "cpu-big"},
                "reason": "pt212 lacks big kernels",
            },
            {"match": {"steps": "2*"}, "reason": "short runs only"},
        ]
    )
    plan = expand(s, "s")
    assert len(plan.cells) == 3
    reasons = {e.id: e.reason for e in plan.excluded}
    assert reasons["runtime=pt212,machine=cpu-big,steps=10"] == "pt212 lacks big kernels"
    assert reasons["runtime=pt213,machine=cpu-small,steps=20"] == "short runs only"
    table = plan.table()
    assert "3 cell(s) to run, 5 excluded" in table
    assert "excluded: pt212 lacks big kernels" in table


def test_machine_pool_and_grouping():
    plan = expand(suite(), "s")
    groups = plan.by_machine(["cpu-small", "cpu-big"])
    assert len(groups["cpu-small"]) == len(groups["cpu-big"]) == 4
    assert {c.pool for c in groups["cpu-big"]} == {"big"}
    assert {c.pool for c in groups["cpu-small"]} == {"accelmatrix_cpu_small"}


def test_only_param_selects_cells():
    plan = expand(suite(), "s", only=["runtime=pt213,*,steps=20"])
    assert [c.id for c in plan.cells] == [
        "runtime=pt213,machine=cpu-small,steps=20",
        "runtime=pt213,machine=cpu-big,steps=20",
    ]
    assert all(e.reason == "not selected by the `cells` param" for e in plan.excluded)


def test_quarantine_globs():
    s = suite(quarantine=[{"cells": "runtime=pt212,*", "reason": "b/123 flaky"}, "*steps=20"])
    cells = {c.id: c for c in expand(s, "s").cells}
    assert cells["runtime=pt212,machine=cpu-small,steps=10"].quarantine_reason == "b/123 flaky"
    assert cells["runtime=pt213,machine=cpu-small,steps=20"].quarantined
    assert not cells["runtime=pt213,machine=cpu-small,steps=10"].quarantined


def test_over_max_map_length_is_refused():
    s = Suite.model_validate(
        {
            "axes": {"a": list(range(40)), "b": list(range(30))},
            "machines": {"m": {"backend": "local"}},
            "workload": {"run": ["x"]},
        }
    )
    with pytest.raises(PlanError, match="1200 cells"):
        expand(s, "s")


def test_user_values_are_not_reinterpreted():
    # Shell metacharacters, quotes and Jinja in a param arrive verbatim as one argv element.
    evil = "$(rm -rf /); echo '{{ var.value.secret }}'\nnext"
    c = expand(suite(), "s", params={"n": evil}).cells[0]
    assert c.workload.run[10] == evil


def test_checks_are_validated_again_once_placeholders_are_filled_in():
    """``steps: ${params.n}`` is valid in the suite; the value a run gives it must make a
    valid check too, or the plan stops before any machine is provisioned, naming it."""
    checks = [{"type": "steps_complete", "metrics": ["loss"], "steps": "${params.n}"}]
    good = expand(suite(checks=checks), "s", params={"n": 7}).cells[0]
    assert good.checks[-1].steps == "7"
    with pytest.raises(PlanError, match=r"checks\[0\]\.steps: Value error, steps must be a whole"):
        expand(suite(checks=checks), "s", params={"n": "seven"})


def test_a_cell_is_typed_and_validated_once_its_placeholders_are_filled_in():
    """The plan's cell is a CellSpec (typed machine, workload, checks); a value that makes
    its workload invalid stops the plan, naming the cell and the field, before anything is
    provisioned. Its JSON form (the store's, a trigger's) gives the same cell back."""
    from accelmatrix.spec.cell import CellSpec

    c = expand(suite(), "s", params={"n": 7}).cells[0]
    assert c.machine_spec.backend == "local" and c.workload.timeout == 3600
    assert [k.type for k in c.checks] == ["exit_status"] and c.expected_exit == 0
    assert CellSpec.from_json(c.to_json()) == c
    assert c.timeouts.run_deferral(0).total_seconds() == 3600 + 300
    bad = suite(
        workload={"run": ["x"], "env": {"NOTE": "${params.note}"}},
        params={"note": {"type": "string", "default": "fine"}},
    )
    assert expand(bad, "s").cells[0].workload.env == {"NOTE": "fine"}
    with pytest.raises(
        PlanError,
        match=r"cell runtime=pt213,machine=cpu-small,steps=10 is "
        r"invalid once its placeholders are filled in: workload\.env: .*NUL",
    ):
        expand(bad, "s", params={"note": "a\x00b"})
