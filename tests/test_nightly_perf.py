"""nightly_perf: ${run.*} placeholders from the logical date, budget at plan time, and a
real `airflow backfill create` of three dates (plus a re-run of one) checked in the history.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from test_tiered_ci import Receiver, _conn

from accelmatrix.spec.loader import SuiteError, load_suite
from accelmatrix.spec.plan import expand

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "include" / "suites" / "nightly_perf.yaml"
CELL = "model=small"


def test_run_placeholders_come_from_the_logical_date():
    suite = load_suite(SUITE)
    plan = expand(suite, "nightly_perf", logical_date=datetime(2026, 3, 2, 0, 0, tzinfo=UTC))
    assert plan.runtime_version == "nightly-2026-03-02"
    wl = plan.cells[0].workload
    assert wl.run[wl.run.index("--build") + 1] == "nightly-2026-03-02"
    assert wl.env["BUILD_UNDER_TEST"] == "nightly-2026-03-02"
    assert "${python}" in wl.run  # backend variables are still left to the backend


def test_run_placeholders_in_machines_and_bad_references(tmp_path):
    raw = yaml.safe_load(SUITE.read_text())
    raw["machines"]["gke"] = {
        "backend": "k8s-job",
        "kubernetes_conn_id": "gke",
        "image": "registry.example/trainer:${run.runtime_version}",
    }
    raw["runtime_version"] = "nightly-${run.ds_nodash}"
    p = tmp_path / "nightly.yaml"
    p.write_text(yaml.safe_dump(raw))
    plan = expand(load_suite(p), "n", logical_date=datetime(2026, 3, 2, tzinfo=UTC))
    assert plan.runtime_version == "nightly-20260302"

    for bad, msg in [
        ("nightly-${axis.model}", r"runtime_version: \$\{axis.model\} is not allowed here"),
        ("nightly-${run.dss}", r"\$\{run.dss\} is not allowed here"),
        ("nightly-${params.nope}", "no param named 'nope'"),
    ]:
        p.write_text(yaml.safe_dump({**raw, "runtime_version": bad}))
        with pytest.raises(SuiteError, match=msg):
            load_suite(p)
    no_version = {k: v for k, v in raw.items() if k != "runtime_version"}
    p.write_text(yaml.safe_dump(no_version))
    with pytest.raises(SuiteError, match=r"needs a suite `runtime_version`"):
        load_suite(p)
    p.write_text(yaml.safe_dump({**raw, "budget": {"max_usd": 1, "param": "slow_from"}}))
    with pytest.raises(SuiteError, match="budget.param: 'slow_from' must name a number"):
        load_suite(p)


def test_budget_estimate_in_the_error(tmp_path):
    from accelmatrix.pricing import BudgetExceeded, check_budget

    cells = list(expand(load_suite(SUITE), "nightly_perf").cells) * 3
    # 3 cells x 120 s timeout x 0.05/h = 0.005
    assert check_budget(cells, max_usd=1, expected_seconds=None, source="s") == pytest.approx(0.005)
    with pytest.raises(BudgetExceeded, match=r"estimated cost 0.50 USD for 3 cell\(s\)"):
        check_budget(cells, max_usd=0.1, expected_seconds=12000, source="param budget_usd")


@pytest.mark.integration
def test_over_budget_run_fails_in_plan_before_provisioning(airflow_db):
    from test_dag_local import run_dag, store

    state, run_id, tis = run_dag("nightly_perf", conf={"budget_usd": 0.0001})
    assert state == "failed"
    assert tis[("plan", "-1")] == "failed"
    provision = {k: v for k, v in tis.items() if k[0].endswith(".provision")}
    assert all(v in (None, "upstream_failed") for v in provision.values()), provision
    run = store().get_run("nightly_perf", run_id)
    assert run.state == "over_budget" and run.runtime_version.startswith("nightly-")
    assert store().get_cells("nightly_perf", run_id) == []


# -- backfill on a real scheduler ---------------------------------------------------------
def _runs(stack, dag_id: str) -> list[dict]:
    return stack.api("GET", f"dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]


def _wait_all(stack, dag_id: str, n: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        stack.check_alive()
        runs = _runs(stack, dag_id)
        if len(runs) >= n and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(json.dumps([(r["dag_run_id"], r["state"]) for r in runs]))
        time.sleep(1)


@pytest.mark.integration
@pytest.mark.slow(700)
def test_backfill_of_fourteen_builds_names_the_first_slow_one(tmp_path):
    """`airflow backfill create` of 14 nightly builds of the example on a real scheduler,
    with its own 1 % build-to-build noise; from the 9th build on, step time is 5 % higher:
    inside the bounds band (+-10 %). The gate that first sees a candidate starts a re-test:
    one session run, one machine, the builds around the change interleaved. It names
    slow_from's build as the first bad build (not a neighbour that is slower by chance),
    and the one notification says so. The history grid shows the suite's one cell, the
    maintenance DAG does not re-center the bounds across the change, and accepting it on
    the page stores the new level in the results store: the bounds file in include/ is
    never written."""
    from accelmatrix.evaluation.bounds import load_bounds
    from accelmatrix.history.retests.followup import ACTIVE_STATES
    from accelmatrix.results.store import ResultsStore
    from accelmatrix_testkit import AirflowStack

    include = tmp_path / "include"
    shutil.copytree(ROOT / "include", include, ignore=shutil.ignore_patterns("__pycache__"))
    bounds_path = include / "bounds" / "nightly_perf_bounds.yaml"
    before_text = bounds_path.read_text()
    old = load_bounds(bounds_path).benchmarks["nightly-small"]
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "nightly_perf.yaml").write_text(SUITE.read_text())
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=14 - k) for k in range(14)]
    slow = days[8]
    home = tmp_path / "airflow"
    started = time.monotonic()
    with Receiver() as rx:
        with AirflowStack(
            home=home,
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            parallelism=4,
            # The executor `make standalone` runs: task processes fork with accelmatrix and
            # Great Expectations already imported, instead of importing them in each of the
            # ~8 task processes of every one of the 14 runs.
            executor="PreloadedLocalExecutor",
            env_extra={
                # Only the backfill creates runs: no scheduled run of "today" in between.
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                "AIRFLOW_CONN_ACCELMATRIX_ALERTS": _conn(rx.port, extra={"endpoint": "/alerts"}),
                "ACCELMATRIX_INCLUDE_DIR": str(include),
            },
        ) as stack:
            stack.create_pool("accelmatrix_cpu_small", 2, include_deferred=True)
            stack.wait_for_dag("nightly_perf")
            created = stack.backfill(
                "nightly_perf", days[0].isoformat(), days[-1].isoformat(),
                {"slow_from": slow.isoformat()},
            )  # fmt: skip
            assert created.returncode == 0, created.stderr[-3000:]
            store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
            try:
                # The 14 nightlies, and every session the re-tests started, all finished.
                deadline = time.monotonic() + 1500
                while True:
                    runs = _wait_all(stack, "nightly_perf", 14, timeout=1200)
                    retests = store.get_confirmations("nightly_perf")
                    if all(r.state not in ACTIVE_STATES for r in retests) and all(
                        r["state"] in ("success", "failed") for r in _runs(stack, "nightly_perf")
                    ):
                        break
                    assert time.monotonic() < deadline, retests
                    time.sleep(2)
                t_backfill = time.monotonic() - started
                runs = _runs(stack, "nightly_perf")
                assert {r["state"] for r in runs} == {"success"}, [
                    (r["dag_run_id"], r["state"]) for r in runs
                ]

                # The maintenance DAG: a full pass, then bounds re-centering, held by the
                # change.
                stack.wait_for_dag("accelmatrix_maintenance")
                m_run = stack.trigger("accelmatrix_maintenance")
                assert (
                    stack.wait_for_run("accelmatrix_maintenance", m_run, timeout=300) == "success"
                )
                held = stack.api(
                    "GET",
                    f"dags/accelmatrix_maintenance/dagRuns/{m_run}/taskInstances/recenter_bounds"
                    "/xcomEntries/return_value",
                )["value"]
                assert store.bounds_in_force("bounds/nightly_perf_bounds.yaml") == {}

                found = [r for r in retests if r.state in ("confirmed", "found")]
                assert len(found) == 1, [
                    (r.id, r.group_id, r.state, r.good_build, r.suspect_build,
                     r.culprit, r.builds, r.reason, r.created_at)
                    for r in retests
                ] + [(p.id, p.group_id, p.runtime_version, p.position, p.n_after,
                      p.change) for p in store.get_change_points("nightly_perf")]  # fmt: skip
                (retest,) = found
                group = store.get_change_group(retest.group_id)
                points = store.get_change_points("nightly_perf", group_id=group.id)
                all_points = store.get_change_points("nightly_perf")
                # The history grid: the suite's one cell and its 14 nightlies, the session
                # in the re-tests section, never a row or a column.
                history_page = stack.client.get(
                    "/accelmatrix/suites/nightly_perf/history", headers={"Accept": "text/html"}
                )
                assert "1 cells;" in history_page.text, history_page.text[:2000]
                assert f'id="group-{group.id}"' in history_page.text
                # The suite's page opens the newest nightly, whose chart marks the change.
                page = stack.client.get(
                    "/accelmatrix/suites/nightly_perf", headers={"Accept": "text/html"}
                )
                assert page.status_code == 200, page.text[:500]
                assert f'data-group-id="{group.id}"' in page.text
                # Accepting it on the page makes the new level the baseline, in the store.
                accepted = stack.client.post(
                    f"/accelmatrix/suites/nightly_perf/changes/group/{group.id}/triage",
                    data={"state": "accepted", "note": "expected: new kernel"},
                    follow_redirects=False,
                )
                assert accepted.status_code == 303, accepted.text[:500]
                group_after = store.get_change_group(group.id)
                row = store.bounds_in_force("bounds/nightly_perf_bounds.yaml")["nightly-small"]
            finally:
                store.close()
    assert stack.leftovers == []
    elapsed = time.monotonic() - started

    # The culprit is slow_from's build, and the last good build the one before it.
    assert retest.culprit == f"nightly-{slow.isoformat()}", retest
    assert retest.last_good == f"nightly-{days[7].isoformat()}", retest
    # One session: one machine for the suspect cell, every build of the range on it.
    assert len(retest.run_ids) >= 1 and retest.cost > 0
    verdicts = {s["build"]: s["verdict"] for s in retest.steps}
    assert verdicts[f"nightly-{slow.isoformat()}"] == "bad", retest.steps
    cp = max(points, key=lambda p: abs(p.effect or 0))
    assert cp.direction == "regression" and 0.02 < cp.change < 0.08, cp
    # One change, one first bad build: the change, its group and its summary name the
    # re-test's culprit (history.retests.placement), whatever night the detector placed it on.
    assert cp.runtime_version == retest.culprit, (cp, retest.culprit)
    assert group.runtime_version == retest.culprit, group
    assert f"from build {retest.culprit}" in group.summary, group.summary
    real = [p for p in all_points if p.direction == "regression" and p.confirm_state in
            ("confirmed", "found")]  # fmt: skip
    assert [p.id for p in real] == [cp.id], all_points
    assert old.step_time_lower_bound < cp.median_after < old.step_time_upper_bound, (
        "the regression lies inside the bounds band: bounds alone never saw it"
    )
    assert group.notified_at is not None
    sent = [body for path, _, body in rx.received if path == "/alerts"]
    assert len(sent) == 1, sent
    assert f"nightly-{slow.isoformat()}" in sent[0]["text"]
    # The culprit report's class: the suite's one cell has no siblings, and the re-test
    # reproduced the change on one machine: the code (history.culprits.attribution).
    (attribution,) = [d["attribution"] for d in retest.decision.values() if "attribution" in d]
    assert attribution["cause"] == "code" and "reproduced it" in attribution["reason"]
    assert "*Cause* the code" in json.dumps(sent[0]), sent[0]  # the message's body
    line = " ".join(held["bounds/nightly_perf_bounds.yaml"]["changes"])
    assert "held: open regression" in line, held
    assert group_after.state == "accepted" and group_after.state_by  # Airflow's user name
    # include/ is git's: the file is never written; the store holds the new level.
    assert bounds_path.read_text() == before_text
    assert (row.reason, row.by) == ("accepted change", group_after.state_by)
    assert row.note == "expected: new kernel"
    width = old.step_time_upper_bound - old.step_time_lower_bound
    assert row.step_time_upper_bound - row.step_time_lower_bound == pytest.approx(width)
    # A figure to read, not a bound: a wall-time assert fails on a busy machine, not on a bug.
    print(
        f"backfill test: {elapsed:.0f} s ({t_backfill:.0f} s to the 14 runs and the re-test, "
        f"stack start {stack.startup_seconds:.0f} s); re-test: {len(retest.run_ids)} "
        f"session(s), cost {retest.cost:.4f} USD"
    )


@pytest.mark.integration
def test_a_run_told_to_test_a_build_tests_and_records_it(airflow_db):
    """`{"build": ...}` in the conf replaces runtime_version for the run: the workload gets
    that build and every result records it; a malformed name is refused at plan."""
    from test_dag_local import run_dag, store

    state, run_id, _tis = run_dag("nightly_perf", conf={"build": "nightly-2026-01-02"})
    assert state == "success"
    assert store().get_run("nightly_perf", run_id).runtime_version == "nightly-2026-01-02"
    (cell,) = store().get_cells("nightly_perf", run_id)
    steps = [m for m in store().get_metrics("nightly_perf", run_id) if m.name == "step_time"]
    assert cell.state == "passed" and len(steps) == 5
    state, run_id, tis = run_dag("nightly_perf", conf={"build": "x; rm -rf /"})
    assert state == "failed" and tis[("plan", "-1")] == "failed"
    assert store().get_cells("nightly_perf", run_id) == []
