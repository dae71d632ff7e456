"""Suite validation: every rule gives an error naming the file, the field and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelmatrix.spec.loader import SuiteError, load_suite, load_suites

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "axes": {"model": {"a": {"arch": "mlp"}, "b": {"arch": "wide"}}, "precision": ["fp32"]},
    "machines": {"cpu": {"backend": "local"}},
    "workload": {"run": ["${python}", "train.py", "--arch", "${axis.model.arch}"]},
}


def write(tmp_path: Path, data, name: str = "suite.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def error_of(tmp_path: Path, data, name: str = "suite.yaml") -> str:
    with pytest.raises(SuiteError) as e:
        load_suite(write(tmp_path, data, name))
    text = str(e.value)
    assert str(tmp_path / name) in text  # the file is always named
    return text


def with_(**changes):
    import copy

    d = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        cur = d
        keys = dotted.split("__")
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        if value is ...:
            cur.pop(keys[-1], None)
        else:
            cur[keys[-1]] = value
    return d


def test_valid_suite_loads(tmp_path):
    suite = load_suite(write(tmp_path, BASE))
    assert suite.axis_labels("model") == ["a", "b"]
    assert suite.workload.run[3] == "${axis.model.arch}"


def test_every_example_suite_is_valid():
    good, bad = load_suites(sorted((ROOT / "include" / "suites").glob("*.yaml")))
    assert bad == {}
    assert any(p.endswith("local_smoke.yaml") for p in good)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"machines__cpu__backend": "tpu"}, "machines.cpu.backend"),
        ({"machines__cpu__backend": "tpu"}, "'local'"),
        ({"workload__run": []}, "workload.run"),
        ({"workload__run": ...}, "workload.run: required field is missing"),
        ({"workload__timeout": -5}, "workload.timeout"),
        ({"workload__bogus": 1}, "unknown field 'bogus' (allowed: setup, run, env"),
        ({"colour": "red"}, "unknown field 'colour' (allowed: description"),
        ({"axes": {}}, "axes"),
        ({"axes__Model": ["x"]}, "axis name 'Model' must match"),
        ({"axes__precision": ["fp32", "fp32"]}, "duplicate values: ['fp32']"),
        ({"axes__precision": ["fp 32"]}, "value 'fp 32' must match"),
        ({"axes__precision": ["a,b"]}, "value 'a,b' must match"),
        ({"workload__run": ["x", {"a": 1}]}, "argv elements must be strings"),
        ({"workload__run": ["${axis.nope}"]}, "no axis named 'nope' (axes: model, precision)"),
        ({"workload__run": ["${axis.model.size}"]}, "no field 'size' (fields: arch)"),
        ({"workload__run": ["${params.x}"]}, "no param named 'x'"),
        ({"workload__run": ["${os.system}"]}, "unknown placeholder ${os.system}"),
        ({"workload__artifacts": ["../../etc/*"]}, "must not contain '..'"),
        ({"workload__artifacts": ["/etc/passwd"]}, "must be relative"),
        ({"workload__env": {"BAD NAME": "x"}}, "not a valid variable name"),
        ({"workload__env": {"ACCELMATRIX_X": "x"}}, "ACCELMATRIX_ prefix is reserved"),
        ({"schedule": "every day"}, "not a valid cron expression"),
        ({"schedule": "@sometimes"}, "is not one of @once"),
        ({"machine": "gpu"}, "machine 'gpu' is not defined (machines: cpu)"),
        ({"machines__gpu": {"backend": "local"}}, "several machines are defined"),
        ({"machines__Big_Box": {"backend": "local"}}, "machine name 'Big_Box' must match"),
        (
            {"exclude": [{"match": {"modle": "a"}, "reason": "typo"}]},
            "exclude[0].match: no axis named 'modle'",
        ),
        (
            {"exclude": [{"match": {"model": "zzz"}, "reason": "r"}]},
            "'zzz' is not a value of axis 'model' (values: a, b)",
        ),
        ({"exclude": [{"match": {"model": "a"}}]}, "exclude[0].reason"),
        ({"params": {"cells": {"type": "string"}}}, "'cells' is reserved"),
        (
            {"params": {"mode": {"type": "string", "default": "x", "enum": ["quick", "full"]}}},
            "default 'x' is not one of enum",
        ),
        ({"retries": 99}, "retries"),
        ({"slot_order": "fast"}, "slot_order: Input should be 'machine_time' or 'throughput'"),
        ({"checks": [{"type": "no_such_check"}]}, "checks[0]"),
        ({"checks": [{"type": "no_such_check"}]}, "exit_status"),
        ({"owners": ["ok", "bad\nname"]}, "control characters"),
    ],
)
def test_validation_errors(tmp_path, changes, expected):
    assert expected in error_of(tmp_path, with_(**changes))


def test_machine_axis_must_name_machines(tmp_path):
    d = with_(axes__machine=["cpu", "gpu"])
    assert "axes.machine: ['gpu'] are not machines (machines: cpu)" in error_of(tmp_path, d)


def test_too_many_cells(tmp_path):
    d = with_(axes={"a": list(range(33)), "b": list(range(32))}, workload__run=["x"])
    assert "1056 cells" in error_of(tmp_path, d)


def test_yaml_errors_are_located(tmp_path):
    text = error_of(tmp_path, "axes:\n  model: [a, b\nmachines: {}\n")
    assert "YAML syntax error: line" in text
    dup = error_of(tmp_path, "axes: {m: [a]}\naxes: {m: [b]}\n")
    assert "duplicate key 'axes'" in dup
    assert "top level must be a mapping" in error_of(tmp_path, "- a\n- b\n")


def test_file_name_must_be_a_dag_id(tmp_path):
    assert "must match ^[a-z]" in error_of(tmp_path, BASE, name="My Suite.yaml")


def test_one_broken_suite_does_not_stop_the_others(tmp_path):
    write(tmp_path, BASE, "good.yaml")
    write(tmp_path, "axes: [", "broken.yaml")
    good, bad = load_suites(sorted(tmp_path.glob("*.yaml")))
    assert list(good) == [str(tmp_path / "good.yaml")]
    assert list(bad) == [str(tmp_path / "broken.yaml")]


def test_cli_validate_and_plan(tmp_path):
    write(tmp_path, BASE, "good.yaml")
    write(tmp_path, with_(machines__cpu__backend="tpu"), "bad.yaml")
    py = [sys.executable, "-m", "accelmatrix"]
    env = {"PYTHONPATH": str(ROOT / "plugins"), "PATH": "/usr/bin:/bin"}
    ok = subprocess.run(
        py + ["validate", str(tmp_path / "good.yaml")], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        py + ["validate", *map(str, sorted(tmp_path.glob("*.yaml")))],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 1
    assert "machines.cpu.backend" in bad.stderr and "1 valid, 1 invalid" in bad.stdout
    plan = subprocess.run(
        py + ["plan", str(tmp_path / "good.yaml")], capture_output=True, text=True, env=env
    )
    assert plan.returncode == 0
    assert "model=a,precision=fp32" in plan.stdout and "2 cell(s) to run" in plan.stdout
