"""The culprit report's example (include/suites/op_regression.yaml): from slow_from's build
on, the benchmark's step does its matmul twice. Its workload's real traces name aten::mm;
a backfill on a real scheduler ends with the alert naming the first slow build, aten::mm
first and the code as the cause, and the change's history page showing the diff."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path

import pytest
from test_nightly_perf import _runs, _wait_all
from test_tiered_ci import Receiver, _conn

from accelmatrix.history.culprits.profile_diff import diff_traces
from accelmatrix.history.retests.followup import ACTIVE_STATES
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import PROFILES_DIR, Followup, expand_followup
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.plan import expand
from accelmatrix_testkit import AirflowStack

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "include" / "suites" / "op_regression.yaml"
WORKLOAD = ROOT / "include" / "workloads" / "op_bench.py"
CELL = "model=matmul"
# Builds before the slow one, and from it on: a step the gate finds in 100 % of generated
# series at 5 % night-to-night noise (the workload's, on two busy cores: 3-6 %) and about
# 97 % at 10 % with six nights before it (88 % with five; bench/bench_example_nights.py):
# the test runs beside others on a loaded CI machine. With fewer nights before it the
# detector's noise scale, read from the series itself, is too uncertain to report the step.
GOOD_NIGHTS, BAD_NIGHTS = 6, 3


def test_the_suite_names_the_build_and_its_sessions_keep_the_traces() -> None:
    suite = load_suite(SUITE)
    when = datetime(2026, 3, 2, tzinfo=UTC)
    (cell,) = expand(
        suite, "op_regression", logical_date=when, params={"slow_from": "2026-03-02"}
    ).cells
    argv = cell.workload.run
    assert argv[argv.index("--build") + 1] == "nightly-2026-03-02"
    assert argv[argv.index("--slow-from") + 1] == "2026-03-02"
    fu = Followup(
        kind="confirm", confirmation=1, round=1, cells=[CELL],
        builds=["nightly-2026-03-01", "nightly-2026-03-02"], pairs=7,
    )  # fmt: skip
    (session,) = expand_followup(
        suite, "op_regression", fu, params={"slow_from": "2026-03-02"}
    ).cells
    plan = json.loads(session.workload.run[3])
    assert plan["keep"]["glob"] == "out/*.pt.trace.json" and plan["keep"]["per_build"] == 3
    assert f"{PROFILES_DIR}/**" in session.workload.artifacts


def test_the_workloads_traces_name_the_doubled_matmul(tmp_path: Path) -> None:
    """The workload as the suite runs it, 3 samples of a good and 3 of a culprit build
    interleaved as the re-test runs them (A B B A A B): the diff of their traces ranks
    aten::mm first, at about one more matmul, most of the regression.

    On a host loaded far past its cores (the CI machine beside the suite's Airflow stacks)
    3+3 samples can leave the step's interval spanning zero: the diff then decides nothing
    and must say so, never blaming another op. Like a re-test that adds pairs while
    undecided, a round of 3+3 more is pooled in (up to 9+9); if even that decides
    nothing, the diff must say so (CI fails on a skipped test)."""
    pytest.importorskip("torch")
    traces: dict[str, list[Path]] = {"nightly-2026-03-01": [], "nightly-2026-03-02": []}
    seen: list[str] = []
    for rnd in range(3):
        for i, build in enumerate([*traces, *reversed(traces), *traces]):
            out = tmp_path / f"{rnd}-{i}-{build}"
            done = subprocess.run(  # noqa: S603 (argv list, no shell)
                [sys.executable, str(WORKLOAD), "--build", build, "--slow-from", "2026-03-02",
                 "--out-dir", str(out)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
            steps = [ln for ln in done.stdout.splitlines() if "step_time:" in ln]
            assert len(steps) == 200 and f"Finished op benchmark of {build}" in done.stdout
            traces[build] += out.glob("*.pt.trace.json")
        diff = diff_traces(traces["nightly-2026-03-01"], traces["nightly-2026-03-02"]).diff
        k = 3 * (rnd + 1)
        assert diff is not None and (diff.base_samples, diff.new_samples) == (k, k)
        assert diff.cause is None or diff.cause.op == "aten::mm", diff.summary()
        seen.append(diff.summary().splitlines()[0])
        if diff.delta_ops_lo > 0:
            break
    else:
        assert diff.verdict in ("no_regression", "intermittent"), diff.summary()
        print(f"the host too busy for 9+9 samples to decide: {seen}")
        return
    top = diff.rows[0]
    assert top.op == "aten::mm" and top.status == "changed", diff.summary()
    # One matmul more per step: its change is beyond the samples' noise (its interval
    # clears zero) and most of the regression. How large it reads is not asserted here:
    # beside the suite's Airflow stacks (load 8-20 on 2 cores) the doubled matmul's self
    # time has read +30 %, the scheduler's slices inflating both builds' typical steps.
    # Its size against the extra matmul's time is tests/test_profile_diff.py's check, and
    # the verdict "one op" in 9 runs of 10 is the bench's (bench/bench_profile_diff.py,
    # part 6): a test that fails one run in ten beside the Airflow stacks is noise.
    assert top.delta_pct is not None and top.delta_pct > 0, diff.summary()
    assert top.excess_lo > 0, diff.summary()
    assert top.share is not None and top.share > 0.5, diff.summary()


@pytest.mark.integration
@pytest.mark.slow(260)
def test_backfill_ends_with_the_alert_naming_the_build_the_op_and_the_code(tmp_path: Path):
    """`airflow backfill create` of the example's 8 nightly builds on a real scheduler, the
    6th doing its matmul twice. The gate finds the step and starts the re-test (one session
    on one machine: the builds around the change interleaved, 3 profiled samples kept per
    build); the re-test names the 6th build the first bad one, diffs its traces against the
    5th's (one op, by the share intervals across the samples) and classifies the cause. The one alert names the build, aten::mm first and the
    code; the history page shows the report with its table, bars and both traces."""
    suites = tmp_path / "suites"
    suites.mkdir()
    shutil.copy(SUITE, suites / SUITE.name)
    today = datetime.now(UTC).date()
    n = GOOD_NIGHTS + BAD_NIGHTS
    days = [today - timedelta(days=n - k) for k in range(n)]
    slow, last_good = days[GOOD_NIGHTS], days[GOOD_NIGHTS - 1]
    home = tmp_path / "airflow"
    started = time.monotonic()
    with Receiver() as rx:
        with AirflowStack(
            home=home,
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            parallelism=4,
            executor="PreloadedLocalExecutor",
            env_extra={
                # Only the backfill creates runs: no scheduled run of "today" in between.
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                "AIRFLOW_CONN_ACCELMATRIX_ALERTS": _conn(rx.port, extra={"endpoint": "/alerts"}),
            },
        ) as stack:
            stack.create_pool("accelmatrix_cpu_small", 2, include_deferred=True)
            stack.wait_for_dag("op_regression")
            created = stack.backfill(
                "op_regression", days[0].isoformat(), days[-1].isoformat(),
                {"slow_from": slow.isoformat()},
            )  # fmt: skip
            assert created.returncode == 0, created.stderr[-3000:]
            store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
            try:
                # The nights, and every session the re-tests started, all finished. The
                # last night's gate starts its re-test before the night ends, so none by
                # then is a failure, not a wait.
                deadline = time.monotonic() + 900
                while True:
                    _wait_all(stack, "op_regression", n, timeout=600)
                    retests = store.get_confirmations("op_regression")
                    assert retests, [
                        (p.runtime_version, p.position, p.n_after, p.change)
                        for p in store.get_change_points("op_regression")
                    ]
                    if all(r.state not in ACTIVE_STATES for r in retests) and all(
                        r["state"] in ("success", "failed") for r in _runs(stack, "op_regression")
                    ):
                        break
                    assert time.monotonic() < deadline, retests
                    time.sleep(2)
                t_done = time.monotonic() - started
                runs = _runs(stack, "op_regression")
                assert {r["state"] for r in runs} == {"success"}, [
                    (r["dag_run_id"], r["state"]) for r in runs
                ]
                found = [r for r in retests if r.state in ("confirmed", "found")]
                assert len(found) == 1, [
                    (r.id, r.state, r.good_build, r.suspect_build, r.culprit, r.builds,
                     r.reason) for r in retests
                ] + [(p.runtime_version, p.position, p.n_after, p.change)
                     for p in store.get_change_points("op_regression")]  # fmt: skip
                (retest,) = found
                page = stack.client.get(
                    "/accelmatrix/suites/op_regression/history", headers={"Accept": "text/html"}
                )
                assert page.status_code == 200, page.text[:500]
                trace_links = [stack.client.get(href) for href in _hrefs(page.text, "trace")]
            finally:
                store.close()
    assert stack.leftovers == []
    elapsed = time.monotonic() - started

    # The first slow build, found by the re-test on one machine.
    assert retest.culprit == f"nightly-{slow.isoformat()}", retest
    assert retest.last_good == f"nightly-{last_good.isoformat()}", retest
    # The op-level diff of the culprit's kept trace against the last good build's, and
    # the class: the suite's one cell, reproduced on one machine: the code.
    ((key, decision),) = [(k, d) for k, d in (retest.decision or {}).items() if "profile" in d]
    assert key == f"{CELL}|step_time"
    prof = decision["profile"]
    assert (prof["good"], prof["bad"]) == (retest.last_good, retest.culprit)
    assert prof["base_samples"] >= 3 and prof["new_samples"] >= 3, prof["summary"]
    # No other op is ever blamed. The traces decide on a host that leaves the matmul whole
    # in most steps; beside two other workers' Airflow stacks on two cores they may not
    # (the step's interval across the 3+3 samples spans zero), and then the report must
    # say "no regression beyond their noise", name no op, and the alert lists no op first.
    assert prof["cause"] is None or prof["cause"]["op"] == "aten::mm", prof["summary"]
    decided = prof["delta_ops_lo"] is not None and prof["delta_ops_lo"] > 0
    first = prof["rows"][0]
    if decided:
        assert first["op"] == "aten::mm" and first["share"] > 0.5, prof["summary"]
        # named "one op" from the several samples kept per build, its share's interval
        # above every other op's
        assert prof["verdict"] == "op" and prof["cause"]["op"] == "aten::mm", prof["summary"]
        assert all(r["share_hi"] < first["share_lo"] for r in prof["rows"][1:]), prof["summary"]
    else:
        assert prof["verdict"] in ("no_regression", "intermittent"), prof["summary"]
    assert decision["attribution"]["cause"] == "code", decision["attribution"]
    # One alert: the first bad build, its top op first, the cause.
    sent = [body for path, _, body in rx.received if path == "/alerts"]
    assert len(sent) == 1, sent
    text = json.dumps(sent[0])
    assert f"nightly-{slow.isoformat()}" in text
    assert "*Cause* the code" in text, text
    if decided:
        ops = text[text.index("*Ops* ") :]
        assert ops.split("\\n")[1].strip().startswith("aten::mm "), ops[:600]
        # The change's page: the report with aten::mm first in its table and its bars.
        assert 'class="op-row st-changed" data-op="aten::mm"' in page.text
        assert page.text.index('data-op="aten::mm"') == page.text.index('data-op="')
    # ... and both kept traces served.
    assert 'class="culprit"' in page.text
    assert len(trace_links) >= 6 and all(r.status_code == 200 for r in trace_links)
    assert all(b'"traceEvents"' in r.content for r in trace_links)
    print(
        f"op_regression backfill test: {elapsed:.0f} s ({t_done:.0f} s to the {n} runs and "
        f"the re-test, stack start {stack.startup_seconds:.0f} s); re-test: "
        f"{len(retest.run_ids)} session(s), cost {retest.cost:.4f} USD; diff "
        f"({'decided' if decided else 'not decided'}): "
        f"{prof['summary']}"
    )


def _hrefs(html: str, cls: str) -> list[str]:
    """The hrefs of the <a class="cls"> links of a page (unescaped)."""
    return [unescape(h) for h in re.findall(rf'<a class="{cls}" href="([^"]+)"', html)]
