"""The culprit report's op-level diff, wired: a re-test session keeps one trace per build
(backends/interleave.py, planned by spec.followup), history.culprits.culprit_profile finds and diffs
them when the re-test names a culprit, and the alert carries the top ops."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from accelmatrix import settings
from accelmatrix.backends import interleave
from accelmatrix.contracts.change_point_records import Confirmation
from accelmatrix.history.culprits.culprit_profile import PROFILE_KEY, attach, build_dir
from accelmatrix.metrics.source_models import parse_metric_sources
from accelmatrix.notifications.transport import _profile_lines
from accelmatrix.spec.followup_plan import PROFILES_DIR, Followup, expand_followup, session_cell_id
from accelmatrix.spec.loader import load_suite
from accelmatrix_testkit.chrome_traces import SynthOp, make_ops, synth_trace

ROOT = Path(__file__).resolve().parents[1]
WRITE = (
    "import os, pathlib; p = pathlib.Path('out'); p.mkdir(exist_ok=True); "
    "(p / 'step.pt.trace.json').write_text(os.environ['WHO'] + os.environ['ACCELMATRIX_SAMPLE'])"
)


def test_the_driver_keeps_per_build_traces_of_each_build(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    plan = {
        "order": [0, 1, 1, 0, 0, 1, 1, 0],
        "runs": [
            {"build": "n-1", "argv": [sys.executable, "-c", WRITE], "env": {"WHO": "a"}},
            {"build": "n/2", "argv": [sys.executable, "-c", WRITE], "env": {"WHO": "b"}},
        ],
        "keep": {"glob": "out/*.pt.trace.json", "per_build": 3, "into": PROFILES_DIR},
    }
    assert interleave.main([json.dumps(plan)]) == 0
    kept = tmp_path / PROFILES_DIR
    # the first 3 samples of each build, interleaved as run (a: 0, 3, 4; b: 1, 2, 5)
    assert {p.name: p.read_text() for p in (kept / "n-1").iterdir()} == {
        "0-step.pt.trace.json": "a0", "3-step.pt.trace.json": "a3", "4-step.pt.trace.json": "a4",
    }  # fmt: skip
    assert {p.name: p.read_text() for p in (kept / "n_2").iterdir()} == {
        "1-step.pt.trace.json": "b1", "2-step.pt.trace.json": "b2", "5-step.pt.trace.json": "b5",
    }  # fmt: skip
    # the later samples' trace stays where the workload wrote it (the last one's)
    assert (tmp_path / "out" / "step.pt.trace.json").read_text() == "a7"


def test_a_suite_with_traces_plans_sessions_that_keep_them() -> None:
    suite = load_suite(ROOT / "include" / "suites" / "nightly_perf.yaml")
    traced = suite.model_copy(
        update={
            "workload": suite.workload.model_copy(
                update={
                    "metrics": [
                        *suite.workload.metrics,
                        *parse_metric_sources(
                            [{"type": "profiler_trace", "glob": "out/*.pt.trace.json"}]
                        ),
                    ]
                }
            )
        }
    )
    fu = Followup(
        kind="confirm", confirmation=1, round=1, cells=["model=small"],
        builds=["nightly-2026-03-06", "nightly-2026-03-07"], pairs=2,
    )  # fmt: skip
    (cell,) = expand_followup(traced, "nightly_perf", fu, params={"slow_from": "2026-03-07"}).cells
    plan = json.loads(cell.workload.run[3])
    assert plan["keep"] == {"glob": "out/*.pt.trace.json", "per_build": 3, "into": PROFILES_DIR}
    assert f"{PROFILES_DIR}/**" in cell.workload.artifacts
    five = traced.model_copy(
        update={
            "workload": traced.workload.model_copy(
                update={
                    "metrics": [
                        *suite.workload.metrics,
                        *parse_metric_sources(
                            [{"type": "profiler_trace", "glob": "out/*.pt.trace.json",
                              "profiled_samples": 5}]
                        ),
                    ]
                }
            )
        }
    )  # fmt: skip
    (cell5,) = expand_followup(five, "nightly_perf", fu, params={"slow_from": "2026-03-07"}).cells
    assert json.loads(cell5.workload.run[3])["keep"]["per_build"] == 5
    with pytest.raises(Exception, match="profiled_samples"):
        parse_metric_sources([{"type": "profiler_trace", "profiled_samples": 0}])
    (plain,) = expand_followup(suite, "nightly_perf", fu, params={"slow_from": "2026-03-07"}).cells
    assert "keep" not in json.loads(plain.workload.run[3])


def _session_traces(root: Path, run_id: str, cell: str, build: str, data: bytes) -> None:
    d = root / "nightly_perf" / run_id / session_cell_id(cell, 1) / "files" / PROFILES_DIR
    (d / build_dir(build)).mkdir(parents=True, exist_ok=True)
    (d / build_dir(build) / "0-step.pt.trace.json").write_bytes(data)


def _row(decision_keys: list[str]) -> tuple[Confirmation, dict]:
    row = Confirmation(
        id=1, dag_id="nightly_perf", group_id=1, state="found",
        run_ids=["accelmatrix_bisect__1_0"], round=1,
        good_build="n-05", suspect_build="n-07", last_good="n-05", culprit="n-06",
        targets=[{"cell_id": c, "metric": "step_time"} for c in decision_keys],
    )  # fmt: skip
    decision = {f"{c}|step_time": {"verdict": "new_level", "change": 0.05} for c in decision_keys}
    return row, decision


def _slow_culprit(tmp_path: Path, monkeypatch) -> SynthOp:
    """A bisect session's kept traces: the culprit n-06 runs its costliest op 40 % slower
    than the last good n-05. That op."""
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path))
    assert settings.artifacts_dir() == tmp_path
    ops = make_ops(np.random.default_rng(2), n=12, max_calls=6)
    slow = max(ops, key=lambda o: o.us * o.calls)
    run = "accelmatrix_bisect__1_0"
    _session_traces(tmp_path, run, "model=small", "n-05", synth_trace(ops, steps=30, seed=1))
    scaled = synth_trace(ops, steps=30, seed=2, scale={slow.name: 1.4})
    _session_traces(tmp_path, run, "model=small", "n-06", scaled)
    return slow


def test_a_culprit_gets_the_diff_of_its_traces_and_the_alert_the_top_ops(
    tmp_path: Path, monkeypatch
) -> None:
    slow = _slow_culprit(tmp_path, monkeypatch)
    row, decision = _row(["model=small", "model=big"])
    attach(row, decision)
    prof = decision["model=small|step_time"][PROFILE_KEY]
    assert prof["verdict"] == "op" and prof["cause"]["op"] == slow.name
    assert (prof["good"], prof["bad"]) == ("n-05", "n-06")
    assert decision["model=small|step_time"]["verdict"] == "new_level"  # the verdict stands
    assert PROFILE_KEY not in decision["model=big|step_time"]  # no traces kept there
    (line,) = _profile_lines(decision)
    assert line.startswith("*Ops* n-05 -> n-06: step +") and slow.name in line.splitlines()[1]


def test_a_broken_trace_is_one_line_in_the_alert(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path))
    ops = make_ops(np.random.default_rng(2), n=6, max_calls=3)
    run = "accelmatrix_bisect__1_0"
    _session_traces(tmp_path, run, "model=small", "n-05", synth_trace(ops, steps=5, seed=1))
    _session_traces(tmp_path, run, "model=small", "n-06", synth_trace(ops, steps=5)[:999])
    row, decision = _row(["model=small"])
    attach(row, decision)
    err = decision["model=small|step_time"][PROFILE_KEY]["error"]
    assert err.startswith("no op-level diff: ") and "truncated trace JSON" in err
    (line,) = _profile_lines(decision)
    assert line.startswith("*Ops* n-05 -> n-06: _no op-level diff:") and "\n" not in line


@pytest.mark.parametrize("missing", ["n-05", "n-06"])
def test_one_build_without_a_trace_says_which(tmp_path: Path, monkeypatch, missing: str) -> None:
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path))
    ops = make_ops(np.random.default_rng(2), n=6, max_calls=3)
    other = "n-06" if missing == "n-05" else "n-05"
    _session_traces(
        tmp_path, "accelmatrix_bisect__1_0", "model=small", other, synth_trace(ops, steps=5)
    )
    row, decision = _row(["model=small"])
    attach(row, decision)
    err = decision["model=small|step_time"][PROFILE_KEY]["error"]
    assert err == f"no op-level diff: no profiler trace kept for build {missing}"


def test_the_report_line_names_the_cause_and_the_top_op(tmp_path: Path, monkeypatch) -> None:
    from accelmatrix.history.change_points.report import confirmation_line

    slow = _slow_culprit(tmp_path, monkeypatch)
    row, decision = _row(["model=small"])
    attach(row, decision)
    decision["model=small|step_time"]["attribution"] = {"summary": "the code: 6 of 12 cells moved"}
    line = confirmation_line(
        msgspec.structs.replace(row, id=1, group_id=2, state="found", decision=decision)
    )
    assert "; first bad build n-06 (last good n-05); cause: the code; top op " + slow.name in line
    assert "of the regression)" in line
