"""Bounds files: interoperable load/write, clear errors, the bounds computation, and the
file with the stored (re-centered) bounds applied: in force for readers, and exported as
text that keeps the file's comments."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from accelmatrix.contracts.series_records import BoundsRecord
from accelmatrix.evaluation.bounds import (
    BenchmarkBounds,
    BoundsError,
    BoundsFile,
    bounds_key,
    compute_bounds,
    export_text,
    load_bounds,
    write_bounds,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "include" / "bounds" / "step_time_bounds.yaml"

THEIRS = """\
benchmarks:
  llama-3-8b:
    name: Llama 3.0 8B
    step_time_lower_bound: 2.681
    step_time_upper_bound: 2.789
    confidence_interval: 0.054
    average: 2.735
    sample_size: 427
    target_loss: 1.9
    loss_tolerance: 0.05
    owner: {team: perf, oncall: [a, b]}
  new-model:
    name: Only a loss target so far
    target_loss: 2.5
metadata:
  query_start: '2025-01-01T00:00:00Z'
  query_end: 2025-02-01 00:00:00
  confidence_level: 0.999
  generator: their-tool 3.1
schema_version: 2
"""


def test_example_file_loads() -> None:
    bounds = load_bounds(EXAMPLE)
    assert {"tiny-mlp", "tiny-wide", "e2e-tiny-mlp-ddp2"} <= set(bounds.benchmarks)
    for key in bounds.benchmarks:
        b = bounds.get(key)
        assert (b.step_time_lower_bound, b.step_time_upper_bound) == (0.0, 0.5)
        assert b.model_extra and {"target_loss", "loss_tolerance"} <= set(b.model_extra)
    assert bounds.metadata and bounds.metadata.confidence_level == 0.999


def test_round_trip_preserves_every_field(tmp_path: Path) -> None:
    src = tmp_path / "in.yaml"
    src.write_text(THEIRS)
    out = tmp_path / "sub" / "out.yaml"
    write_bounds(out, load_bounds(src))
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(THEIRS)
    # No "confidence_interval: null" etc. invented for the benchmark that had no bounds.
    assert "null" not in out.read_text()


def test_updating_bounds_keeps_non_performance_fields(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(THEIRS)
    bounds = load_bounds(path)
    fresh = compute_bounds([2.7, 2.8, 2.75, 2.72], 0.999)
    bounds.benchmarks["llama-3-8b"] = BenchmarkBounds(
        **{**bounds.benchmarks["llama-3-8b"].model_dump(exclude_unset=True), **fresh}
    )
    write_bounds(path, bounds)
    again = yaml.safe_load(path.read_text())["benchmarks"]["llama-3-8b"]
    assert again["sample_size"] == 4
    assert again["target_loss"] == 1.9
    assert again["owner"] == {"team": "perf", "oncall": ["a", "b"]}


def test_missing_benchmark_lists_the_available_ones(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(THEIRS)
    with pytest.raises(
        BoundsError,
        match=r"'llama-3-70b' not found in .*b\.yaml; available "
        r"benchmarks: llama-3-8b, new-model",
    ):
        load_bounds(path).get("llama-3-70b", source=path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "not found"),
        ("benchmarks: [unclosed", "is not valid YAML"),
        ("- a list", "must be a mapping"),
        ("metadata: {}", "benchmarks: Field required"),
        (
            "benchmarks: {m: {step_time_upper_bound: fast}}",
            "benchmarks.m.step_time_upper_bound: Input should be a valid number",
        ),
        (
            "benchmarks: {m: {step_time_lower_bound: 2, step_time_upper_bound: 1}}",
            "benchmarks.m: Value error, step_time_lower_bound (2.0) must be <=",
        ),
    ],
)
def test_load_errors_name_the_file_and_field(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "bounds.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(BoundsError) as info:
        load_bounds(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_write_from_scratch(tmp_path: Path) -> None:
    bf = BoundsFile(benchmarks={"m": BenchmarkBounds(**compute_bounds([1.0, 3.0], 0.95))})
    write_bounds(tmp_path / "b.yaml", bf)
    assert load_bounds(tmp_path / "b.yaml").get("m").sample_size == 2


# t quantiles from statistical tables: t(0.975; 1) = 12.7062, t(0.975; 3) = 3.18245,
# t(0.975; 4) = 2.77645.
def test_compute_bounds_t_interval_dominates_and_lower_clamps_at_zero() -> None:
    # n=2: mean 2, s = sqrt(2), t half-width = 12.7062 * sqrt(2) / sqrt(2) = 12.7062.
    got = compute_bounds([1.0, 3.0], 0.95)
    assert got["confidence_interval"] == pytest.approx(12.7062, rel=1e-4)
    assert got["step_time_upper_bound"] == pytest.approx(2 + 12.7062, rel=1e-4)
    assert got["step_time_lower_bound"] == 0.0
    assert (got["average"], got["sample_size"]) == (2.0, 2)


def test_compute_bounds_range_dominates() -> None:
    # mean 3, s = sqrt(2.5); t half-width = 2.77645 * 1.58114 / 2.23607 = 1.96324 < max-mean = 2.
    got = compute_bounds([1, 2, 3, 4, 5], 0.95)
    assert got["confidence_interval"] == pytest.approx(1.96324, rel=1e-4)
    assert got["step_time_lower_bound"] == pytest.approx(1.0)
    assert got["step_time_upper_bound"] == pytest.approx(5.0)


def test_compute_bounds_relative_floor_dominates() -> None:
    # mean 100, s = sqrt(0.02/3) = 0.0816497; t half-width = 3.18245 * 0.0816497 / 2 = 0.129923;
    # 1.5% of the mean = 1.5 wins.
    got = compute_bounds([100.0, 100.0, 100.1, 99.9], 0.95)
    assert got["confidence_interval"] == pytest.approx(0.129923, rel=1e-4)
    assert got["step_time_lower_bound"] == pytest.approx(98.5)
    assert got["step_time_upper_bound"] == pytest.approx(101.5)


def test_compute_bounds_identical_samples() -> None:
    got = compute_bounds([2.0, 2.0, 2.0], 0.999)
    assert got["confidence_interval"] == 0.0
    assert (got["step_time_lower_bound"], got["step_time_upper_bound"]) == pytest.approx(
        (1.97, 2.03)
    )


@pytest.mark.parametrize(
    ("samples", "confidence", "message"),
    [
        ([1.0], 0.95, "at least 2 samples"),
        ([1.0, 2.0], 1.0, r"confidence must be in \(0, 1\)"),
        ([1.0, float("nan")], 0.95, "finite"),
    ],
)
def test_compute_bounds_rejects_bad_input(
    samples: list[float], confidence: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        compute_bounds(samples, confidence)


# -- stored bounds over the file ------------------------------------------------------------
def _row(lo, hi, file_lo, file_hi, **more) -> BoundsRecord:
    """A stored row in force (bounds [lo, hi]) made over the file's [file_lo, file_hi]."""
    fields = {
        "id": 1,
        "file": "bounds/b.yaml",
        "benchmark": "b",
        "reason": "maintenance",
        "by": "accelmatrix-maintenance",
        "at": datetime(2026, 3, 1, tzinfo=UTC),
        **more,
    }
    return BoundsRecord(
        step_time_lower_bound=lo,
        step_time_upper_bound=hi,
        file_lower_bound=file_lo,
        file_upper_bound=file_hi,
        **fields,
    )


