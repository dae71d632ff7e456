"""Great Expectations judges the cell's metrics table: every step, with the offending rows
named. Each test writes a training run's ``metrics.jsonl`` with one fault in it, collects it
as the collect step does (``collect_metrics``) and evaluates the cell's checks with Great
Expectations (``evaluate_cell``): the fault's cell fails naming the steps, a clean cell
passes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from accelmatrix.evaluation import CellOutputs, EvaluationReport, evaluate_cell
from accelmatrix.evaluation.check_plan import steps_text
from accelmatrix.evaluation.metrics_table import MetricsTable
from accelmatrix.metrics.sources import collect_metrics, parse_metric_sources
from accelmatrix.spec.checks import parse_checks

STEPS = 100


def _records(**faults: object) -> list[dict]:
    """100 steps of a healthy run: loss falls from 2 towards 0.1, a step takes ~10 ms."""
    out = []
    for step in range(STEPS):
        out.append({"step": step, "loss": 2.0 * math.exp(-step / 30) + 0.1, "step_time": 0.010})
    return out


def _cell(tmp_path: Path, records: list[dict]) -> tuple[CellOutputs, object]:
    files = tmp_path / "files"
    files.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r).replace("NaN", '"NaN"') for r in records]
    (files / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    collected = collect_metrics(
        parse_metric_sources([{"type": "jsonl", "path": "metrics.jsonl"}]),
        files_dir=files,
        log_path=None,
    )
    assert collected.errors == []
    log = tmp_path / "output.log"
    log.write_text("done\n")
    outputs = CellOutputs(
        files_dir=files,
        log_path=log,
        status={"exit_code": 0, "timed_out": False},
        metrics=collected.rows,
    )
    return outputs, collected


def _evaluate(tmp_path: Path, checks: list[dict], records: list[dict], **kw) -> EvaluationReport:
    outputs, _ = _cell(tmp_path, records)
    return evaluate_cell(parse_checks(checks), outputs, include_dir=tmp_path, **kw)


EACH_LOSS = {"type": "metric_between", "metric": "loss", "min": 0, "max": 5, "reduce": "each"}
COMPLETE = {"type": "steps_complete", "metrics": ["loss", "step_time"], "steps": STEPS}
STEP_TIME = {
    "type": "metric_between",
    "metric": "step_time",
    "max": 0.02,
    "reduce": "each",
    "mostly": 0.95,
}


def test_a_clean_run_passes_every_table_check(tmp_path: Path) -> None:
    report = _evaluate(
        tmp_path,
        [EACH_LOSS, COMPLETE, STEP_TIME, {**EACH_LOSS, "reduce": "median"}],
        _records(),
    )
    assert report.passed, report.format_table()
    each, complete, *_ = report.verdicts
    assert each.observed == "0 of 100 step(s) outside"
    assert complete.observed == "all 100 step(s) complete"


def test_nan_at_step_37_that_recovers_fails_and_names_the_step(tmp_path: Path) -> None:
    records = _records()
    records[37]["loss"] = math.nan
    last = {"type": "metric_between", "metric": "loss", "max": 1.5}  # reduce: last
    report = _evaluate(tmp_path, [EACH_LOSS, COMPLETE, {**last, "reduce": "max"}, last], records)
    each, complete, by_max, by_last = report.verdicts
    assert not each.passed
    assert each.message == "1 of 100 step(s) of loss outside the range: NaN at step 37"
    assert not complete.passed
    assert complete.message == "loss: NaN at 37"
    assert not by_max.passed and by_max.observed == "nan"
    assert "NaN at step 37" in by_max.message
    # The last step recovered: a check of the last value alone has nothing to say.
    assert by_last.passed


def test_spikes_on_every_fifth_step_fail_each_step_though_the_median_is_normal(
    tmp_path: Path,
) -> None:
    records = _records()
    for r in records[::5]:
        r["step_time"] = 0.080  # 8x
    median = {"type": "metric_between", "metric": "step_time", "max": 0.02, "reduce": "median"}
    report = _evaluate(tmp_path, [median, STEP_TIME, {**STEP_TIME, "mostly": 0.75}], records)
    by_median, mostly_95, mostly_75 = report.verdicts
    assert by_median.passed  # the fault the old checks could not see
    assert not mostly_95.passed
    assert mostly_95.observed == "20 of 100 step(s) outside"
    assert mostly_95.message == (
        "20 of 100 step(s) of step_time outside the range (mostly 0.95 allows 5): "
        "steps 0, 5, 10, 15, 20, ... (20 of 100): 0.08, 0.08, 0.08, 0.08, 0.08, ..."
    )
    assert mostly_75.passed  # 80 % in range is enough for mostly 0.75


def test_lost_steps_are_named_as_a_range(tmp_path: Path) -> None:
    records = [r for r in _records() if not 40 <= r["step"] <= 59]
    report = _evaluate(tmp_path, [COMPLETE, EACH_LOSS], records)
    complete, each = report.verdicts
    assert not complete.passed
    assert complete.message == "loss: missing 40-59; step_time: missing 40-59"
    assert complete.observed == "40 faulty step(s)"
    assert each.passed  # every step that was logged is in range: only completeness fails


def test_repeated_steps_are_collapsed_by_collect_and_named_by_steps_complete(
    tmp_path: Path,
) -> None:
    records = _records()
    resumed = [dict(r, loss=r["loss"] + 0.01) for r in records[30:40]]
    records = records[:40] + resumed + records[40:]  # a resume logs 30-39 again
    outputs, collected = _cell(tmp_path, records)
    assert collected.collapsed == {"loss": list(range(30, 40)), "step_time": list(range(30, 40))}
    assert collected.collapsed_rows == 20
    loss = {r["step"]: r["value"] for r in collected.rows if r["name"] == "loss"}
    assert loss[35] == pytest.approx(records[45]["loss"])  # the last value logged is kept
    report = evaluate_cell(parse_checks([COMPLETE]), outputs, include_dir=tmp_path)
    (complete,) = report.verdicts
    assert not complete.passed
    assert complete.message == "loss: repeated 30-39; step_time: repeated 30-39"


def test_warm_up_steps_are_skipped_by_skip_first(tmp_path: Path) -> None:
    records = _records()
    for r in records[:5]:
        r["step_time"] = 1.5  # compilation
    strict = {**STEP_TIME, "mostly": 1.0}
    report = _evaluate(tmp_path, [strict, {**strict, "skip_first": 5}], records)
    all_steps, after_warm_up = report.verdicts
    assert not all_steps.passed
    assert "steps 0-4 (5 of 100)" in all_steps.message
    assert after_warm_up.passed
    assert after_warm_up.expected == "each step of step_time <= 0.02, after 5 warm-up step(s)"


def test_a_nan_row_counts_as_a_failing_row_under_mostly(tmp_path: Path) -> None:
    records = _records()
    for r in records[10:15]:
        r["step_time"] = 0.080  # 5 spikes: exactly what mostly 0.95 allows
    assert _evaluate(tmp_path / "a", [STEP_TIME], records).passed
    records[50]["step_time"] = math.nan  # one more failing row, not a skipped one
    (verdict,) = _evaluate(tmp_path / "b", [STEP_TIME], records).verdicts
    assert not verdict.passed
    assert verdict.observed == "6 of 100 step(s) outside"
    assert verdict.message.endswith(
        "steps 10-14 (5 of 100): 0.08, 0.08, 0.08, 0.08, 0.08; NaN at step 50"
    )


def test_step_time_bounds_judge_each_step_with_mostly(tmp_path: Path) -> None:
    (tmp_path / "bounds.yaml").write_text(
        "benchmarks:\n  m: {step_time_lower_bound: 0.005, step_time_upper_bound: 0.02}\n"
    )
    records = _records()
    for r in records[::10]:
        r["step_time"] = 0.5
    check = {"type": "step_time_within_bounds", "bounds_file": "bounds.yaml", "benchmark": "m"}
    report = _evaluate(tmp_path, [check, {**check, "mostly": 0.95}], records)
    median_only, per_step = report.verdicts
    assert median_only.passed
    assert median_only.observed == "0.01 (median of 100)"
    assert not per_step.passed
    assert per_step.observed == "0.01 (median of 100); 10 of 100 step(s) outside"
    assert per_step.message.startswith("10 of 100 step(s) outside the bounds (mostly 0.95): ")
    assert per_step.perf["value"] == 0.01  # the median GE computed goes to perf history


def test_steps_may_be_templated_and_a_bad_value_stops_the_plan(tmp_path: Path) -> None:
    from accelmatrix.spec.templating import render_tree

    raw = {**COMPLETE, "steps": "${params.steps}"}
    parse_checks([raw])  # a placeholder is valid in the suite
    rendered = render_tree(raw, {"params.steps": "100"})
    assert _evaluate(tmp_path / "ok", [rendered], _records()).passed
    (short,) = _evaluate(tmp_path / "short", [{**rendered, "steps": "120"}], _records()).verdicts
    assert short.message == "loss: missing 100-119; step_time: missing 100-119"


def test_data_docs_show_the_offending_steps(tmp_path: Path) -> None:
    records = _records()
    records[37]["loss"] = math.nan
    report = _evaluate(tmp_path, [EACH_LOSS], records, data_docs_dir=tmp_path / "docs")
    index = report.data_docs_index.read_text()
    assert "step=37: inf" in index or "step=37: nan" in index, index


def test_steps_text_collapses_runs_and_caps() -> None:
    assert steps_text([40, 41, 42, 37]) == "37, 40-42"
    assert steps_text(list(range(5, 100, 5)), of=98) == "5, 10, 15, 20, 25, ... (19 of 98)"


def test_table_pivot_marks_sparse_metrics_and_repeats() -> None:
    rows = [
        {"name": "loss", "value": 1.0, "step": 0, "source": "a"},
        {"name": "loss", "value": 0.9, "step": 1, "source": "a", "repeats": 2},
        {"name": "acc", "value": 0.5, "step": 1, "source": "a"},
        {"name": "mfu", "value": 0.4, "step": None, "source": "b"},
    ]
    table = MetricsTable(rows, [range(0, 3)])
    assert table.steps["step"].tolist() == [0, 1, 2]
    assert table.steps["loss__logged"].tolist() == [True, True, False]
    assert table.steps["loss__repeats"].tolist() == [1, 2, 0]
    assert table.steps["acc__logged"].tolist() == [False, True, False]
    assert table.scalars.to_dict("list") == {"metric": ["mfu"], "seq": [0], "value": [0.4]}
    assert table.rows("loss").index.tolist() == [0, 1]
    warm = table.rows("loss", skip_first=1)
    assert warm.mask.tolist() == [False, True, False]
    assert table.view(warm, "nulls") == "loss (after 1 warm-up, nulls)"
    assert table.steps["loss (after 1 warm-up, nulls)"].tolist() == [0.0, 0.9, 0.0]
    assert table.rows("nothing") is None
