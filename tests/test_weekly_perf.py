"""weekly_perf on a real scheduler: the whole regression loop that Airflow runs by itself.

`airflow backfill create` of ten Monday runs of the example; a 5 % regression lands in the
Thursday build between the 8th and the 9th Monday. The gate of the run that first sees it
starts a re-test session: one run of the suite with one cell (one machine) for the suspect
cell, on which the last good Monday, the suspect Monday and the days between run
interleaved; it confirms the change and names the first slow build. One notification goes
out, naming it. A re-run of the gate and a scheduler restart start nothing more; nothing is
left running.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_tiered_ci import Receiver, _conn

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "include" / "suites" / "weekly_perf.yaml"
DAG = "weekly_perf"


def _runs(stack) -> list[dict]:
    return stack.api("GET", f"dags/{DAG}/dagRuns", params={"limit": 100})["dag_runs"]


def _settled(stack, store, timeout: float) -> dict:
    """Wait until every run is finished and the re-test reached a final state."""
    from accelmatrix.history.retests.followup import ACTIVE_STATES

    deadline = time.monotonic() + timeout
    while True:
        stack.check_alive()
        runs = _runs(stack)
        retests = store.get_confirmations(DAG)
        done = all(r["state"] in ("success", "failed") for r in runs)
        final = [r for r in retests if r.state not in ACTIVE_STATES]
        if done and len(runs) >= 10 and retests and len(final) == len(retests):
            return {"runs": runs, "retests": retests}
        if time.monotonic() > deadline:
            raise TimeoutError(
                json.dumps(
                    {
                        "runs": [(r["dag_run_id"], r["state"]) for r in runs],
                        "retests": [(r.id, r.state, r.run_id) for r in retests],
                    }
                )
            )
        time.sleep(2)


@pytest.mark.integration
@pytest.mark.loop
def test_weekly_backfill_confirms_and_bisects_to_the_first_slow_build(tmp_path):
    from accelmatrix.results.store import ResultsStore
    from accelmatrix_testkit import AirflowStack

    include = tmp_path / "include"
    shutil.copytree(ROOT / "include", include, ignore=shutil.ignore_patterns("__pycache__"))
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / f"{DAG}.yaml").write_text(SUITE.read_text())
    today = datetime.now(UTC).date()
    last_monday = today - timedelta(days=today.weekday() or 7)
    mondays = [last_monday - timedelta(weeks=9 - k) for k in range(10)]
    slow = mondays[7] + timedelta(days=3)  # a Thursday build
    home = tmp_path / "airflow"
    started = time.monotonic()
    with Receiver() as rx:
        with AirflowStack(
            home=home,
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            parallelism=4,
            env_extra={
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                "AIRFLOW_CONN_ACCELMATRIX_ALERTS": _conn(rx.port, extra={"endpoint": "/alerts"}),
                "ACCELMATRIX_INCLUDE_DIR": str(include),
            },
        ) as stack:
            stack.create_pool("accelmatrix_cpu_small", 4, include_deferred=True)
            stack.wait_for_dag(DAG)
            # The runs are created while the scheduler is down, with retries on SQLite's
            # lock errors (AirflowStack.backfill).
            created = stack.backfill(
                DAG, mondays[0].isoformat(), mondays[-1].isoformat(),
                {"slow_from": slow.isoformat()},
            )  # fmt: skip
            assert created.returncode == 0, created.stderr[-3000:]
            store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
            try:
                state = _settled(stack, store, timeout=1500)
                t_loop = time.monotonic() - started
                # A re-run of the gate that started the re-test, then a scheduler restart:
                # neither starts a second one.
                retest = next(r for r in state["retests"] if r.state == "found")
                first = retest.run_ids[0]
                origin = [
                    r
                    for r in state["runs"]
                    if r["run_type"] == "backfill" and r["logical_date"][:10] >= slow.isoformat()
                ][0]
                stack.api(
                    "POST",
                    f"dags/{DAG}/clearTaskInstances",
                    json={
                        "dry_run": False,
                        "task_ids": ["gate"],
                        "dag_run_id": origin["dag_run_id"],
                        "only_failed": False,
                        "reset_dag_runs": True,
                    },
                )
                assert stack.wait_for_run(DAG, origin["dag_run_id"], timeout=300) == "success"
                stack.restart_component("scheduler")
                time.sleep(15)
                runs_after = _runs(stack)
                retests_after = store.get_confirmations(DAG)
                page = stack.client.get(f"/accelmatrix/suites/{DAG}/history")
                points = store.get_change_points(DAG, group_id=retest.group_id)
            finally:
                store.close()
    assert stack.leftovers == []

    assert retest.culprit == f"nightly-{slow.isoformat()}", retest
    assert retest.last_good == f"nightly-{(slow - timedelta(days=1)).isoformat()}"
    # Re-tested the night the 9th Monday's point stood out (its own newest point: the week
    # before it is the last good build); the detector's later report would widen it a week.
    assert retest.good_build in (f"nightly-{m.isoformat()}" for m in mondays[6:8])
    assert retest.suspect_build in (f"nightly-{m.isoformat()}" for m in mondays[8:])
    n = len(retest.builds) - 1
    # Each session ran the builds of the range on one machine per suspect cell: every build
    # tested got a level (good / bad), no build was a cell of its own.
    assert n in (7, 14) and 1 <= len(retest.steps) <= n
    assert {s["verdict"] for s in retest.steps} <= {"good", "bad", "unknown"}
    assert first.startswith("accelmatrix_confirm__")
    followups = [r for r in state["runs"] if r["dag_run_id"].startswith("accelmatrix_")]
    assert sorted(r["dag_run_id"] for r in followups) == sorted(
        rid for r in state["retests"] for rid in r.run_ids
    )
    # Every follow-up run is an ordinary run of the suite that passed.
    assert {r["state"] for r in state["runs"]} == {"success"}, [
        (r["dag_run_id"], r["state"]) for r in state["runs"]
    ]
    assert any(p.confirm_state == "confirmed" for p in points), points
    # Nothing more after the gate re-run and the restart.
    assert len(runs_after) == len(state["runs"]), [r["dag_run_id"] for r in runs_after]
    assert [r.id for r in retests_after] == [r.id for r in state["retests"]]
    sent = [body for path, _, body in rx.received if path == "/alerts"]
    culprit_sent = [b for b in sent if f"first bad build nightly-{slow.isoformat()}" in b["text"]]
    assert len(culprit_sent) == 1, [b["text"] for b in sent]
    assert culprit_sent[0]["accelmatrix"]["confirmation"]["state"] == "found"
    assert page.status_code == 200
    print(
        f"weekly loop: {t_loop:.0f} s from backfill to culprit, {len(followups)} follow-up "
        f"run(s), {len(retest.steps)} bisect step(s)"
    )
