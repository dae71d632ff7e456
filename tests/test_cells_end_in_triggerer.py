"""Cells whose waiting steps end in the triggerer, on a real Airflow (scheduler, triggerer,
dag-processor, api-server; LocalExecutor).

What ``dag.test()`` cannot show (it resumes every deferred task in-process):

* an all-passing run ends with EVERY task instance green, and ``run`` and ``evaluate`` each
  started on a worker exactly once (their triggers ended them: no resume, so Airflow
  3.3.2's defer/resume race has nothing to fail);
* REST names every mapped task instance by its cell id in every state, waiting ones
  included (accelmatrix.deploy.policy), never "0";
* the retry rule: an infrastructure failure that ends in the trigger is retried, a workload
  failure is not (even with retries set), a check failure fails ``evaluate`` with the verdict
  table in its log.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from accelmatrix.contracts.run_records import CellRecord
from accelmatrix_testkit import AirflowStack, by_step_and_cell

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
POOL = "accelmatrix_cpu"
FINISHED = "Finished training run"

# The workload of both suites (stdlib only): ``MODE SIGNALS SECONDS``.
WORKLOAD = """\
import os, signal, sys, time
from pathlib import Path

mode, signals, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
print("step 1 loss: 0.5", flush=True)
time.sleep(seconds)
if mode == "infra":
    marker = signals / "infra.first"
    if not marker.exists():
        marker.touch()
        print("killing my supervisor: the machine dies under the workload", flush=True)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)
        sys.exit(0)
if mode == "exit":
    print("injected failure: loss became NaN", flush=True)
    sys.exit(3)
if mode == "check":
    print("ran, but never printed the line the check wants", flush=True)
    sys.exit(0)
print("Finished training run", flush=True)
"""


def _suite(description: str, axes: dict, seconds: float, signals: Path, script: Path) -> dict:
    return {
        "description": description,
        "schedule": None,
        "retries": 1,
        "retry_delay_seconds": 1,
        "axes": axes,
        "machines": {"cpu": {"backend": "local", "pool": POOL, "pool_slots": 16}},
        "machine": "cpu",
        "workload": {
            "run": ["${python}", str(script), "${axis.mode}", str(signals), str(seconds)],
            "timeout": 120,
        },
        "checks": [{"type": "log_contains", "pattern": FINISHED}],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("end-in-trigger")
    signals = tmp / "signals"
    signals.mkdir()
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    suites = tmp / "suites"
    suites.mkdir()
    passing = _suite(
        "8 passing cells", {"mode": ["pass"], "i": list(range(8))}, 4.0, signals, script
    )
    mixed = _suite(
        "one cell per outcome", {"mode": ["pass", "infra", "exit", "check"]}, 3.0, signals, script
    )
    (suites / "pass8.yaml").write_text(yaml.safe_dump(passing, sort_keys=False))
    (suites / "outcomes.yaml").write_text(yaml.safe_dump(mixed, sort_keys=False))
    with AirflowStack(
        home=tmp / "airflow", dags_folder=ROOT / "dags", suites_dir=suites, parallelism=8
    ) as s:
        s.create_pool(POOL, 16, include_deferred=True)
        s.wait_for_dag("pass8")
        s.wait_for_dag("outcomes")
        yield s


def _cells(stack: AirflowStack, dag_id: str, run_id: str) -> dict[str, CellRecord]:
    from accelmatrix.results.store import ResultsStore

    store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
    try:
        return {c.cell_id: c for c in store.get_cells(dag_id, run_id)}
    finally:
        store.close()


def _machines_left(stack: AirflowStack, dag_id: str) -> list[str]:
    """Local "machines" (resource records under the work root) of ``dag_id`` still held."""
    return [str(p) for p in (stack.accel_home / "work" / dag_id).rglob("resource.json")]


def _worker_starts(log: str) -> int:
    """How many times a worker executed the task in this try's log (each execution opens
    the task runner's "Pre Execute" group once; trigger lines do not)."""
    return log.count("::group::Pre Execute")


