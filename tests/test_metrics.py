"""Trace parsing and metric sources on small hand-written files (no torch, fast)."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from accelmatrix.metrics.profiler import TraceError, step_events, step_time_from_trace
from accelmatrix.metrics.sources import (
    METRIC_SOURCE_TYPES,
    JsonlSource,
    ProfilerTraceSource,
    collect_metrics,
    parse_metric_sources,
    write_train_metrics,
)


def step_event(n: int, ts_us: float, pid: int | str = 1, tid: int | str = 1) -> dict:
    return {"ph": "X", "name": f"ProfilerStep#{n}", "ts": ts_us, "dur": 10, "pid": pid, "tid": tid}


def write_trace(path: Path, events: list[dict], *, wrap: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events} if wrap else events))
    return path


# --------------------------------------------------------------------------------------------
# profiler
# --------------------------------------------------------------------------------------------
def test_median_of_gaps_with_three_or_more(tmp_path: Path) -> None:
    # Gaps 1 ms, 1 ms, 10 ms (an outlier step): the median ignores the outlier.
    starts = [0, 1000, 2000, 12000]
    trace = write_trace(tmp_path / "t.json", [step_event(i, t) for i, t in enumerate(starts)])
    st = step_time_from_trace(trace)
    assert st.method == "median"
    assert st.step_time == pytest.approx(0.001)
    assert st.gaps == pytest.approx([0.001, 0.001, 0.010])
    assert st.steps == [0, 1, 2, 3]


def test_mean_of_gaps_below_three(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "t.json", [step_event(5, 0), step_event(6, 1000), step_event(7, 4000)]
    )
    st = step_time_from_trace(trace)
    assert st.method == "mean"
    assert st.step_time == pytest.approx(0.002)  # mean of 1 ms and 3 ms


def test_events_are_ordered_by_start_and_other_events_ignored(tmp_path: Path) -> None:
    events = [
        step_event(2, 2000),
        {"ph": "X", "name": "aten::mm", "ts": 1500, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "i", "name": "ProfilerStep#9", "ts": 1700, "pid": 1, "tid": 1},  # not complete
        {"ph": "X", "name": "ProfilerStep#x", "ts": 1800, "pid": 1, "tid": 1},  # no number
        step_event(0, 0),
        step_event(1, 1000),
    ]
    st = step_time_from_trace(write_trace(tmp_path / "t.json", events))
    assert st.steps == [0, 1, 2]
    assert st.step_time == pytest.approx(0.001)


def test_lowest_pid_wins_when_several_rows_have_steps(tmp_path: Path) -> None:
    # Host process (pid 4242) steps every 5 ms, device 0 (pid 0) every 2 ms.
    host = [step_event(i, i * 5000, pid=4242, tid=4242) for i in range(4)]
    dev1 = [step_event(i, i * 3000, pid=1, tid=7) for i in range(4)]
    dev0 = [step_event(i, i * 2000, pid=0, tid=7) for i in range(4)]
    trace = write_trace(tmp_path / "t.json", host + dev1 + dev0)
    assert step_time_from_trace(trace).step_time == pytest.approx(0.002)


def test_bare_event_array_and_gzip_are_read(tmp_path: Path) -> None:
    events = [step_event(i, i * 1000) for i in range(3)]
    assert step_time_from_trace(write_trace(tmp_path / "a.json", events, wrap=False)).steps == [
        0,
        1,
        2,
    ]
    gz = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert step_time_from_trace(gz).step_time == pytest.approx(0.001)


@pytest.mark.parametrize("events", [[], [step_event(3, 0)]], ids=["none", "one"])
def test_fewer_than_two_step_events_is_an_error(tmp_path: Path, events: list[dict]) -> None:
    trace = write_trace(tmp_path / "few.json", events)
    with pytest.raises(TraceError, match=r"few\.json.*at least 2"):
        step_time_from_trace(trace)
    assert len(step_events(trace)) == len(events)


@pytest.mark.parametrize(
    "content", ['{"traceEvents": [', '{"other": 1}', "42", ""], ids=str.__len__
)
def test_malformed_trace_names_the_file(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "broken.pt.trace.json"
    bad.write_text(content)
    with pytest.raises(TraceError, match="broken.pt.trace.json"):
        step_time_from_trace(bad)


def test_missing_trace_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nothere.json.*not found"):
        step_time_from_trace(tmp_path / "nothere.json")


def test_modules_stay_import_light() -> None:
    """DAG parsing imports the suite models: neither module may pull pandas or torch."""
    code = (
        "import sys, accelmatrix.metrics.sources, accelmatrix.metrics.profiler\n"
        "heavy = {'pandas', 'torch', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    plugins = str(Path(__file__).resolve().parents[1] / "plugins")
    subprocess.run(  # noqa: S603 - fixed argv, no shell
        [sys.executable, "-c", code], check=True, env={"PYTHONPATH": plugins}, timeout=60
    )


# --------------------------------------------------------------------------------------------
# sources: validation
# --------------------------------------------------------------------------------------------
def test_all_types_parse_with_their_defaults() -> None:
    srcs = parse_metric_sources(
        [
            {"type": "json", "path": "train_metrics.json"},
            {"type": "jsonl", "path": "logs/metrics.jsonl"},
            {"type": "log_regex", "name": "loss", "pattern": r"loss:\s*([0-9.eE+-]+)"},
            {"type": "profiler_trace"},
            {"type": "junit_xml", "glob": "out/junit-*.xml"},
        ]
    )
    assert [s.type for s in srcs] == list(METRIC_SOURCE_TYPES)
    assert isinstance(srcs[1], JsonlSource) and srcs[1].step_key == "step"
    assert srcs[2].series is False
    assert isinstance(srcs[3], ProfilerTraceSource)
    assert (srcs[3].glob, srcs[3].name) == ("**/*.pt.trace.json", "step_time")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "json", "path": "/etc/passwd"}, "path '/etc/passwd' must be relative"),
        ({"type": "jsonl", "path": "a/../../x.jsonl"}, "path 'a/../../x.jsonl' must not contain"),
        ({"type": "json", "path": "..\\x.json"}, "must not contain '..'"),
        ({"type": "profiler_trace", "glob": "/tmp/*.json"}, "glob '/tmp/\\*.json' must be"),
        ({"type": "profiler_trace", "glob": "../**/*.json"}, "glob '../\\*\\*/\\*.json' must not"),
        ({"type": "json", "path": ""}, "path must not be empty"),
        ({"type": "profiler_trace", "glob": "**.pt.trace.json"}, "whole path component"),
        ({"type": "log_regex", "name": "x", "pattern": "loss: ("}, "not a valid regular exp"),
        ({"type": "log_regex", "name": "x", "pattern": r"loss: \d+"}, "exactly one capture gr"),
        ({"type": "log_regex", "name": "x", "pattern": r"(a)(b)"}, "it has 2"),
        ({"type": "log_regex", "name": "bad name", "pattern": "(x)"}, "name"),
        ({"type": "json", "path": "m.json", "prefixx": "a"}, "Extra inputs are not permitted"),
        ({"type": "csv", "path": "m.csv"}, "does not match any of the expected tags"),
    ],
)
def test_invalid_sources_are_rejected_clearly(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_metric_sources([raw])


# --------------------------------------------------------------------------------------------
# sources: collection
# --------------------------------------------------------------------------------------------
def collect(raw: list[dict], files_dir: Path, log_path: Path | None = None):
    return collect_metrics(parse_metric_sources(raw), files_dir=files_dir, log_path=log_path)


def test_json_numeric_values_become_prefixed_scalars(tmp_path: Path) -> None:
    (tmp_path / "train_metrics.json").write_text(
        '{"model": "mlp", "train_runtime": 1.5, "steps": 20, "ok": true, "mfu": null,'
        ' "final_loss": NaN}'
    )
    got = collect(
        [{"type": "json", "path": "train_metrics.json", "prefix": "t_", "units": {"steps": "1"}}],
        tmp_path,
    )
    assert got.diagnostics == []
    by_name = {r["name"]: r for r in got.rows}
    assert set(by_name) == {"t_train_runtime", "t_steps", "t_final_loss"}  # not bool/str/null
    assert by_name["t_steps"] == {
        "name": "t_steps",
        "value": 20.0,
        "step": None,
        "unit": "1",
        "source": "json:train_metrics.json",
    }
    assert math.isnan(by_name["t_final_loss"]["value"])  # kept, not dropped


def test_jsonl_gives_series_and_reports_bad_lines(tmp_path: Path) -> None:
    lines = [
        '{"step": 0, "loss": 1.0, "step_time_s": 0.5, "tag": "x"}',
        "",
        '{"step": 1, "loss": Infinity, "step_time_s": 0.4}',
        "not json",
        "[1, 2]",
        '{"loss": NaN}',
        '{"step": 3, "loss": 0.2',  # truncated by a kill
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    got = collect([{"type": "jsonl", "path": "metrics.jsonl"}], tmp_path)
    loss = [(r["step"], r["value"]) for r in got.rows if r["name"] == "loss"]
    assert loss[0] == (0, 1.0) and loss[1] == (1, math.inf)
    assert loss[2][0] == 2 and math.isnan(loss[2][1])  # no step key: the record index
    assert [(r["step"], r["value"]) for r in got.rows if r["name"] == "step_time_s"] == [
        (0, 0.5),
        (1, 0.4),
    ]
    assert {r["source"] for r in got.rows} == {"jsonl:metrics.jsonl"}
    text = "\n".join(got.diagnostics)
    assert "malformed line 4" in text and "line 5 is not a JSON object" in text
    assert "line 6 has no integer 'step'" in text and "malformed line 7" in text


def test_log_regex_series_and_last_match(tmp_path: Path) -> None:
    log = tmp_path / "workload.log"
    log.write_text(
        "starting\nstep 0 loss: 2.5 x\nstep 1 loss: 1.25\nnoise loss: -\nstep 2 loss: 5e-1\n"
    )
    pattern = r"loss:\s*([0-9.eE+-]+)"
    got = collect(
        [
            {"type": "log_regex", "name": "loss", "pattern": pattern, "series": True},
            {"type": "log_regex", "name": "final_loss", "pattern": pattern, "unit": "nats"},
        ],
        tmp_path,
        log,
    )
    series = [(r["step"], r["value"]) for r in got.rows if r["name"] == "loss"]
    assert series == [(0, 2.5), (1, 1.25), (3, 0.5)]  # step = match index; '-' is not a number
    (final,) = [r for r in got.rows if r["name"] == "final_loss"]
    assert (final["value"], final["step"], final["unit"]) == (0.5, None, "nats")
    assert final["source"] == "log_regex:final_loss"
    assert got.diagnostics == ["log_regex:loss: match 2: '-' is not a number"]


def test_log_regex_keeps_nan_and_reports_no_match(tmp_path: Path) -> None:
    log = tmp_path / "workload.log"
    log.write_text("loss: 1.0\nloss: nan\n")
    got = collect(
        [
            {"type": "log_regex", "name": "final_loss", "pattern": r"loss: (\S+)"},
            {"type": "log_regex", "name": "acc", "pattern": r"acc: (\S+)"},
        ],
        tmp_path,
        log,
    )
    assert len(got.rows) == 1 and math.isnan(got.rows[0]["value"])
    assert got.diagnostics == ["log_regex:acc: no line of the log matches 'acc: (\\\\S+)'"]


def test_profiler_trace_source(tmp_path: Path) -> None:
    write_trace(
        tmp_path / "prof" / "w0.pt.trace.json", [step_event(i, i * 2000) for i in range(3, 8)]
    )
    got = collect([{"type": "profiler_trace", "name": "st"}], tmp_path)
    assert got.diagnostics == []
    rows = {r["name"]: r for r in got.rows}
    assert rows["st"]["value"] == pytest.approx(0.002) and rows["st"]["unit"] == "s"
    assert rows["st_steps"]["value"] == 5.0
    assert rows["st"]["source"] == "profiler_trace:prof/w0.pt.trace.json"


@pytest.mark.parametrize("count", [0, 2])
def test_profiler_trace_needs_exactly_one_file(tmp_path: Path, count: int) -> None:
    for i in range(count):
        write_trace(tmp_path / f"r{i}" / "t.pt.trace.json", [step_event(0, 0), step_event(1, 9)])
    got = collect([{"type": "profiler_trace"}], tmp_path)
    assert got.rows == []
    (diag,) = got.diagnostics
    assert "expected exactly one file matching '**/*.pt.trace.json'" in diag
    assert f"found {count}" in diag


def test_profiler_trace_with_too_few_steps_still_counts_them(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.pt.trace.json", [step_event(3, 0)])
    got = collect([{"type": "profiler_trace"}], tmp_path)
    assert [(r["name"], r["value"]) for r in got.rows] == [("step_time_steps", 1.0)]
    assert "at least 2" in got.diagnostics[0]


def test_missing_and_malformed_files_are_diagnostics_not_exceptions(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "bad.pt.trace.json").write_text("{")
    (tmp_path / "adir.jsonl").mkdir()
    got = collect(
        [
            {"type": "json", "path": "missing.json"},
            {"type": "json", "path": "bad.json"},
            {"type": "json", "path": "list.json"},
            {"type": "jsonl", "path": "adir.jsonl"},
            {"type": "log_regex", "name": "x", "pattern": "(x)"},
            {"type": "profiler_trace"},
        ],
        tmp_path,
        log_path=None,
    )
    assert got.rows == []
    text = "\n".join(got.diagnostics)
    assert "json:missing.json: file not found" in text
    assert "json:bad.json: malformed JSON" in text
    assert "json:list.json: expected a JSON object, got list" in text
    assert "jsonl:adir.jsonl: adir.jsonl is not a regular file" in text
    assert "log_regex:x: no workload log" in text
    assert "bad.pt.trace.json: malformed trace JSON" in text
    assert len(got.diagnostics) == 6


def test_symlinks_out_of_the_files_dir_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"token": 123}')
    write_trace(outside / "x.pt.trace.json", [step_event(0, 0), step_event(1, 5)])
    files = tmp_path / "files"
    files.mkdir()
    (files / "m.json").symlink_to(outside / "secret.json")
    (files / "t.pt.trace.json").symlink_to(outside / "x.pt.trace.json")
    got = collect([{"type": "json", "path": "m.json"}, {"type": "profiler_trace"}], files)
    assert got.rows == []
    assert "resolves outside the collected files dir" in got.diagnostics[0]
    assert "found 0" in got.diagnostics[1]


def test_hostile_json_is_a_diagnostic(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text('{"n": ' + "9" * 5000 + "}")  # over int digit limit
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "\n")
    (tmp_path / "t.pt.trace.json").write_text('{"traceEvents": [' + "[" * 100_000 + "]}")
    got = collect(
        [
            {"type": "json", "path": "big.json"},
            {"type": "jsonl", "path": "deep.jsonl"},
            {"type": "profiler_trace"},
        ],
        tmp_path,
    )
    assert got.rows == []
    assert "json:big.json: malformed JSON" in got.diagnostics[0]
    assert "malformed line 1" in got.diagnostics[1]
    assert "malformed trace JSON" in got.diagnostics[-1]


def test_diagnostics_are_capped_per_source(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text("garbage\n" * 500)
    got = collect([{"type": "jsonl", "path": "m.jsonl"}], tmp_path)
    assert len(got.diagnostics) == 22  # 20 lines shown, then the summaries
    assert "jsonl:m.jsonl: no records" in got.diagnostics
    assert "jsonl:m.jsonl: 480 more problem(s) omitted" in got.diagnostics


def test_same_metric_from_two_sources_is_one_error_and_the_first_is_kept(tmp_path: Path) -> None:
    """The store holds one value per (name, step): the second source's values would be
    lost, so they are an error naming both sources, never a crash of the store."""
    (tmp_path / "m.jsonl").write_text('{"step": 0, "loss": 1}\n{"step": 1, "loss": 0.5}\n')
    log = tmp_path / "w.log"
    log.write_text("loss: 1\nloss: 0.5\n")
    got = collect(
        [
            {"type": "jsonl", "path": "m.jsonl"},
            {"type": "log_regex", "name": "loss", "pattern": r"loss: (\S+)", "series": True},
        ],
        tmp_path,
        log,
    )
    assert got.diagnostics == []
    assert got.errors == [
        "metric 'loss' comes from both jsonl:m.jsonl and log_regex:loss at step 0 (and 1 "
        "more value(s)): kept the first value, dropped the other(s); one (name, step) must "
        "have one value"
    ]
    assert [(r["step"], r["source"]) for r in got.rows] == [
        (0, "jsonl:m.jsonl"),
        (1, "jsonl:m.jsonl"),
    ]


# --------------------------------------------------------------------------------------------
# train_metrics.json
# --------------------------------------------------------------------------------------------
def test_write_train_metrics_summary(tmp_path: Path) -> None:
    rows = [
        {"name": "loss", "value": 2.0, "step": 0, "unit": None, "source": "jsonl:m"},
        {"name": "loss", "value": 0.5, "step": 9, "unit": None, "source": "jsonl:m"},
        {"name": "loss", "value": 0.7, "step": 4, "unit": None, "source": "jsonl:m"},
        {"name": "train_runtime", "value": 12.5, "step": None, "unit": None, "source": "json:t"},
        {"name": "step_time", "value": 0.25, "step": None, "unit": "s", "source": "trace"},
    ]
    out = tmp_path / "sub" / "train_metrics.json"
    written = write_train_metrics(rows, out, {"model": "llama-3-8b"})
    on_disk = json.loads(out.read_text())
    assert (
        on_disk
        == written
        == {
            "model": "llama-3-8b",
            "train_runtime": 12.5,
            "step_execution_time": 0.25,
            "mfu": None,
            "final_loss": 0.5,
        }
    )
    assert [p.name for p in out.parent.iterdir()] == ["train_metrics.json"]  # no temp left


def test_write_train_metrics_without_data_keeps_nan(tmp_path: Path) -> None:
    rows = [{"name": "loss", "value": math.nan, "step": 3, "unit": None, "source": "x"}]
    written = write_train_metrics(rows, tmp_path / "t.json")
    assert written["step_execution_time"] is None and written["model"] is None
    assert math.isnan(written["final_loss"])
    # Strict JSON on disk (bare NaN refused), and the json source reads it back as NaN.
    text = (tmp_path / "t.json").read_text()
    assert (
        json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))["final_loss"] == "NaN"
    )
    got = collect([{"type": "json", "path": "t.json"}], tmp_path)
    assert math.isnan(got.values("final_loss")[0])
