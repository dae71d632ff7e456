"""Compare any two builds on demand: `python -m accelmatrix compare` and the REST conf block
`accelmatrix_compare`, run for real with dag.test() on the local backend: one session cell
per selected cell (both builds on one machine, interleaved), the comparison written beside
the run's report; bad requests are one message naming the field, and nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelmatrix.history.retests.compare import DIFFERENT, SAME, UNKNOWN
from accelmatrix.spec.followup_plan import COMPARE_KEY
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.params import check_run_conf
from accelmatrix.spec.plan import PlanError

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "include" / "suites" / "nightly_perf.yaml"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"base": "a", "head": "a"}, "base and head are the same build"),
        ({"base": "a"}, "accelmatrix_compare.head: Field required"),
        ({"base": "a", "head": "b", "pairs": 3}, "accelmatrix_compare.pairs"),
        ({"base": "a", "head": "b", "cells": ["model=big"]}, "matches no cell id"),
    ],
)
def test_a_bad_request_is_refused_before_anything_runs(block: dict, message: str) -> None:
    suite = load_suite(SUITE)
    with pytest.raises(PlanError, match=message):
        check_run_conf(suite, "nightly_perf", {COMPARE_KEY: block}, "test")


@pytest.mark.integration
@pytest.mark.slow(60)
def test_cli_compares_two_builds_on_one_machine_and_prints_json(
    airflow_db, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelmatrix import settings
    from accelmatrix.cli import main
    from accelmatrix.results.store import ResultsStore

    argv = ["compare", "nightly_perf", "--base", "nightly-2026-03-06"]
    argv += ["--head", "nightly-2026-03-07", "--pairs", "8", "--json"]
    # The workload's own 5 % step from slow_from on, 1 % build noise: slower or unknown,
    # never "same".
    rc = main([*argv, "--params", json.dumps({"slow_from": "2026-03-07"})])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    data = json.loads(out[out.index("{\n") :])
    assert (data["base"], data["head"], data["machines"]) == (
        "nightly-2026-03-06",
        "nightly-2026-03-07",
        1,
    )
    (r,) = data["results"]
    c = r["comparison"]
    assert (r["cell_id"], r["metric"]) == ("model=small", "step_time")
    assert c["pairs"] == c["n_base"] == c["n_head"] == 8
    assert c["ci_low"] < c["change"] < c["ci_high"] and c["change"] > 0
    assert r["verdict"] in (DIFFERENT, UNKNOWN) and data["problems"] == []
    assert data["cost"] is not None and data["cost"] > 0
    # One session cell, one machine: provisioned once and released.
    store = ResultsStore.from_settings()
    (run,) = [x for x in store.get_runs("nightly_perf") if x.run_type == "compare"]
    (cell,) = store.get_cells("nightly_perf", run.run_id)
    assert cell.cell_id == "model=small,retest=1" and cell.state == "passed"
    run_dir = settings.artifacts_dir() / "nightly_perf" / settings.safe_name(run.run_id)
    assert "step_time" in (run_dir / "compare.html").read_text()
    assert 'href="compare.html"' in (run_dir / "index.html").read_text()  # the run report
    # The same build against itself, no slow_from: no change worth a page.
    rc = main(["compare", "nightly_perf", "--base", "nightly-2026-03-06", "--head",
               "nightly-2026-03-05", "--pairs", "8", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{\n") :])
    assert rc == 0 and data["results"][0]["verdict"] in (SAME, UNKNOWN, DIFFERENT)
    assert abs(data["results"][0]["comparison"]["change"]) < 0.05


def test_cli_bad_input_is_one_message_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from accelmatrix.cli import main

    rc = main(["compare", "nightly_perf", "--base", "x", "--head", "x"])
    assert rc == 2 and "same build" in capsys.readouterr().err
    rc = main(["compare", "nightly_perf", "--base", "x", "--head", "y", "--cells", "nope*"])
    err = capsys.readouterr().err
    assert rc == 2 and "matches no cell id" in err and "model=small" in err
