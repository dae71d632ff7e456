"""Support rules: unsupported runtime x machine pairs are excluded with a reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from accelmatrix.spec.plan import expand
from accelmatrix.spec.suite import Suite


def suite(runtimes: dict, supports=None, **extra) -> Suite:
    data = {
        "axes": {"runtime": runtimes, "machine": ["cpu-1", "cpu-2", "gpu-1"]},
        "machines": {
            "cpu-1": {"backend": "local"},
            "cpu-2": {"backend": "local"},
            "gpu-1": {"backend": "local", "resources": {"gpus": 1}},
        },
        "supports": supports if supports is not None else [{"axis": "runtime"}],
        "workload": {"run": ["true"]},
    }
    data.update(extra)
    return Suite.model_validate(data)


RUNTIMES = {
    "torch": {"python": "/p", "machines": ["cpu-*", "gpu-1"]},
    "stdlib": {"python": "/q", "machines": ["cpu-1"]},
}


def test_unsupported_pairs_excluded_with_reason_in_the_plan():
    plan = expand(suite(RUNTIMES), "s")
    assert [c.id for c in plan.cells] == [
        "runtime=torch,machine=cpu-1",
        "runtime=torch,machine=cpu-2",
        "runtime=torch,machine=gpu-1",
        "runtime=stdlib,machine=cpu-1",
    ]
    reasons = {e.id: e.reason for e in plan.excluded}
    assert reasons == {
        "runtime=stdlib,machine=cpu-2": "runtime stdlib does not support machine cpu-2 "
        "(supported: cpu-1)",
        "runtime=stdlib,machine=gpu-1": "runtime stdlib does not support machine gpu-1 "
        "(supported: cpu-1)",
    }
    table = plan.table()
    assert "excluded: runtime stdlib does not support machine gpu-1" in table


def test_explicit_exclusion_wins_over_support_reason():
    s = suite(
        RUNTIMES,
        exclude=[{"match": {"runtime": "stdlib", "machine": "gpu-1"}, "reason": "b/1"}],
    )
    reasons = {e.id: e.reason for e in expand(s, "s").excluded}
    assert reasons["runtime=stdlib,machine=gpu-1"] == "b/1"


@pytest.mark.parametrize(
    ("runtimes", "supports", "message"),
    [
        (
            {"torch": {"machines": ["cpu-3"]}},
            None,
            "axes.runtime.torch.machines: 'cpu-3' is not a value of axis 'machine' "
            "(values: cpu-1, cpu-2, gpu-1)",
        ),
        (
            {"torch": {"python": "/p"}},
            None,
            "axes.runtime.torch.machines: must list the machine values 'torch' supports",
        ),
        (["torch"], None, "the values of axis 'runtime' must be mappings"),
        (RUNTIMES, [{"axis": "framework"}], "supports[0]: no axis named 'framework'"),
        (RUNTIMES, [{"axis": "runtime", "colour": "x"}], "Extra inputs are not permitted"),
    ],
)
def test_bad_support_rules_name_the_field(runtimes, supports, message):
    with pytest.raises(ValidationError) as e:
        suite(runtimes, supports)
    assert message in str(e.value)
