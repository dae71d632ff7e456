"""Pages never green when red (issue 40): a run where one of three cells failed its checks.

The cells go through the real lifecycle on the local backend (real workloads, the SQLite
results store, Great Expectations at evaluate and at the gate). The run's table is complete
(every cell reported once, each with a verdict), so its own Data Docs validation passes; the
run's Data Docs, its report and the matrix page must still lead with "1 of 3 cells failed".
"""

from __future__ import annotations

import html
import re
import textwrap

import pytest
from test_step_failures import _evaluate, _run

from accelmatrix import lifecycle
from accelmatrix.reports.verdicts import RUN_TABLE_SCOPE, CellVerdicts

SUITE = """
description: three cells; n=b never prints the line its check wants
axes:
  n: {a: 1, b: 2, c: 3}
machines:
  cpu: {backend: local}
machine: cpu
workload:
  setup: []
  run: ["${python}", "-c", "import sys; print('done' if sys.argv[1] not in ('2', 'b') else 'no')", "${axis.n}"]
  timeout: 120
checks:
  - {type: log_contains, pattern: done}
"""


@pytest.mark.slow(15)
def test_a_red_runs_data_docs_report_and_page_lead_with_the_failed_cell(accel_home, tmp_path):
    suite = tmp_path / "red.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    ref = lifecycle.RunRef(dag_id="red", run_id="manual__red")
    cells = lifecycle.plan_run(str(suite), ref, {})
    assert [c.id for c in cells] == ["n=a", "n=b", "n=c"]
    for cell in cells:
        resource = _run(cell, ref)
        lifecycle.collect(cell, resource, ref)
        _evaluate(cell, ref)
        lifecycle.teardown(cell, resource, ref)
    with pytest.raises(lifecycle.CellFailed):
        lifecycle.gate(cells, ref, str(suite))
    run_dir = ref.artifacts(cells[0].id).parent

    # The run's Data Docs: its own checks passed, and the page says so only after it says
    # which cell failed and what the page validates.
    docs = (run_dir / "data_docs" / "index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", docs))
    lead = text.index("The run's cells: 1 of 3 cells failed: n=b (failed its checks)")
    scope = text.index(RUN_TABLE_SCOPE.split(":")[0])
    own = text.index("The run's table: validation passed")
    assert lead < scope < own
    assert "Validation passed" not in text
    assert 'data-passed="false"' in docs

    # The run report leads with it too.
    report = (run_dir / "index.html").read_text()
    assert report.index("1 of 3 cells failed: n=b") < report.index("<table")

    # And the matrix page, above its legend and grid.
    from accelmatrix.ui import model, render

    view = model.load_run_view(lifecycle.results_store(), "red", ref.run_id)
    page = render.run_page(view, ui_base="", app_base="/accelmatrix")
    assert page.index('id="cells-verdict"') < page.index('class="legend"')
    assert "1 of 3 cells failed: n=b (failed its checks)" in html.unescape(page)


def test_the_verdict_line_counts_what_fails_a_run() -> None:
    v = CellVerdicts.of(
        [
            ("a", "passed", False),
            ("b", "failed", False),
            ("c", "infra_failed", False),
            ("d", "failed", True),  # quarantined: never fails the run
            ("e", "excluded", False),  # not part of the run
            ("f", None, False),  # never reported
        ]
    )
    assert not v.passed and v.total == 5
    assert v.line() == (
        "3 of 5 cells failed: b (failed its checks), c (infra_failed), f (missing)"
        " (1 quarantined cell also failed, not counted)"
    )
    assert CellVerdicts.of([("a", "passed", False)]).line() == "all 1 cell passed"
    many = CellVerdicts.of([(f"c{i}", "failed", False) for i in range(8)])
    assert many.line().endswith("c4 (failed its checks) and 3 more")


def test_a_failed_evaluate_ends_with_one_line_naming_the_cell_and_why(accel_home, tmp_path):
    """The evaluate task's last log line (its failure) names the cell and each failed
    check with expected against observed: on-call reads the why without the table."""
    suite = tmp_path / "red.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    ref = lifecycle.RunRef(dag_id="red", run_id="manual__why")
    cell = lifecycle.plan_run(str(suite), ref, {})[1]
    assert cell.id == "n=b"
    resource = _run(cell, ref)
    lifecycle.collect(cell, resource, ref)
    with pytest.raises(lifecycle.CellFailed) as info:
        lifecycle.record_evaluation(cell, ref, lifecycle.run_checks(cell, ref))
    line = str(info.value)
    assert line == (
        "cell n=b failed: 1 of 2 check(s) failed: log_contains[done] "
        "(expected >= 1 log line(s) containing 'done', observed 0 line(s))"
    )
    assert "\n" not in line and line.count("n=b") == 1
    lifecycle.teardown(cell, resource, ref)


def test_the_failure_line_is_bounded() -> None:
    from accelmatrix.contracts.check_verdicts import CheckVerdict
    from accelmatrix.steps.evaluate.work import WHY_WIDTH, failure_line

    failed = [
        CheckVerdict(f"c{i}", "t", False, expected="x" * 500, observed="y", message="")
        for i in range(5)
    ]
    line = failure_line("m=a", "failed", failed, 9)
    assert line.startswith("cell m=a failed: 5 of 9 check(s) failed: c0 (expected xxx")
    assert line.endswith(", and 2 more") and len(line) < 4 * (WHY_WIDTH + 10) + 60
    assert failure_line("m=a", "infra_failed", [], 2, "stockout in us-east5") == (
        "cell m=a infra_failed: 0 of 2 check(s) failed; stockout in us-east5"
    )


def test_the_run_page_and_logs_show_the_params_a_run_ran_with(accel_home, tmp_path, caplog):
    """A backfill from Airflow's form without "Override parameters" runs every date with
    the params' defaults: the plan log, the gate log and the matrix page show the conf and
    the params in effect, so on-call can tell it from what was intended."""
    import logging

    suite = tmp_path / "red.yaml"
    raw = textwrap.dedent(SUITE) + "params:\n  steps: {type: integer, default: 20, minimum: 8}\n"
    suite.write_text(raw)
    ref = lifecycle.RunRef(dag_id="red", run_id="backfill__2026-11-01T00:00:00+00:00")
    caplog.set_level(logging.INFO, logger="accelmatrix")
    cells = lifecycle.plan_run(str(suite), ref, {"steps": 20}, conf={})
    assert 'run conf: {}; params in effect: {"steps": 20}' in caplog.text
    from accelmatrix.ui import model, render

    view = model.load_run_view(lifecycle.results_store(), "red", ref.run_id)
    page = render.run_page(view, ui_base="", app_base="/accelmatrix")
    assert '<span class="run-params" id="run-params">params steps=20</span>' in page
    caplog.clear()
    with pytest.raises(lifecycle.CellFailed):  # nothing ran: every cell is missing a verdict
        lifecycle.gate(cells, ref, str(suite))
    assert 'params of this run (its conf over the suite\'s defaults): {"steps": 20}' in caplog.text
