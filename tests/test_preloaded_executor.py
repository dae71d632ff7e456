"""PreloadedLocalExecutor (accelmatrix.deploy.executor) on a real Airflow, and what it changes.

Its forked task processes start with accelmatrix and Great Expectations imported, so
``evaluate`` judges the cell in its own task process: no deferral, no triggerer round trip
on the cell's critical path. What must hold:

* the scheduler preloaded the task side before forking its workers (it says so in its log);
* an evaluate that passes, and one whose check fails, each start on a worker once and never
  defer; the failing one is red on its first try with the verdict table (check, expected,
  observed) in its log, and the cell is ``failed`` in the store;
* every other task instance of the run is green, first try, and no machine is left.

Without the preload (a plain LocalExecutor, the Celery workers) evaluate defers to the
triggerer: tests/test_cells_end_in_triggerer.py covers that path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelmatrix_testkit import AirflowStack, by_step_and_cell

# Every test here runs the executor's side of Airflow in fresh interpreters (its preload of
# Airflow, accelmatrix and Great Expectations, LocalExecutor's forked workers) or a real
# scheduler: `server` (tests/conftest.py), so `make check` leaves them to `make test`.
pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
POOL = "accelmatrix_cpu"
FINISHED = "Finished training run"

WORKLOAD = """\
import sys
print("step 1 loss: 0.5", flush=True)
if sys.argv[1] == "check":
    print("ran, but never printed the line the check wants", flush=True)
else:
    print("Finished training run", flush=True)
