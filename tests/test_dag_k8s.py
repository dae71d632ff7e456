"""A suite with `k8s-job` machines end to end with `dag.test()`, against the API emulator.

plan -> provision -> setup (setup Job) -> run (Job, deferred to the trigger streaming the
pod log) -> collect -> evaluate -> teardown -> gate, with one passing cell, one failing
workload (a test failure) and one cell whose image cannot be pulled (an infrastructure
failure). Everything goes through the provider's KubernetesHook and the real client.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from test_dag_local import run_dag, store

from accelmatrix import settings
from accelmatrix.hooks import k8s as k8s_hook
from accelmatrix_testkit.k8s_emulator import Cluster

pytestmark = pytest.mark.integration

SUITE = """
description: GPU jobs on Kubernetes (emulated)
axes:
  machine: [l4, broken]
  mode:
    ok: {code: "import os; os.makedirs('out', exist_ok=True); open('out/r.txt', 'w').write('1'); print('Finished training run')"}
    crash: {code: "import sys; print('about to fail', flush=True); sys.exit(3)"}
exclude:
  - match: {machine: broken, mode: crash}
    reason: one infra cell is enough
machines:
  l4:
    backend: k8s-job
    kubernetes_conn_id: accelmatrix_dag_k8s
    image: us-docker.pkg.dev/acme/trainer:1
    gpus: 1
    accelerator: nvidia-l4
    python: @PYTHON@
    artifacts_volume: {claim_name: accel-work, local_path: @VOLUME@}
  broken:
    backend: k8s-job
    kubernetes_conn_id: accelmatrix_dag_k8s
    image: fault/bad-image
    python: @PYTHON@
workload:
  setup:
    - ["${python}", "-c", "print('setup ok')"]
  run: ["${python}", "-c", "${axis.mode.code}"]
  timeout: 60
  artifacts: ["out/**"]
checks:
  - {type: log_contains, pattern: Finished training run}
"""


def test_k8s_suite_end_to_end(airflow_db, tmp_path, monkeypatch):
    volume = tmp_path / "volume"
    volume.mkdir()
    suites = tmp_path / "suites"
    suites.mkdir()
    text = SUITE.replace("@PYTHON@", sys.executable).replace("@VOLUME@", str(volume))
    (suites / "k8s_cells.yaml").write_text(textwrap.dedent(text))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    with Cluster(tmp_path / "cluster", ("default",), volumes={"accel-work": volume}) as c:
        for key, value in c.emulator.airflow_conn_env("accelmatrix_dag_k8s").items():
            monkeypatch.setenv(key, value)
        k8s_hook.forget()
        try:
            state, run_id, tis = run_dag("k8s_cells")
        finally:
            k8s_hook.forget()
        left = c.emulator.state()
    cells = {x.cell_id: x for x in store().get_cells("k8s_cells", run_id)}
    ok, crash, broken = "machine=l4,mode=ok", "machine=l4,mode=crash", "machine=broken,mode=ok"
    assert state == "failed" and tis[("gate", "-1")] == "failed"

    assert cells[ok].state == "passed", cells[ok]
    for step in ("provision", "setup", "run", "collect", "evaluate", "teardown"):
        assert tis[(f"l4.{step}", ok)] == "success", step
    art = settings.cell_artifacts_dir("k8s_cells", run_id, ok)
    assert "Finished training run" in (art / "output.log").read_text()
    assert json.loads((art / "status.json").read_text())["exit_code"] == 0
    assert (art / "files" / "out" / "r.txt").read_text() == "1"
    assert "[setup-0] setup ok" in (art / "setup.log").read_text()

    # A failing workload is a test failure: run fails, teardown still runs.
    assert tis[("l4.run", crash)] == "failed"
    assert tis[("l4.teardown", crash)] == "success"
    assert cells[crash].state == "run_failed" and cells[crash].exit_code == 3
    crash_art = settings.cell_artifacts_dir("k8s_cells", run_id, crash)
    assert "about to fail" in (crash_art / "output.log").read_text()

    # The image cannot be pulled: an infrastructure failure, named as such.
    assert cells[broken].state == "infra_failed", cells[broken]
    assert "fault/bad-image" in cells[broken].message
    # (run_dag names mapped tasks by the global cell index; this group maps one cell.)
    assert [st for (t, _), st in tis.items() if t == "broken.teardown"] == ["success"]
    assert [st for (t, _), st in tis.items() if t == "broken.setup"] == ["failed"]

    # Teardown left nothing behind on the cluster.
    assert left["jobs"] == {} and left["pods"] == {}
    for cid in (ok, crash, broken):
        assert cells[cid].teardown_at is not None, cid
