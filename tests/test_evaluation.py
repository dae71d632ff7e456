"""evaluate_cell with the real Great Expectations: verdict text for passing and failing cells.

GE's import takes several seconds, so it happens once per module (the ``gx`` fixture); every
test then builds real files under tmp_path and evaluates them.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accelmatrix.evaluation import CellOutputs, CheckVerdict, EvaluationReport, evaluate_cell
from accelmatrix.evaluation.checks.training import RUNBOOK_ABOVE, RUNBOOK_BELOW
from accelmatrix.spec.checks import parse_checks

ROOT = Path(__file__).resolve().parents[1]
REPO_INCLUDE = ROOT / "include"

GOOD_LOG = """\
step 0 loss: 1.000000 step_time: 0.0010s
step 1 loss: 0.800000 step_time: 0.0011s
Finished training run
"""

ALL_CHECKS = [
    {"type": "exit_status", "expected": 0},
    {"type": "log_contains", "pattern": "Finished training run"},
    {"type": "log_not_contains", "pattern": r"NCCL timeout|Traceback \(most recent"},
    {"type": "artifact_count", "glob": "out/*.pt.trace.json", "count": 1},
    {"type": "metric_between", "name": "final loss below 1.5", "metric": "loss", "max": 1.5},
    {"type": "final_loss", "target": 0.1, "tolerance": 0.05},
    {"type": "loss_decreasing", "window": 3},
    {
        "type": "step_time_within_bounds",
        "bounds_file": "bounds/step_time_bounds.yaml",
        "benchmark": "tiny-mlp",
    },
]


@pytest.fixture(scope="module", autouse=True)
def gx() -> None:
    """Import GE once for the module (its import logging: test_great_expectations_import_is_quiet)."""
    from accelmatrix.evaluation.gx_suite import import_gx

    import_gx()


def series(name: str, values: list[float], unit: str | None = None) -> list[dict]:
    return [
        {"name": name, "value": v, "step": i, "unit": unit, "source": "test"}
        for i, v in enumerate(values)
    ]


GOOD_METRICS = [
    *series("loss", [1.0, 0.8, 0.6, 0.4, 0.2, 0.12]),
    *series("step_time", [0.05, 0.002, 0.002, 0.003, 0.002], "s"),
]


def make_cell(
    tmp_path: Path,
    *,
    log: str | None = GOOD_LOG,
    status: dict | None = None,
    metrics: list[dict] | None = None,
    files: tuple[str, ...] = ("out/trace.pt.trace.json", "out/metrics.jsonl"),
) -> CellOutputs:
    """Write a cell's outputs as real files, the way collect() leaves them."""
    art = tmp_path / "art"
    files_dir = art / "files"
    for rel in files:
        (files_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (files_dir / rel).write_text("{}")
    files_dir.mkdir(parents=True, exist_ok=True)
    if log is not None:
        (art / "output.log").write_text(log)
    return CellOutputs(
        files_dir=files_dir,
        log_path=art / "output.log",
        status={"exit_code": 0, "timed_out": False} if status is None else status,
        metrics=GOOD_METRICS if metrics is None else metrics,
    )


def evaluate(checks: list[dict], outputs: CellOutputs, **kw) -> EvaluationReport:
    kw.setdefault("include_dir", REPO_INCLUDE)
    return evaluate_cell(parse_checks(checks), outputs, **kw)


def only(report: EvaluationReport) -> CheckVerdict:
    assert len(report.verdicts) == 1
    return report.verdicts[0]


def failing(checks: list[dict], outputs: CellOutputs, **kw) -> CheckVerdict:
    report = evaluate(checks, outputs, **kw)
    verdict = only(report)
    assert not verdict.passed and not report.passed, verdict
    return verdict


# -- passing cell --------------------------------------------------------------------------
def test_passing_cell(tmp_path: Path) -> None:
    report = evaluate(ALL_CHECKS, make_cell(tmp_path), suite_name="smoke/model=tiny-mlp")
    assert report.passed, report.format_table()
    assert [v.type for v in report.verdicts] == [c["type"] for c in ALL_CHECKS]
    assert all(v.passed for v in report.verdicts)
    by_type = {v.type: v for v in report.verdicts}
    assert by_type["metric_between"].name == "final loss below 1.5"
    assert by_type["log_contains"].name == "log_contains[Finished training run]"
    st = by_type["step_time_within_bounds"]
    assert st.expected == "0.0 <= step_time <= 0.5 (bounds tiny-mlp)"
    assert st.observed == "0.002 (median of 5)"
    assert report.data_docs_index is None
    table = report.format_table()
    assert "PASSED: 8/8 check(s) passed" in table
    assert "PASS    exit_status[0]" in table


def test_no_checks_passes_without_great_expectations(tmp_path: Path) -> None:
    report = evaluate([], make_cell(tmp_path), data_docs_dir=tmp_path / "docs")
    assert report.passed and report.verdicts == [] and report.data_docs_index is None


# -- exit_status ---------------------------------------------------------------------------
def test_exit_status_nonzero(tmp_path: Path) -> None:
    v = failing([ALL_CHECKS[0]], make_cell(tmp_path, status={"exit_code": 3, "timed_out": False}))
    assert v.expected == "exit_code == 0, not timed out"
    assert v.observed == "exit_code=3"
    assert v.message == "the workload exited with 3, expected 0"


def test_exit_status_timed_out(tmp_path: Path) -> None:
    status = {"exit_code": -9, "timed_out": True, "signal": 9}
    v = failing([ALL_CHECKS[0]], make_cell(tmp_path, status=status))
    assert v.observed == "timed out, exit_code=-9, signal 9"
    assert "timed out" in v.message


def test_exit_status_expected_nonzero_passes(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, status={"exit_code": 2, "timed_out": False})
    assert evaluate([{"type": "exit_status", "expected": 2}], outputs).passed


def test_workload_never_ran(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, log=None, status=None, metrics=[], files=())
    outputs.status = None
    report = evaluate(ALL_CHECKS, outputs)
    assert not report.passed
    assert not any(v.passed for v in report.verdicts), report.format_table()
    by_type = {v.type: v for v in report.verdicts}
    assert by_type["exit_status"].observed == "never ran (no status)"
    assert by_type["log_contains"].observed == "log missing"
    assert by_type["log_not_contains"].observed == "log missing"
    assert by_type["metric_between"].observed == "missing"
    assert "(no metrics at all)" in by_type["final_loss"].message


# -- log checks ----------------------------------------------------------------------------
def test_log_contains_absent(tmp_path: Path) -> None:
    v = failing([ALL_CHECKS[1]], make_cell(tmp_path, log="step 0\nstep 1\n"))
    assert v.expected == ">= 1 log line(s) containing 'Finished training run'"
    assert v.observed == "0 line(s)"
    assert "need at least 1" in v.message


def test_log_contains_min_count_and_regex(tmp_path: Path) -> None:
    check = {"type": "log_contains", "pattern": r"^step \d+ loss", "regex": True, "min_count": 3}
    v = failing([check], make_cell(tmp_path))
    assert v.expected == r">= 3 log line(s) matching /^step \d+ loss/"
    assert v.observed == "2 line(s)"
    check["min_count"] = 2
    assert evaluate([check], make_cell(tmp_path)).passed


def test_log_contains_missing_log(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, log=None)
    v = failing([ALL_CHECKS[1]], outputs)
    assert v.observed == "log missing"
    assert f"log file {outputs.log_path} does not exist" in v.message


def test_log_not_contains_quotes_first_matching_lines(tmp_path: Path) -> None:
    log = (
        "step 0 loss: 1.0\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3\n'
        "RuntimeError: NCCL timeout after 1800 s\n"
    )
    v = failing([ALL_CHECKS[2]], make_cell(tmp_path, log=log))
    assert v.expected == r"no log line matching /NCCL timeout|Traceback \(most recent/"
    assert v.observed == (
        "2 line(s): Traceback (most recent call last): | RuntimeError: NCCL timeout after 1800 s"
    )
    assert "first at line 2: Traceback (most recent call last):" in v.message


def test_invalid_regex_after_placeholder_resolution_fails_cleanly(tmp_path: Path) -> None:
    check = parse_checks([{"type": "log_not_contains", "pattern": "ok"}])[0]
    check.pattern = "model-(unclosed"  # as if a placeholder resolved to regex syntax
    report = evaluate_cell([check], make_cell(tmp_path), include_dir=REPO_INCLUDE)
    v = only(report)
    assert not v.passed and "invalid regular expression" in v.message


# -- artifact_count ------------------------------------------------------------------------
def test_artifact_count_missing(tmp_path: Path) -> None:
    v = failing([ALL_CHECKS[3]], make_cell(tmp_path, files=("out/metrics.jsonl",)))
    assert v.expected == "files matching 'out/*.pt.trace.json' == 1"
    assert v.observed == "0 file(s)"


def test_artifact_count_range_and_recursive_glob(tmp_path: Path) -> None:
    files = ("ckpt/a.pt", "ckpt/deep/b.pt", "ckpt/deep/er/c.pt", "top.pt")
    outputs = make_cell(tmp_path, files=files)
    check = {"type": "artifact_count", "glob": "ckpt/**/*.pt", "min": 1, "max": 2}
    v = failing([check], outputs)
    assert v.expected == "1 <= files matching 'ckpt/**/*.pt' <= 2"
    assert v.observed == "3 file(s)"
    assert "ckpt/a.pt, ckpt/deep/b.pt, ckpt/deep/er/c.pt" in v.message
    check["max"] = 3
    assert evaluate([check], outputs).passed
    # "**" also matches the top level, and directories never count as files.
    assert evaluate([{"type": "artifact_count", "glob": "**/*.pt", "count": 4}], outputs).passed
    assert evaluate([{"type": "artifact_count", "glob": "ckpt/*", "count": 1}], outputs).passed


# -- metric checks -------------------------------------------------------------------------
def test_metric_between_above_max(tmp_path: Path) -> None:
    metrics = series("loss", [3.0, 2.5])
    v = failing([ALL_CHECKS[4]], make_cell(tmp_path, metrics=metrics))
    assert v.expected == "last(loss) <= 1.5"
    assert v.observed == "2.5"
    assert v.message == "last(loss) = 2.5 is above the maximum 1.5"


def test_metric_between_reduce_and_below_min(tmp_path: Path) -> None:
    check = {"type": "metric_between", "metric": "acc", "min": 0.9, "max": 1.0, "reduce": "mean"}
    v = failing([check], make_cell(tmp_path, metrics=series("acc", [0.5, 0.9, 1.0])))
    assert v.expected == "0.9 <= mean(acc) <= 1.0"
    assert v.observed == "0.8"
    assert "below the minimum 0.9" in v.message


def test_missing_metric_fails(tmp_path: Path) -> None:
    check = {"type": "metric_between", "metric": "accuracy", "min": 0.5}
    v = failing([check], make_cell(tmp_path))
    assert v.observed == "missing"
    assert v.message == "metric 'accuracy' not found; metrics collected: loss, step_time"


def test_nan_metric_fails(tmp_path: Path) -> None:
    metrics = series("loss", [1.0, math.nan, 0.5])
    v = failing([{**ALL_CHECKS[4], "reduce": "max"}], make_cell(tmp_path, metrics=metrics))
    assert v.observed == "nan"
    assert "NaN" in v.message


def test_series_ordered_by_step_and_scalars_only_as_fallback(tmp_path: Path) -> None:
    def row(value: float, step: int | None, source: str) -> dict:
        return {"name": "loss", "value": value, "step": step, "unit": None, "source": source}

    rows = [
        row(0.05, None, "summary"),  # ignored: the series exists
        row(0.1, 2, "jsonl"),
        row(0.9, 0, "jsonl"),
        row(0.7, 2, "log"),  # same step from a second source: the first source wins
    ]
    check = {"type": "metric_between", "metric": "loss", "max": 0.5}
    v = failing([{**check, "reduce": "max"}], make_cell(tmp_path, metrics=rows))
    assert v.observed == "0.9"
    assert evaluate([check], make_cell(tmp_path, metrics=rows)).verdicts[0].observed == "0.1"
    scalars = [row(0.8, None, "summary"), row(0.3, None, "summary")]
    assert evaluate([check], make_cell(tmp_path, metrics=scalars)).passed  # last scalar 0.3


def test_final_loss_off_target(tmp_path: Path) -> None:
    v = failing([ALL_CHECKS[5]], make_cell(tmp_path, metrics=series("loss", [1.0, 0.5])))
    assert v.expected == "|last(loss) - 0.1| <= 0.05"
    assert v.observed == "0.5 (|diff| = 0.4)"
    assert "0.4 away from the target 0.1; tolerance 0.05" in v.message


def test_loss_not_decreasing(tmp_path: Path) -> None:
    metrics = series("loss", [0.5, 0.4, 0.5, 0.6, 0.7, 0.8])
    v = failing([ALL_CHECKS[6]], make_cell(tmp_path, metrics=metrics))
    assert v.expected == "mean(last 3) < mean(first 3) of loss, >= 2 points"
    assert v.observed == "first 0.466667, last 0.7 (6 points)"
    assert "loss did not decrease" in v.message


def test_loss_decreasing_needs_two_points(tmp_path: Path) -> None:
    v = failing([ALL_CHECKS[6]], make_cell(tmp_path, metrics=series("loss", [0.5])))
    assert v.observed == "1 point(s)"
    assert "at least 2" in v.message
    # Two points: the window shrinks to 1 so the two halves do not overlap.
    assert evaluate([ALL_CHECKS[6]], make_cell(tmp_path, metrics=series("loss", [0.5, 0.4]))).passed


def test_diverged_loss_fails_loss_decreasing(tmp_path: Path) -> None:
    metrics = series("loss", [1.0, 0.9, 0.8, math.inf, math.nan, math.nan])
    v = failing([ALL_CHECKS[6]], make_cell(tmp_path, metrics=metrics))
    assert v.observed == "first 0.9, last nan (6 points)"
    assert "NaN values" in v.message


# -- step time -----------------------------------------------------------------------------
def bounds_include(tmp_path: Path) -> Path:
    include = tmp_path / "include"
    (include / "bounds").mkdir(parents=True)
    (include / "bounds" / "b.yaml").write_text(
        "benchmarks:\n"
        "  m: {step_time_lower_bound: 0.1, step_time_upper_bound: 0.2, target_loss: 1}\n"
        "  other: {step_time_lower_bound: 1, step_time_upper_bound: 2}\n"
    )
    return include


STEP_CHECK = {"type": "step_time_within_bounds", "bounds_file": "bounds/b.yaml", "benchmark": "m"}


def test_step_time_above_upper_bound(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, metrics=series("step_time", [0.3, 0.25, 0.3]))
    v = failing([STEP_CHECK], outputs, include_dir=bounds_include(tmp_path))
    assert v.expected == "0.1 <= step_time <= 0.2 (bounds m)"
    assert v.observed == "0.3 (median of 3)"
    assert "above the upper bound" in v.message
    assert RUNBOOK_ABOVE in v.message
    assert (
        "a code change may have introduced a regression: find the cause before landing; "
        "if nothing changed, escalate to the hardware team" in v.message
    )


def test_step_time_below_lower_bound(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, metrics=series("step_time", [0.05]))
    v = failing([STEP_CHECK], outputs, include_dir=bounds_include(tmp_path))
    assert v.observed == "0.05 (median of 1)"
    assert "below the lower bound" in v.message
    assert RUNBOOK_BELOW in v.message
    assert (
        "if this follows an optimisation or dependency update, re-center the bounds; "
        "if nothing changed, widen the confidence interval" in v.message
    )


def test_step_time_metric_missing(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, metrics=series("loss", [1.0]))
    v = failing([STEP_CHECK], outputs, include_dir=bounds_include(tmp_path))
    assert v.observed == "missing"
    assert "metric 'step_time' not found" in v.message


def test_step_time_unknown_benchmark(tmp_path: Path) -> None:
    include = bounds_include(tmp_path)
    v = failing([{**STEP_CHECK, "benchmark": "llama"}], make_cell(tmp_path), include_dir=include)
    assert v.observed == "0.002 (bounds unavailable)"
    assert str(include / "bounds" / "b.yaml") in v.message
    assert "available benchmarks: m, other" in v.message


def test_step_time_missing_bounds_file(tmp_path: Path) -> None:
    include = bounds_include(tmp_path)
    v = failing(
        [{**STEP_CHECK, "bounds_file": "bounds/nope.yaml"}],
        make_cell(tmp_path),
        include_dir=include,
    )
    assert v.message == f"bounds file {include / 'bounds' / 'nope.yaml'} not found"


def test_step_time_malformed_bounds_file(tmp_path: Path) -> None:
    include = bounds_include(tmp_path)
    (include / "bounds" / "b.yaml").write_text("benchmarks: {m: {step_time_upper_bound: x}}")
    v = failing([STEP_CHECK], make_cell(tmp_path), include_dir=include)
    assert "benchmarks.m.step_time_upper_bound" in v.message


# -- report and Data Docs ------------------------------------------------------------------
def test_format_table_lists_failures_with_messages(tmp_path: Path) -> None:
    outputs = make_cell(tmp_path, metrics=series("step_time", [0.3]))
    checks = [ALL_CHECKS[0], STEP_CHECK]
    table = evaluate(checks, outputs, include_dir=bounds_include(tmp_path)).format_table()
    lines = table.splitlines()
    assert lines[0].split() == ["RESULT", "CHECK", "EXPECTED", "OBSERVED"]
    assert lines[2].startswith("PASS    exit_status[0]")
    assert lines[3].startswith("FAIL    step_time_within_bounds[m]")
    assert "FAILED: 1/2 check(s) passed" in table
    assert "FAIL step_time_within_bounds[m]: step_time 0.3 s is above the upper bound" in table
    assert RUNBOOK_ABOVE in table


def test_data_docs(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    outputs = make_cell(tmp_path, metrics=series("loss", [1.0, 2.0]))
    report = evaluate(
        ALL_CHECKS, outputs, data_docs_dir=docs, suite_name="smoke.model=tiny/config=x"
    )
    assert not report.passed
    assert report.data_docs_index == docs / "index.html"
    index = report.data_docs_index.read_text()
    # The title names the cell as it is ("/" is only replaced in GE's store keys), the
    # summary counts checks as the verdict table does, and the failing checks come first.
    assert "<h1>Data Docs of smoke.model=tiny/config=x</h1>" in index
    n_checks = len(report.verdicts)
    failed = [v.name for v in report.verdicts if not v.passed]
    summary = re.search(r'<p id="summary">(.*?)</p>', index).group(1)
    assert summary == (
        f"Validation failed: {len(failed)} of {n_checks} checks failed: {', '.join(failed)}."
    ), (summary, failed)
    assert "expectation" not in summary
    results = re.findall(r'<tr class="(pass|fail)"><td>([^<]*)</td>', index)
    assert results[0][0] == "fail", results
    names = list(dict.fromkeys(name for _, name in results))
    assert set(names[: len(failed)]) == set(failed), names  # failing checks first
    assert {name for k, name in results if k == "fail"} == set(failed)
    # One validation per table: the one-row observations (log, exit status, files) and the
    # per-step metrics table, on which GE computed the final loss and the median step time.
    pages = sorted((docs / "validations").rglob("*.html"), key=lambda p: "steps" in p.parts)
    assert len(pages) == 2, pages
    assert "c00_exit_status" in pages[0].read_text()
    page = pages[1].read_text()
    assert "final_loss[loss]: |last(loss) - 0.1| &lt;= 0.05" in page
    # Air-gapped clusters: nothing in any generated page loads from another machine, and
    # the index is our static page (GE's needs bootstrap-table from a CDN to show a row).
    from accelmatrix.evaluation.offline_docs import external_refs

    for html_file in docs.rglob("*.html"):
        assert external_refs(html_file.read_text()) == [], html_file
    for css in docs.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(https?:)?//", css.read_text()), css
    assert "<script" not in index
    assert "final_loss[loss]" in index and "FAIL" in index and "PASS" in index
    for p in pages:  # links GE's validation pages
        assert p.relative_to(docs).as_posix() in index
    assert f"Data Docs: {docs / 'index.html'}" in report.format_table()
    # Every file a page links is in the site, and the site holds no more than that: GE's
    # builder copied 4 MiB of fonts and GIFs into every cell's site, linked by no page.
    linked: set[Path] = set()
    for html_file in docs.rglob("*.html"):
        for ref in re.findall(r"""(?:src|href)\s*=\s*["']([^"'#?]+)""", html_file.read_text()):
            if "//" not in ref:
                target = (html_file.parent / ref).resolve()
                assert target.is_file(), f"{html_file} links {ref}, which is missing"
                linked.add(target)
    static = {p.resolve() for p in (docs / "static").rglob("*") if p.is_file()}
    assert static and static <= linked, sorted(static - linked)
    assert sum(p.stat().st_size for p in docs.rglob("*") if p.is_file()) < 200_000


def test_data_docs_templates_compile_once_per_process(tmp_path: Path, monkeypatch) -> None:
    """GE builds a new Jinja environment per page; our views share compiled templates, so
    after ``warm_templates`` a cell's Data Docs compile nothing, and the pages are GE's."""
    evaluate(ALL_CHECKS, make_cell(tmp_path / "a"), data_docs_dir=tmp_path / "a" / "docs")
    from accelmatrix.evaluation import docs_views

    compiled = docs_views.warm_templates()
    assert compiled >= 30  # GE 1.x ships ~40 templates and two style sheets
    # Spies, not stubs: every lookup and compile still goes to the real cache.
    compiles: list[str] = []
    lookups: list[str] = []
    real_dump = docs_views.TEMPLATES.dump_bytecode
    real_load = docs_views.TEMPLATES.load_bytecode
    monkeypatch.setattr(
        docs_views.TEMPLATES,
        "dump_bytecode",
        lambda bucket: (compiles.append(bucket.key), real_dump(bucket)),
    )
    monkeypatch.setattr(
        docs_views.TEMPLATES,
        "load_bytecode",
        lambda bucket: (lookups.append(bucket.key), real_load(bucket)),
    )
    docs = tmp_path / "b" / "docs"
    report = evaluate(
        ALL_CHECKS,
        make_cell(tmp_path / "b", metrics=series("loss", [1.0, 2.0])),
        data_docs_dir=docs,
    )
    # Every page's templates come through the shared cache (50 lookups; 16 if only the
    # index page used it)...
    assert len(lookups) >= 30
    assert compiles == []  # ...and every one was there
    assert len(docs_views.TEMPLATES) == compiled
    pages = list((docs / "validations").rglob("*.html"))  # observations and steps tables
    assert len(pages) == 2
    assert any("final_loss[loss]: |last(loss) - 0.1| &lt;= 0.05" in p.read_text() for p in pages)
    assert report.data_docs_index == docs / "index.html"


# In a process of its own: in this one GE is imported already (the module's fixture, or any
# earlier module), and a second import logs nothing whatever the first did. It used to skip
# then, which was always in a serial run.
QUIET_IMPORT = """
import json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
root = logging.getLogger()
root.addHandler(Keep(level=logging.INFO))
root.setLevel(logging.INFO)
assert "great_expectations" not in sys.modules
from accelmatrix.evaluation.gx_suite import import_gx
import_gx()
assert "great_expectations" in sys.modules
print(json.dumps([[r.name, r.getMessage()] for r in records]))
"""


def test_great_expectations_import_is_quiet() -> None:
    out = subprocess.run(  # noqa: S603 - fixed interpreter and code
        [sys.executable, "-c", QUIET_IMPORT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "plugins")},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = json.loads(out.stdout.strip().splitlines()[-1])
    noisy = [
        (name, msg) for name, msg in records if name.startswith(("great_expectations", "alembic"))
    ]
    assert noisy == [], noisy[:3]


def test_importing_the_package_stays_light() -> None:
    code = (
        "import sys, accelmatrix.evaluation, accelmatrix.spec.checks;"
        "heavy = [m for m in ('great_expectations', 'pandas', 'scipy') if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run(  # noqa: S603 - fixed interpreter and code
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "plugins")},
    )
    assert json.loads(out.stdout.replace("'", '"')) == []


