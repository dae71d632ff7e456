"""The inference suite end to end with dag.test(): 2 models x 2 configs, real servers.

One model's golden file is deliberately broken (a response that differs, an expected error
code that does not match): its cell must fail naming those cases and the first difference,
while the good cells pass on both configs (sharded drops single_shard_only cases).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from test_dag_local import run_dag, store

from accelmatrix import settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "include" / "workloads" / "inference" / "cases" / "tiny-gen.yaml"

SUITE = """
axes:
  model:
    good: {name: tiny-gen, cases: "%(good)s"}
    broken: {name: tiny-gen, cases: "%(broken)s"}
  config:
    base: {deployment_framework: hf_transformers, dtype: float32, resources: {gpu: null}}
    sharded2: {deployment_framework: tgis_native, dtype: bfloat16, num_shard: 2,
               flash_attention: true, resources: {gpu: 2}}
axis_kinds: {config: inference_model_config}
exclude:
  - match: {model: broken, config: sharded2}
    reason: one broken cell is enough
machines:
  cpu: {backend: local, pool_slots: 2}
machine: cpu
workload:
  services:
    - name: server
      run: ["${python}", "%(wl)s/server.py", --model, "${axis.model.name}",
            --config-json, "${axis.config.json}", --port-file, "${work_dir}/server.port"]
      ready: {port_file: server.port, timeout: 30}
  run: ["${python}", "%(wl)s/run_cases.py", --cases, "${axis.model.cases}",
        --port-file, "${work_dir}/server.port", --num-shard, "${axis.config.num_shard}",
        --strategy, approximate, --epsilon, "0.05", --out-dir, "${work_dir}/out"]
  timeout: 60
  artifacts: ["out/**"]
  metrics: [{type: json, path: out/case_metrics.json}]
checks:
  - {type: golden_cases, name: golden responses match, max_failed: 0}
"""


def test_inference_suite_end_to_end(airflow_db, tmp_path, monkeypatch):
    cases = yaml.safe_load(CASES.read_text())
    keep = {"greedy-basic", "stop-sequence", "too-many-new-tokens", "timing-sensitive"}
    good = [c for c in cases if c["name"] in keep]
    broken = {c["name"]: c for c in json.loads(json.dumps(good))}
    broken["greedy-basic"]["response"]["responses"][0]["text"] = "a different golden text"
    broken["too-many-new-tokens"]["error"]["code"] = "RESOURCE_EXHAUSTED"
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(list(broken.values())))
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "inference_it.yaml").write_text(
        textwrap.dedent(SUITE)
        % {
            "good": tmp_path / "good.yaml",
            "broken": tmp_path / "broken.yaml",
            "wl": ROOT / "include" / "workloads" / "inference",
        }
    )
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))

    state, run_id, tis = run_dag("inference_it")
    cells = {c.cell_id: c for c in store().get_cells("inference_it", run_id)}
    assert state == "failed"  # the broken cell turns the run red

    base, sharded = "model=good,config=base", "model=good,config=sharded2"
    bad = "model=broken,config=base"
    assert cells[base].state == "passed" and cells[sharded].state == "passed"
    assert cells["model=broken,config=sharded2"].state == "excluded"
    assert cells[bad].state == "failed"
    msg = cells[bad].message
    assert "golden responses match: 4 of 8 golden case(s) failed" in msg
    assert "greedy-basic: responses[0].text: expected 'a different golden text', got" in msg
    assert "greedy-basic[stream]: responses[0].text" in msg
    assert (
        "too-many-new-tokens: error code: expected RESOURCE_EXHAUSTED, got INVALID_ARGUMENT" in msg
    )

    for cid in (base, sharded, bad):
        assert tis[("cpu.teardown", cid)] == "success"
        art = settings.cell_artifacts_dir("inference_it", run_id, cid)
        # started by setup, stopped (SIGTERM, clean exit) by teardown
        assert "server stopped" in (art / "service-server.log").read_text()
        assert (art / "output.log").read_text().count("Case plan:") == 1

    def results(cid):
        art = settings.cell_artifacts_dir("inference_it", run_id, cid) / "files" / "out"
        rows = [json.loads(x) for x in (art / "results.jsonl").read_text().splitlines()]
        health = json.loads((art / "server_health.json").read_text())
        return {r["id"]: r["status"] for r in rows}, health

    base_rows, base_health = results(base)
    shard_rows, shard_health = results(sharded)
    assert base_rows["stop-sequence[stream]"] == "passed"
    assert shard_rows["stop-sequence"] == shard_rows["stop-sequence[stream]"] == "skipped"
    assert base_rows["timing-sensitive"] == "unchecked"
    # CPU-only hides GPUs; the sharded config got its own dtype and shard count
    assert base_health["cuda_visible_devices"] == "-1"
    assert shard_health["cuda_visible_devices"] is None
    assert (
        shard_health["config"]["dtype"] == "bfloat16" and shard_health["config"]["num_shard"] == 2
    )

    metrics = store().metrics_frame("inference_it", run_id)
    m = metrics[metrics.cell_id == sharded].set_index("name").value
    assert m["cases_failed"] == 0 and m["cases_skipped"] == 2 and m["cases_passed"] == 4
