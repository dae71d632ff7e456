"""A 2-pod torch DDP (gloo) cell on a `k8s-jobset` machine end to end with `dag.test()`.

The emulator's JobSet controller creates the child Job, the headless Service and two pods;
the fake kubelet runs each pod as a real `train_tiny.py --rendezvous env` process that finds
its peer through MASTER_ADDR (the leader's JobSet hostname, resolved to loopback only
because the Service exists) and a per-JobSet port. The checks judge what the pods produced:
loss decreasing, the step time from rank 0's profiler trace, and the group's timing. A
second cell crashes rank 1: the cell fails as a test failure naming that pod, its peer is
stopped, and nothing is left on the cluster.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from test_dag_local import run_dag, store

from accelmatrix import settings
from accelmatrix.hooks import k8s as k8s_hook
from accelmatrix_testkit.k8s_emulator import Cluster

pytestmark = pytest.mark.integration
INCLUDE = Path(__file__).resolve().parents[1] / "include"

SUITE = """
description: 2-pod DDP on a JobSet (emulated)
axes:
  mode:
    ok: {fail: none}
    crash: {fail: crash}
machines:
  ddp2:
    backend: k8s-jobset
    kubernetes_conn_id: accelmatrix_dag_jobset
    image: us-docker.pkg.dev/acme/trainer:1
    python: @PYTHON@
    include_dir: @INCLUDE@
    num_nodes: 2
    max_restarts: 0
    artifacts_volume: {claim_name: accel-work, local_path: @VOLUME@}
workload:
  run: ["${python}", "${include_dir}/workloads/train_tiny.py", "--rendezvous", "env",
        "--steps", "12", "--out-dir", "${work_dir}/out", "--profiler", "light",
        "--fail-mode", "${axis.mode.fail}", "--fail-rank", "1"]
  timeout: 180
  artifacts: ["out/**"]
  metrics:
    - {type: jsonl, path: out/metrics.jsonl}
    - {type: profiler_trace, glob: "out/*.pt.trace.json", name: step_time}
checks:
  - {type: exit_status, expected: 0}
  - {type: log_contains, pattern: Finished training run}
  - {type: loss_decreasing, metric: loss, window: 3}
  - {type: artifact_count, glob: "out/*.pt.trace.json", count: 1}
  - {name: step time from the trace, type: metric_between, metric: step_time, min: 0.00001, max: 5}
  - {name: all pods running within 60 s, type: metric_between, metric: runner.all_pods_running_s, max: 60}
  - {name: rendezvous within 30 s, type: metric_between, metric: runner.rendezvous_s, max: 30}
