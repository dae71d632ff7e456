"""runtime_matrix end to end with `dag.test()`: support exclusions, env checks, papermill
notebooks (one raising), resource samples in the metrics table.

The suite is the shipped include/suites/runtime_matrix.yaml with its runtimes trimmed to
one cell each (the full matrix is what `python -m accelmatrix.demo runtime_matrix` runs),
and the torch runtime given the notebook that raises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_dag_local import run_dag, store

from accelmatrix import settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BAD = "runtime=torch-venv,machine=cpu-1"
GOOD = "runtime=system-python,machine=cpu-1"


def test_runtime_matrix_end_to_end(airflow_db, tmp_path, monkeypatch):
    suite = yaml.safe_load((ROOT / "include" / "suites" / "runtime_matrix.yaml").read_text())
    torch_rt = suite["axes"]["runtime"]["torch-venv"]
    torch_rt["notebooks"] = "numpy_stats.ipynb,broken_division.ipynb"
    torch_rt["machines"] = ["cpu-1"]
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "runtime_matrix.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))

    state, run_id, tis = run_dag("runtime_matrix")
    s = store()
    cells = {c.cell_id: c for c in s.get_cells("runtime_matrix", run_id)}
    assert state == "failed"  # the raising notebook turns the run red

    # Unsupported pairs never run; the plan says why.
    assert cells["runtime=torch-venv,machine=cpu-2"].excluded_reason == (
        "runtime torch-venv does not support machine cpu-2 (supported: cpu-1)"
    )
    assert cells["runtime=system-python,machine=cpu-2"].state == "excluded"

    # The distribution's python: environment as declared, no notebooks, passed.
    assert cells[GOOD].state == "passed", cells[GOOD]
    checks = s.checks_frame("runtime_matrix", run_id)
    good = checks[checks.cell_id == GOOD].set_index("check_name")
    assert good.loc["environment", "observed"] == "8 of 8 item(s) passed"
    good_art = settings.cell_artifacts_dir("runtime_matrix", run_id, GOOD)
    report = json.loads((good_art / "files" / "out" / "env_report.json").read_text())
    assert report["python"] == "/usr/bin/python3"

    # The torch runtime: one notebook passed, one raised. The cell fails, the run task's
    # log (output.log, streamed into it) names the cell with its source and traceback.
    bad = cells[BAD]
    assert bad.state == "run_failed" and bad.exit_code == 1
    assert tis[("cpu-1.run", BAD)] == "failed"
    assert "notebooks ran without error: broken_division.ipynb cell 3" in bad.message
    art = settings.cell_artifacts_dir("runtime_matrix", run_id, BAD)
    log = (art / "output.log").read_text()
    assert "NOTEBOOK FAILED: broken_division.ipynb cell 3" in log
    assert "ZeroDivisionError" in log and "----> 2 mean = sum(empty) / len(empty)" in log
    assert "notebook numpy_stats.ipynb: passed" in log
    nb_dir = art / "files" / "out" / "notebooks"
    for name in ("numpy_stats", "broken_division"):
        assert (nb_dir / f"{name}.ipynb").exists() and (nb_dir / f"{name}.html").exists()
    failed = set(checks[(checks.cell_id == BAD) & (~checks.passed)].check_name)
    assert failed == {
        "exit_status[0]",
        "notebooks ran without error",
        "no notebook failure in the log",
    }
    assert tis[("cpu-1.teardown", BAD)] == "success"

    # Resource usage sampled while the workload ran is in the metrics table.
    metrics = s.metrics_frame("runtime_matrix", run_id)
    m = metrics[metrics.cell_id == BAD]
    assert len(m[m.name == "runner.rss_mb"]) >= 3  # several samples of a ~10 s workload
    assert m[m.name == "runner.cpu_percent"].value.max() > 10
    peak = m[m.name == "runner.peak_rss_mb"].value.iloc[0]
    assert 20 < peak < 3072
    assert not (metrics.name == "runner.gpu_util_percent").any()  # no GPU here: nothing recorded
    status = json.loads((art / "status.json").read_text())
    assert status["gpu_sampling"] == "no GPU: nvidia-smi not found"