def test_bounds_key_is_relative_to_the_include_dir(tmp_path: Path) -> None:
    (tmp_path / "inc" / "bounds").mkdir(parents=True)
    f = tmp_path / "inc" / "bounds" / "b.yaml"
    assert bounds_key(f, tmp_path / "inc") == "bounds/b.yaml"
    assert bounds_key(tmp_path / "inc" / "x" / ".." / "bounds" / "b.yaml", tmp_path / "inc") == (
        "bounds/b.yaml"
    )
    assert bounds_key(f, tmp_path / "other") == f.resolve().as_posix()


def test_export_edits_values_in_place_and_adds_missing_fields(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("# header\n" + THEIRS)
    stored = {
        "llama-3-8b": _row(2.8, 2.9, 2.681, 2.789, average=2.85, sample_size=30),
        "new-model": _row(1e-05, 0.5, None, None),  # no bounds in the file yet: added
        "gone": _row(1.0, 2.0, None, None),
    }
    text, changes = export_text(path, stored)
    assert text.startswith("# header\nbenchmarks:\n  llama-3-8b:\n    name: Llama 3.0 8B\n")
    assert "    step_time_lower_bound: 2.8\n" in text and "    sample_size: 30\n" in text
    assert "    step_time_lower_bound: 1.0e-05\n" in text  # read back as a float, not a string
    raw = yaml.safe_load(text)
    want = yaml.safe_load(THEIRS)
    want["benchmarks"]["llama-3-8b"].update(
        step_time_lower_bound=2.8, step_time_upper_bound=2.9, average=2.85, sample_size=30
    )
    want["benchmarks"]["new-model"].update(step_time_lower_bound=1e-05, step_time_upper_bound=0.5)
    assert raw == want
    assert set(changes) == {"llama-3-8b", "new-model"}
    assert path.read_text() == "# header\n" + THEIRS  # printed, never written


def test_export_of_a_file_changed_since_the_row_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(THEIRS)
    text, changes = export_text(path, {"llama-3-8b": _row(2.8, 2.9, 2.0, 2.1)})
    assert (text, changes) == (THEIRS, {})


def test_export_of_a_flow_style_file_is_printed_whole(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(
        "# gone\nbenchmarks: {m: {step_time_lower_bound: 1, step_time_upper_bound: 2}}\n"
    )
    text, changes = export_text(path, {"m": _row(1.5, 2.5, 1, 2)})
    assert text.startswith("# b.yaml with the stored bounds applied; its comments could not")
    assert yaml.safe_load(text)["benchmarks"]["m"] == {
        "step_time_lower_bound": 1.5,
        "step_time_upper_bound": 2.5,
    }
    assert changes == {"m": {"step_time_lower_bound": 1.5, "step_time_upper_bound": 2.5}}


def test_export_of_the_example_files_keeps_every_comment(tmp_path: Path) -> None:
    for path in sorted((ROOT / "include" / "bounds").glob("*.yaml")):
        bounds = load_bounds(path)
        name, b = next(
            (n, b) for n, b in bounds.benchmarks.items() if b.step_time_upper_bound is not None
        )
        row = _row(
            b.step_time_lower_bound + 0.25,
            b.step_time_upper_bound + 0.25,
            b.step_time_lower_bound,
            b.step_time_upper_bound,
        )
        text, changes = export_text(path, {name: row})
        assert set(changes) == {name}
        original = path.read_text().splitlines()
        comments = [ln for ln in original if ln.lstrip().startswith("#")]
        assert [ln for ln in text.splitlines() if ln.lstrip().startswith("#")] == comments
        assert len(text.splitlines()) == len(original)  # values replaced, no line added
        got = yaml.safe_load(text)["benchmarks"][name]
        assert got["step_time_upper_bound"] == b.step_time_upper_bound + 0.25