@pytest.mark.slow(100)
def test_passing_run_all_green_and_named_from_the_first_second(stack):
    unnamed: list[str] = []  # task instance, state and name, each time one was seen unnamed
    seen_named: set[tuple[str, str]] = set()  # (step, state) seen with the cell id
    stop = threading.Event()
    run_id = stack.trigger("pass8")

    def watch() -> None:
        # While the run goes on: REST's rendered_map_index (what the grid shows) of every
        # mapped task instance in every state. The cluster policy (accelmatrix.deploy.policy)
        # names a task instance when Airflow creates it, so a waiting one (no state,
        # scheduled, queued) is named too, not only once its task process has started.
        while not stop.is_set():
            try:
                tis = stack.task_instances("pass8", run_id)
            except Exception:  # noqa: BLE001 - the api-server may be busy; look again
                time.sleep(0.2)
                continue
            for ti in tis:
                if ti["map_index"] < 0:
                    continue
                name = ti["rendered_map_index"] or ""
                state = ti["state"] or "none"
                if name.startswith("mode=pass,i="):
                    seen_named.add((ti["task_id"].rsplit(".", 1)[-1], state))
                else:
                    unnamed.append(f"{ti['task_id']}[{ti['map_index']}] {state}: {name!r}")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        state = stack.wait_for_run("pass8", run_id, timeout=400)
    finally:
        stop.set()
        watcher.join(timeout=10)
    tis = stack.task_instances("pass8", run_id)
    summary = "\n".join(
        f"{ti['task_id']}[{ti['rendered_map_index']}] {ti['state']} try {ti['try_number']}"
        for ti in tis
    )
    assert state == "success", summary
    # A green run has no red task: every one of the 50 task instances succeeded, first try.
    assert len(tis) == 2 + 8 * 6, summary
    assert {ti["state"] for ti in tis} == {"success"}, summary
    assert {ti["try_number"] for ti in tis} == {1}, summary
    assert stack.stale_success_failures() == set()
    # Named by cell id in every state it was seen in, and after the end.
    mapped = [ti for ti in tis if ti["map_index"] >= 0]
    assert all(ti["rendered_map_index"].startswith("mode=pass,i=") for ti in mapped), summary
    # Each cell's task carries its own cell's id (the name follows the map index).
    cell_at = {
        t["map_index"]: t["rendered_map_index"] for t in mapped if "provision" in t["task_id"]
    }
    assert all(ti["rendered_map_index"] == cell_at[ti["map_index"]] for ti in mapped), summary
    assert not unnamed, unnamed[:10]
    # The watcher saw waiting, running and deferred task instances named: the check had teeth.
    assert {"none", "running", "deferred"} <= {st for _, st in seen_named}, seen_named
    assert ("run", "deferred") in seen_named, seen_named
    # ... and named without the Task SDK's early rendered-map-index PATCH: the policy had
    # written the name already (CellOperator._hold_back_early_name), so no task sent one.
    api_log = (stack.logs_dir / "api-server.log").read_text(errors="replace")
    assert "path=/execution/task-instances/" in api_log  # the access log is there to read
    assert "/rendered-map-index" not in api_log

    for ti in mapped:
        step = ti["task_id"].rsplit(".", 1)[-1]
        if step not in ("run", "evaluate"):
            continue
        log = stack.task_log("pass8", run_id, ti["task_id"], map_index=ti["map_index"])
        # Deferred once, ended by its trigger, never resumed on a worker.
        assert _worker_starts(log) == 1, log[-3000:]
        assert "Pausing task as DEFERRED" in log, log[-3000:]
        if step == "run":
            assert FINISHED in log, log[-3000:]  # the workload's line, streamed live
            # The trigger released the machine as soon as the workload passed.
            assert "tore down " in log, log[-3000:]
        else:
            assert "passed" in log, log[-3000:]

    # Of a cell's steps only provision pushes an XCom (the resource record the later steps
    # read); the others' outcomes are in the store, also when a trigger ended the task.
    xcoms = stack.api(
        "GET", f"dags/pass8/dagRuns/{run_id}/taskInstances/~/xcomEntries", params={"limit": 1000}
    )["xcom_entries"]
    mapped_xcoms = {(x["task_id"], x["key"]) for x in xcoms if x["map_index"] >= 0}
    assert mapped_xcoms == {("cpu.provision", "return_value")}, sorted(mapped_xcoms)
    assert sum(1 for x in xcoms if x["task_id"] == "cpu.provision") == 8, xcoms
    # What the cells are mapped over is a small reference per cell, not the cells: a task
    # start does not fetch the whole plan (the cells are in the results store).
    plan = stack.api(
        "GET",
        f"dags/pass8/dagRuns/{run_id}/taskInstances/plan/xcomEntries/return_value",
        params={"deserialize": True},
    )["value"]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert [sorted(c) for c in plan] == [["id", "index", "machine"]] * 8, plan

    cells = _cells(stack, "pass8", run_id)
    assert len(cells) == 8 and {c.state for c in cells.values()} == {"passed"}, cells
    # No machine waited for collect or teardown: each was gone before its collect started,
    # and the teardown task only checked that.
    for ti in mapped:
        if ti["task_id"].endswith(".collect"):
            cell = cells[ti["rendered_map_index"]]
            collect_start = datetime.fromisoformat(ti["start_date"])
            assert cell.teardown_at <= collect_start, (cell, ti)
        if ti["task_id"].endswith(".teardown"):
            log = stack.task_log("pass8", run_id, ti["task_id"], map_index=ti["map_index"])
            assert "was released by run" in log, log[-3000:]
    assert _machines_left(stack, "pass8") == []