"""


def _run_fresh(code: str, tmp_path: Path, *, timeout: float) -> None:
    """Run ``code`` in a fresh interpreter with our plugins; it must exit 0 and print ok."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "plugins"),
        "ACCELMATRIX_HOME": str(tmp_path / "home"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok"), out.stdout


def test_checks_are_warm_only_after_the_preload(tmp_path):
    """In a fresh process Great Expectations is not loaded (evaluate would defer); after
    ``preload_task_side`` it is, nothing failed (the rehearsal cell passed), no thread was
    left running, no database file is held open, and a forked child inherits it: it
    writes to and reads from the results store the preload warmed."""
    code = (
        "import os, sys\n"
        "from accelmatrix import lifecycle\n"
        "from accelmatrix.deploy.preload import preload_task_side\n"
        "from accelmatrix.results import results_store\n"
        "results_store().ensure_schema(); results_store().close()\n"
        "assert not lifecycle.checks_are_warm()\n"
        "assert 'great_expectations' not in sys.modules\n"
        "assert preload_task_side() == []\n"
        "import threading\n"
        "# Forking with another thread alive can leave a lock held in the child forever.\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "# Nor with a database handle open: parent and child would share it.\n"
        "held = []\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        held.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
        "    except OSError:\n"
        "        pass  # the listing's own descriptor, closed already\n"
        "assert not [h for h in held if 'results.db' in h], held\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    store = results_store()\n"
        "    store.upsert_cell('d', 'r', 'c', state='passed')\n"
        "    ok = lifecycle.checks_are_warm() and store.get_cell('d', 'r', 'c').state == 'passed'\n"
        "    os._exit(0 if ok else 7)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "assert results_store().get_cell('d', 'r', 'c').state == 'passed'\n"
        "print('ok')\n"
    )
    _run_fresh(code, tmp_path, timeout=120)


def test_a_backend_whose_extra_is_absent_is_no_preload_failure(tmp_path):
    """Installed without ``accelmatrix[ssh]`` (docs/deploy.md), the SSH backend cannot be
    preloaded: that is the deployment's choice, not a failure worth a traceback in every
    worker's start. A module that is really missing (pandas here) is still reported.
    (``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError, as an
    uninstalled package does.)"""
    code = (
        "import sys, logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "sys.modules['paramiko'] = None\n"
        "from accelmatrix.deploy.preload import import_task_side_modules\n"
        "assert import_task_side_modules() == [], 'ssh without paramiko reported as failed'\n"
        "assert 'accelmatrix.backends.ssh.backend' not in sys.modules\n"
        "sys.modules['paramiko'] = None\n"
        "for m in [m for m in sys.modules if m == 'pandas' or m.startswith('pandas.')]:\n"
        "    del sys.modules[m]\n"
        "sys.modules['pandas'] = None\n"
        "failed = import_task_side_modules()\n"
        "assert 'pandas' in failed, failed\n"
        "assert 'accelmatrix.backends.ssh.backend' not in failed, failed\n"
        "print('ok')\n"
    )
    _run_fresh(code, tmp_path, timeout=180)


def test_the_preloaded_heap_stays_out_of_the_schedulers_garbage_collections(tmp_path):
    """Once the executor has forked its workers, the preloaded modules' objects are frozen
    (a full collection no longer walks them), and frozen again after LocalExecutor's
    freeze/fork/unfreeze of a worker respawn; later objects are still collected."""
    code = (
        "import gc\n"
        "from accelmatrix.deploy.executor import PreloadedLocalExecutor\n"
        "ex = PreloadedLocalExecutor(parallelism=2)\n"
        "ex.start()\n"
        "try:\n"
        "    frozen = gc.get_freeze_count()\n"
        "    assert frozen > 100_000, frozen  # pandas, Great Expectations, ... (~435,000)\n"
        "    assert 'great_expectations' in __import__('sys').modules\n"
        "    class Cycle: pass\n"
        "    c = Cycle(); c.me = c; del c\n"
        "    assert gc.collect() >= 1  # the new cycle: collection still works\n"
        "    gc.unfreeze()  # what LocalExecutor's worker respawn ends with\n"
        "    ex.sync()\n"
        "    assert gc.get_freeze_count() >= frozen, gc.get_freeze_count()\n"
        "finally:\n"
        "    ex.end()\n"
        "print('ok')\n"
    )
    _run_fresh(code, tmp_path, timeout=180)


def test_idle_workers_stop_on_sigterm(tmp_path):
    """The 3.3.2 scheduler sets its SIGTERM handler before it starts the executor; in a
    forked worker that handler returns without doing anything (``_exit_gracefully``: ``if not
    _is_parent_process(): return``). A plain LocalExecutor's idle workers therefore ignore
    SIGTERM; this executor's stop on it, and the scheduler keeps its handler. Both stop on
    ``end()`` as before. (The preload is left out here: it does not touch signals.)"""
    code = (
        "import multiprocessing, os, signal, time\n"
        "from airflow.executors.local_executor import LocalExecutor\n"
        "import accelmatrix.deploy.executor as mod\n"
        "def like_the_scheduler(signum, frame):\n"
        "    if multiprocessing.current_process().name != 'MainProcess':\n"
        "        return\n"
        "    raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, like_the_scheduler)\n"
        "mod.preload_task_side = lambda: []\n"
        "def alive_after_sigterm(ex):\n"
        "    ex.start()\n"
        "    try:\n"
        "        assert len(ex.workers) == 2, ex.workers\n"
        "        time.sleep(1)  # both in their idle loop\n"
        "        for pid in ex.workers:\n"
        "            os.kill(pid, signal.SIGTERM)\n"
        "        deadline = time.monotonic() + 5\n"
        "        while time.monotonic() < deadline:\n"
        "            if not any(p.is_alive() for p in ex.workers.values()):\n"
        "                break\n"
        "            time.sleep(0.1)\n"
        "        return sum(p.is_alive() for p in ex.workers.values())\n"
        "    finally:\n"
        "        ex.end()\n"
        "assert alive_after_sigterm(LocalExecutor(parallelism=2)) == 2\n"
        "assert alive_after_sigterm(mod.PreloadedLocalExecutor(parallelism=2)) == 0\n"
        "assert signal.getsignal(signal.SIGTERM) is like_the_scheduler\n"
        "print('ok')\n"
    )
    _run_fresh(code, tmp_path, timeout=120)


@pytest.mark.integration
@pytest.mark.slow(90)
def test_evaluate_runs_in_its_task_process_without_deferring(tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    suites = tmp_path / "suites"
    suites.mkdir()
    suite = {
        "description": "evaluate without a deferral",
        "schedule": None,
        "retries": 1,
        "retry_delay_seconds": 1,
        "axes": {"mode": ["pass", "check"], "i": [0, 1]},
        "machines": {"cpu": {"backend": "local", "pool": POOL, "pool_slots": 16}},
        "machine": "cpu",
        "workload": {"run": ["${python}", str(script), "${axis.mode}"], "timeout": 60},
        "checks": [{"type": "log_contains", "pattern": FINISHED}],
    }
    (suites / "preloaded.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    with AirflowStack(
        home=tmp_path / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=suites,
        parallelism=8,
        executor="PreloadedLocalExecutor",
    ) as stack:
        stack.create_pool(POOL, 16, include_deferred=True)
        stack.wait_for_dag("preloaded")
        run_id = stack.trigger("preloaded")
        state = stack.wait_for_run("preloaded", run_id, timeout=300)
        tis = stack.task_instances("preloaded", run_id)
        by, summary = by_step_and_cell(tis)
        assert state == "failed", summary  # the two check cells failed their check
        scheduler_log = (stack.logs_dir / "scheduler.log").read_text(errors="replace")
        assert "preloaded the accelmatrix task side" in scheduler_log, scheduler_log[-3000:]

        for cell in ("mode=pass,i=0", "mode=pass,i=1", "mode=check,i=0", "mode=check,i=1"):
            ev = by[("evaluate", cell)]
            log = stack.task_log("preloaded", run_id, ev["task_id"], map_index=ev["map_index"])
            # One start on a worker, evaluated there: never deferred, never resumed.
            assert log.count("::group::Pre Execute") == 1, log[-3000:]
            assert "Pausing task as DEFERRED" not in log, log[-3000:]
            assert "evaluating in this task process" in log, log[-3000:]
            assert "log_contains" in log and FINISHED in log, log[-3000:]  # the verdict table
            if cell.startswith("mode=pass"):
                assert (ev["state"], ev["try_number"]) == ("success", 1), summary
            else:
                # A check failure is a test failure: red on the first try, never retried.
                assert (ev["state"], ev["try_number"]) == ("failed", 1), summary
                assert "check(s) failed: log_contains" in log, log[-3000:]
                # The verdict table is the message: one line, no traceback after it.
                assert "Task exited" in log, log[-3000:]
                assert "error_detail" not in log and "Traceback" not in log, log[-3000:]
                assert "Task failed with exception" not in log, log[-3000:]
        # Everything else is green on its first try, but the gate, red for the failed cells.
        others = [ti for (step, _), ti in by.items() if step not in ("evaluate", "gate")]
        assert {(ti["state"], ti["try_number"]) for ti in others} == {("success", 1)}, summary
        assert by[("gate", None)]["state"] == "failed", summary

        from accelmatrix.results.store import ResultsStore

        store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
        try:
            cells = {c.cell_id: c.state for c in store.get_cells("preloaded", run_id)}
        finally:
            store.close()
        assert cells == {
            "mode=pass,i=0": "passed",
            "mode=pass,i=1": "passed",
            "mode=check,i=0": "failed",
            "mode=check,i=1": "failed",
        }, cells
        assert list((stack.accel_home / "work" / "preloaded").rglob("resource.json")) == []
