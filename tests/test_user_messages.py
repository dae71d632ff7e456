"""Every mistake a suite author or CLI user makes gets one clear message naming the file,
the field and what is allowed, and nothing runs; never a Python traceback.

Each case here was found misleading on the code before: a wrong field in the path, no hint
of the allowed form, a silent success, or a traceback.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmatrix import cli
from accelmatrix.spec.loader import SuiteError, load_suite, resolve_suite
from accelmatrix.spec.plan import expand

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "include" / "suites" / "local_smoke.yaml"
BASE: dict[str, Any] = yaml.safe_load(SMOKE.read_text())


def _problems(tmp_path: Path, change) -> list[str]:
    data = copy.deepcopy(BASE)
    change(data)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    assert str(e.value).startswith(f"{path}: invalid suite")
    return e.value.problems


def test_a_check_type_typo_names_the_type_field_and_the_allowed_types(tmp_path):
    (p,) = _problems(tmp_path, lambda d: d["checks"].__setitem__(1, {"type": "loss_decreasng"}))
    assert p.startswith("checks[1].type: Input tag 'loss_decreasng' found using 'type'")
    assert "'loss_decreasing'" in p and "backend" not in p


def test_a_metric_source_typo_names_the_type_field(tmp_path):
    (p,) = _problems(
        tmp_path, lambda d: d["workload"]["metrics"].__setitem__(0, {"type": "jsnl", "path": "x"})
    )
    assert p.startswith("workload.metrics[0].type: Input tag 'jsnl'")
    assert "'json', 'jsonl', 'log_regex', 'profiler_trace', 'junit_xml'" in p


def test_a_machine_backend_typo_still_names_backend(tmp_path):
    (p,) = _problems(tmp_path, lambda d: d["machines"]["cpu-small"].__setitem__("backend", "tpu"))
    assert p.startswith("machines.cpu-small.backend: Input tag 'tpu'")


def test_an_error_inside_a_tagged_member_has_no_tag_in_its_path(tmp_path):
    """The path is `workload.metrics[2].name`, not `...metrics[2].log_regex.name`."""
    source = {"type": "log_regex", "name": "runner.wall_seconds", "pattern": "t=(\\S+)"}
    (p,) = _problems(tmp_path, lambda d: d["workload"]["metrics"].append(source))
    assert p.startswith("workload.metrics[2].name: name 'runner.wall_seconds' starts with")
    assert "namespace of the metrics the runner samples" in p


def test_run_written_as_one_string_shows_the_argv_form(tmp_path):
    (p,) = _problems(tmp_path, lambda d: d["workload"].__setitem__("run", "python train.py"))
    assert p.startswith("workload.run: must be an argv list, one element per argument")
    assert '["${python}", "train.py"' in p and "'python train.py'" in p


def test_setup_written_as_one_command_shows_the_list_of_argv_lists(tmp_path):
    (p,) = _problems(tmp_path, lambda d: d["workload"].__setitem__("setup", ["pip", "--version"]))
    assert p.startswith("workload.setup: must be an argv list")
    assert "a list of commands, each an argv list" in p


INT_AXES = """
description: integer axis values
axes:
  seq: [16, 32]
  flag: [true, false]
  model: [a, b]
exclude:
  - match: {seq: 32, model: a}
    reason: too long for a
  - match: {flag: false, seq: [16]}
    reason: flag off only at 32
machines: {cpu: {backend: local}}
machine: cpu
workload: {run: ["true"]}
"""


def test_integer_exclusion_values_match_integer_axis_values(tmp_path):
    path = tmp_path / "ints.yaml"
    path.write_text(INT_AXES)
    plan = expand(load_suite(path), "ints")
    assert sorted(e.id for e in plan.excluded) == [
        "seq=16,flag=false,model=a",
        "seq=16,flag=false,model=b",
        "seq=32,flag=false,model=a",
        "seq=32,flag=true,model=a",
    ]
    assert len(plan.cells) == 4


def test_an_exclusion_value_of_the_wrong_kind_is_one_line_naming_the_axis(tmp_path):
    path = tmp_path / "ints.yaml"
    path.write_text(INT_AXES.replace("{seq: 32, model: a}", "{seq: {x: 1}, model: a}"))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    assert e.value.problems == [
        "exclude[0].match: seq: must be an axis value (a string or number, globs allowed) "
        "or a list of them, got {'x': 1}"
    ]


# -- CLI ------------------------------------------------------------------------------------
def test_plan_params_are_checked_like_the_trigger_form(capsys):
    assert cli.main(["plan", str(SMOKE), "--params", '{"steps": 2}']) == 1
    err = capsys.readouterr().err
    assert f"{SMOKE}: --params: invalid params" in err
    assert "steps: 2 is less than the minimum of 8 (allowed: integer, >= 8, <= 500)" in err
    assert cli.main(["plan", str(SMOKE), "--params", '{"stepz": 20}']) == 1
    assert "stepz: not a param of this suite (params: steps, cells)" in capsys.readouterr().err
    assert cli.main(["plan", str(SMOKE), "--params", '{"steps": 20}']) == 0
    assert "model=tiny-mlp,config=baseline" in capsys.readouterr().out


def test_validate_takes_yml_files_and_folders(tmp_path, capsys):
    shutil.copy(SMOKE, tmp_path / "smoke.yml")
    assert cli.main(["validate", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"ok       {tmp_path / 'smoke.yml'}",
        "1 valid, 0 invalid",
    ]
    # The same DAG id twice (smoke.yaml beside smoke.yml) is refused, naming both files.
    shutil.copy(SMOKE, tmp_path / "smoke.yaml")
    assert cli.main(["validate", str(tmp_path)]) == 1
    assert (
        f"DAG id 'smoke' is already taken by {tmp_path / 'smoke.yaml'}" in capsys.readouterr().err
    )


def test_validate_with_nothing_to_validate_fails(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a suite")
    assert cli.main(["validate", str(tmp_path)]) == 1
    assert f"no suite files (*.yaml, *.yml) in {tmp_path}" in capsys.readouterr().err


def test_a_suite_is_a_name_or_a_path(tmp_path):
    suites = ROOT / "include" / "suites"
    assert resolve_suite("local_smoke", suites) == suites / "local_smoke.yaml"
    assert resolve_suite(str(SMOKE), suites) == SMOKE
    shutil.copy(SMOKE, tmp_path / "other.yml")
    assert resolve_suite("other", tmp_path) == tmp_path / "other.yml"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nope"], "no suite named 'nope' in "),
        (["include/suites/local_smoke.yaml", "--conf", '{"steps": 1}'], "steps: 1 is less than"),
        (["local_smoke", "--conf", "{steps: 1}"], "--conf: invalid params\n  - not JSON"),
        (["local_smoke", "--conf", '{"stepz": 9}'], "stepz: not a param of this suite"),
    ],
)
def test_demo_mistakes_are_one_message_and_nothing_runs(tmp_path, args, expected):
    broken = tmp_path / "broken.yaml"
    broken.write_text("axes: {}\n")
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "accelmatrix.demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_demo_of_an_invalid_suite_file_is_the_suite_error(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("axes: {}\n")
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "accelmatrix.demo", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"INVALID  {broken}: invalid suite\n")
    assert "Traceback" not in proc.stderr