@pytest.mark.slow(50)
def test_retry_rule_and_verdicts_in_the_triggerer(stack):
    run_id = stack.trigger("outcomes")
    state = stack.wait_for_run("outcomes", run_id, timeout=400)
    tis = stack.task_instances("outcomes", run_id)
    by, summary = by_step_and_cell(tis)
    cells = _cells(stack, "outcomes", run_id)
    assert state == "failed", summary  # two cells failed

    # Infrastructure failure (the workload's supervisor died): the trigger ended the try
    # failed, Airflow retried it, the second try passed.
    infra = by[("run", "mode=infra")]
    assert (infra["state"], infra["try_number"]) == ("success", 2), summary
    first = stack.task_log(
        "outcomes", run_id, "cpu.run", map_index=infra["map_index"], try_number=1
    )
    assert "an infrastructure failure, not a test failure" in first, first[-3000:]
    # Not final: the machine stays for the retry.
    assert "tore down " not in first, first[-3000:]
    assert cells["mode=infra"].state == "passed", cells["mode=infra"]

    # Workload failure: never retried, although the suite sets retries: 1. The trigger hands
    # it to the worker to fail without retry, after letting the scheduler settle. Should
    # Airflow 3.3.2's defer/resume race still fail that resumed try and retry it, the second
    # try refuses to run the workload again.
    failed = by[("run", "mode=exit")]
    assert failed["state"] == "failed", summary
    log = stack.task_log("outcomes", run_id, "cpu.run", map_index=failed["map_index"], try_number=1)
    assert "a test failure: never retried" in log, log[-3000:]
    assert "workload exited with 3, expected 0" in log, log[-3000:]
    # A test failure is final: its machine went at once (its logs were copied first).
    assert "tore down " in log, log[-3000:]
    if failed["try_number"] == 2:
        again = stack.task_log(
            "outcomes", run_id, "cpu.run", map_index=failed["map_index"], try_number=2
        )
        assert "not re-running the workload" in again, again[-3000:]
        assert "injected failure" not in again, again[-3000:]
    else:
        assert failed["try_number"] == 1, summary
    assert cells["mode=exit"].state == "run_failed", cells["mode=exit"]

    # Check failure: run green, evaluate red with the verdict table in its log, ended in
    # the triggerer (one worker start).
    assert by[("run", "mode=check")]["state"] == "success", summary
    ev = by[("evaluate", "mode=check")]
    assert (ev["state"], ev["try_number"]) == ("failed", 1), summary
    log = stack.task_log("outcomes", run_id, "cpu.evaluate", map_index=ev["map_index"])
    assert _worker_starts(log) == 1, log[-3000:]
    assert "log_contains" in log and FINISHED in log, log[-3000:]
    assert "evaluate failed" in log, log[-3000:]
    assert cells["mode=check"].state == "failed", cells["mode=check"]

    assert by[("evaluate", "mode=pass")]["state"] == "success", summary
    assert cells["mode=pass"].state == "passed"
    for cell in ("mode=pass", "mode=infra", "mode=exit", "mode=check"):
        assert by[("teardown", cell)]["state"] == "success", summary
    assert _machines_left(stack, "outcomes") == []