"""


@pytest.mark.slow(30)
def test_two_pod_ddp_cell_end_to_end(airflow_db, tmp_path, monkeypatch):
    volume = tmp_path / "volume"
    volume.mkdir()
    suites = tmp_path / "suites"
    suites.mkdir()
    text = (
        SUITE.replace("@PYTHON@", sys.executable)
        .replace("@VOLUME@", str(volume))
        .replace("@INCLUDE@", str(INCLUDE))
    )
    (suites / "jobset_ddp.yaml").write_text(textwrap.dedent(text))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    with Cluster(tmp_path / "cluster", ("default",), volumes={"accel-work": volume}) as c:
        for key, value in c.emulator.airflow_conn_env("accelmatrix_dag_jobset").items():
            monkeypatch.setenv(key, value)
        k8s_hook.forget()
        try:
            state, run_id, tis = run_dag("jobset_ddp")
        finally:
            k8s_hook.forget()
        left = c.emulator.state()
        jobsets = dict(c.jobsets.jobsets)
    cells = {x.cell_id: x for x in store().get_cells("jobset_ddp", run_id)}
    ok, crash = "mode=ok", "mode=crash"
    assert state == "failed" and tis[("gate", "-1")] == "failed"

    assert cells[ok].state == "passed", cells[ok]
    checks = store().checks_frame("jobset_ddp", run_id)
    assert checks[checks.cell_id == ok].passed.all()
    art = settings.cell_artifacts_dir("jobset_ddp", run_id, ok)
    leader_log = (art / "output.log").read_text()
    assert "rank 0/2 joined" in leader_log and "Finished training run" in leader_log
    pod_logs = {p.name: p.read_text() for p in (art / "pods").iterdir()}
    assert len(pod_logs) == 2, pod_logs
    assert any("rank 1/2 joined" in t for t in pod_logs.values())  # the other pod's log
    metrics = store().metrics_frame("jobset_ddp", run_id)
    mine = metrics[metrics.cell_id == ok]
    assert set(mine.name) >= {"loss", "step_time", "runner.rendezvous_s"}
    assert len(mine[mine.name == "loss"]) == 12  # rank 0's one point per step

    # Rank 1 crashed: a test failure named by that pod; its peer did not hang on.
    assert tis[("ddp2.run", crash)] == "failed"
    assert cells[crash].state == "run_failed", cells[crash]
    assert "workers-0-1-" in cells[crash].message and "exited with 1" in cells[crash].message
    assert "injected failure" in cells[crash].message
    assert tis[("ddp2.teardown", crash)] == "success"

    assert left["jobs"] == {} and left["pods"] == {} and left["services"] == {}
    assert jobsets == {}


SUITE_KUEUE = """
description: a Kueue-queued JobSet evicted mid-run (emulated)
axes:
  mode:
    once: {x: 1}
retries: 1
retry_delay_seconds: 1
machines:
  queued:
    backend: k8s-jobset
    kubernetes_conn_id: accelmatrix_dag_jobset
    image: us-docker.pkg.dev/acme/trainer:1
    python: @PYTHON@
    num_nodes: 2
    kueue: {queue_name: team-a, priority_class: batch}
workload:
  run: ["${python}", "-c", "import os, pathlib, time; m = pathlib.Path(os.environ['MARKER'] + os.environ['RANK']); first = not m.exists(); m.touch(); time.sleep(60 if first else 0); print('Finished training run')"]
  env: {MARKER: "@MARKER@"}
  timeout: 120
checks:
  - {type: log_contains, pattern: Finished training run}
"""


def test_a_kueue_eviction_mid_run_is_retried_as_infrastructure(airflow_db, tmp_path, monkeypatch):
    import threading
    import time

    suites = tmp_path / "suites"
    suites.mkdir()
    text = SUITE_KUEUE.replace("@PYTHON@", sys.executable).replace(
        "@MARKER@", str(tmp_path / "marker")
    )
    (suites / "jobset_kueue.yaml").write_text(textwrap.dedent(text))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    evicted: list[str] = []
    with Cluster(tmp_path / "cluster", ("default",)) as c:

        def evict_once() -> None:  # Kueue preempts the first JobSet once its pods run
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not evicted:
                with c.emulator.lock:
                    running = [
                        p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name")
                        for p in c.emulator.pods.values()
                        if p["status"]["phase"] == "Running"
                    ]
                if len(running) == 2:
                    c.jobsets.evict("default", running[0])
                    evicted.append(running[0])
                time.sleep(0.1)

        threading.Thread(target=evict_once, daemon=True).start()
        for key, value in c.emulator.airflow_conn_env("accelmatrix_dag_jobset").items():
            monkeypatch.setenv(key, value)
        k8s_hook.forget()
        try:
            state, run_id, tis = run_dag("jobset_kueue")
        finally:
            k8s_hook.forget()
        left = c.emulator.state()
        jobsets = dict(c.jobsets.jobsets)
    cell = store().get_cells("jobset_kueue", run_id)[0]
    assert evicted, "the eviction never happened"
    assert state == "success" and cell.state == "passed", cell
    art = settings.cell_artifacts_dir("jobset_kueue", run_id, cell.cell_id)
    assert "Finished training run" in (art / "output.log").read_text()
    assert list(art.glob("status.json.*")), "the evicted attempt's status was kept"
    assert left["pods"] == {} and left["services"] == {} and jobsets == {}