def test_format_table_wraps_long_values_instead_of_cutting_them() -> None:
    """Found: EXPECTED and OBSERVED were cut with an ellipsis in the task log."""
    from accelmatrix.contracts.check_verdicts import CheckVerdict, EvaluationReport

    expected = "all of: " + ", ".join(
        f"tests/test_mod{i}.py::test_case_{i} passed" for i in range(6)
    )
    observed = (
        "failed: tests/test_accelerator.py::test_tpu_topology_matches_the_machine (AssertionError)"
    )
    v = CheckVerdict("junit", "junit", False, expected, observed, "1 test failed")
    table = EvaluationReport([v], False, None, 0.1).format_table()
    assert "…" not in table and "..." not in table
    lines = table.splitlines()
    assert lines[2].startswith("FAIL    junit")
    body = lines[2 : lines.index(next(x for x in lines if x.startswith("FAILED:")))]
    assert len(body) > 1 and all(not x.startswith(("PASS", "FAIL")) for x in body[1:])
    # Every word of both values is in the table, in order, column by column.
    expected_col = " ".join(x[lines[0].index("EXPECTED") :].split("  ")[0].strip() for x in body)
    assert " ".join(expected.split()) == " ".join(expected_col.split())
    observed_col = "".join(x[lines[0].index("OBSERVED") :].strip() + " " for x in body)
    assert " ".join(observed_col.split()).replace(" ", "") == observed.replace(" ", "")
