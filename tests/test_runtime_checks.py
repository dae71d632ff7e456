"""The runtime workload (env checks + papermill) and the checks that read what it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest

from accelmatrix.evaluation import CellOutputs
from accelmatrix.evaluation.checks.runtime import notebook_errors
from accelmatrix.evaluation.observe import plan_checks
from accelmatrix.spec.checks import parse_checks

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "include" / "workloads" / "runtime"
SYSTEM_PYTHON = "/usr/bin/python3"


def run_workload(tmp: Path, runtime_python: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "ACCELMATRIX_MACHINE": "cpu-1",
        "ACCELMATRIX_MACHINE_RESOURCES": json.dumps({"cpu": 1}),
        "ACCELMATRIX_AXIS_RUNTIME": "rt",
    }
    return subprocess.run(  # noqa: S603
        [sys.executable, str(WORKLOADS / "runtime_tests.py"), "--runtime-python", runtime_python]
        + ["--work-dir", str(tmp), "--out-dir", str(tmp / "out"), *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("broken")
    proc = run_workload(
        tmp,
        sys.executable,
        "--python-version",
        "3.11",
        "--notebooks",
        "broken_division.ipynb",
    )
    return tmp, proc


def test_a_raising_notebook_is_reported_with_its_cell_and_traceback(broken_run):
    tmp, proc = broken_run
    assert proc.returncode == 1
    out = proc.stdout
    # Cell 3 of the source notebook (markdown 0, parameters 1, code 2, code 3).
    assert "NOTEBOOK FAILED: broken_division.ipynb cell 3 (In [" in out
    assert "raised ZeroDivisionError: division by zero" in out
    assert "| mean = sum(empty) / len(empty)" in out  # source excerpt
    assert "----> 2 mean = sum(empty) / len(empty)" in out  # traceback, ANSI codes stripped
    assert "\x1b[" not in out
    executed = tmp / "out" / "notebooks" / "broken_division.ipynb"
    assert executed.exists() and executed.with_suffix(".html").exists()
    assert "ZeroDivisionError" in executed.with_suffix(".html").read_text()


def test_notebook_error_extraction_skips_papermill_cells(broken_run):
    tmp, _ = broken_run
    errors = notebook_errors(tmp / "out" / "notebooks" / "broken_division.ipynb")
    assert len(errors) == 1
    e = errors[0]
    assert (e.cell, e.ename, e.evalue) == (3, "ZeroDivisionError", "division by zero")
    assert "sum(empty) / len(empty)" in e.source and "----> 2" in e.traceback
    assert e.describe().startswith(
        "broken_division.ipynb cell 3 (In [" + str(e.execution_count) + "]) raised "
        "ZeroDivisionError: division by zero (source: empty = [] / mean = sum(empty)"
    )
    bad = tmp / "not_a_notebook.ipynb"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not a readable notebook"):
        notebook_errors(bad)


def _plans(tmp: Path, checks: list[dict]):
    # The workload's out/ dir stands in for the collected files dir (same relative paths).
    return plan_checks(
        parse_checks(checks),
        CellOutputs(files_dir=tmp, log_path=tmp / "output.log", status=None, metrics=[]),
        include_dir=ROOT / "include",
    )


def test_notebooks_check_fails_naming_the_cell_and_the_missing_notebook(broken_run):
    tmp, _ = broken_run
    (p,) = _plans(tmp, [{"type": "notebooks", "expected": "broken_division.ipynb, other.ipynb"}])
    assert p.columns == {
        "c00_notebooks__executed": 1,
        "c00_notebooks__failing": 1,
        "c00_notebooks__missing": 1,
    }
    assert "broken_division.ipynb cell 3" in p.failure and "ZeroDivisionError" in p.failure
    assert "other.ipynb was not executed" in p.failure


def test_env_report_under_another_interpreter_and_its_failed_items(tmp_path):
    if not Path(SYSTEM_PYTHON).exists():
        needs.missing("venv", f"no system python at {SYSTEM_PYTHON} (apt-get install -y python3)")
    # The distribution's python has no torch: the runtime's import check must fail.
    proc = run_workload(
        tmp_path,
        SYSTEM_PYTHON,
        "--python-version",
        "2.7",
        "--tools",
        "tar,no-such-tool-xyz",
        "--imports",
        "json,torch",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "env_report.json").read_text())
    assert report["python"] == SYSTEM_PYTHON
    items = {i["name"]: i for i in report["items"]}
    assert items["import json"]["passed"] and items["tool tar"]["passed"]
    assert not items["import torch"]["passed"]
    assert "No module named 'torch'" in items["import torch"]["observed"]
    assert items["GPUs visible (cpu-1 declares 0)"]["passed"]  # CPU machine, no GPU seen

    (p,) = _plans(tmp_path, [{"type": "report_items", "path": "out/env_report.json"}])
    assert p.columns == {"c00_report_items__items": 6, "c00_report_items__failed_items": 3}
    assert p.failure.startswith("3 of 6 item(s) failed: python version: expected 2.7.*, found 3.")
    assert "tool no-such-tool-xyz: expected on PATH, found not found on PATH" in p.failure
    assert "import torch: expected importable, found ModuleNotFoundError" in p.failure

    (missing,) = _plans(tmp_path, [{"type": "report_items", "path": "out/nope.json"}])
    assert missing.columns["c00_report_items__items"] is None
    assert "not found in the collected files" in missing.failure


def test_device_visibility_compares_with_what_the_machine_declares(tmp_path):
    env = {
        **os.environ,
        # No GPU visible, on a GPU host too (it used to skip there): the machine declares 4.
        "CUDA_VISIBLE_DEVICES": "",
        "ACCELMATRIX_MACHINE": "gpu-4",
        "ACCELMATRIX_MACHINE_RESOURCES": '{"gpus": 4}',
    }
    subprocess.run(  # noqa: S603
        [sys.executable, str(WORKLOADS / "env_checks.py"), "--python-version", "3"]
        + ["--out", str(tmp_path / "r.json")],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (dev,) = [
        i for i in json.loads((tmp_path / "r.json").read_text())["items"] if "GPU" in i["name"]
    ]
    assert dev["name"] == "GPUs visible (gpu-4 declares 4)" and dev["expected"] == "4"
    assert dev["passed"] is False and dev["observed"].startswith("torch.cuda: 0")
