"""The dags/ folder as the DAG processor sees it: zero import errors, the expected graph."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from accelmatrix.steps.cell_operator import CELL_NAME

ROOT = Path(__file__).resolve().parents[1]


def bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"), safe_mode=True)


def test_dags_folder_has_no_import_errors():
    b = bag()
    assert b.import_errors == {}
    suites = {p.stem for p in (ROOT / "include" / "suites").glob("*.yaml")}
    assert suites <= set(b.dag_ids)


def test_local_smoke_graph():
    dag = bag().dags["local_smoke"]
    ids = {t.task_id for t in dag.tasks}
    steps = ["provision", "setup", "run", "collect", "evaluate", "teardown"]
    assert ids == {"plan", "gate", *(f"cpu-small.{s}" for s in steps)}
    t = dag.task_dict
    assert t["cpu-small.teardown"].is_teardown and t["cpu-small.provision"].is_setup
    # The gate is a setup-less teardown that fails the run: "Mark run as failed" does not
    # skip it, and it waits for every cell's teardown (see accelmatrix.cleanup.stopped).
    assert t["gate"].is_teardown and t["gate"].on_failure_fail_dagrun
    assert t["gate"].trigger_rule == "all_done_setup_success"
    assert "cpu-small.teardown" in t["gate"].upstream_task_ids
    assert not any(u.is_setup for u in t["gate"].upstream_list)  # so it behaves as all_done
    assert t["cpu-small.collect"].trigger_rule == "all_done_setup_success"
    # The pool of the machine bounds concurrent provision/setup/run.
    for s in ("provision", "setup", "run"):
        assert t[f"cpu-small.{s}"].pool == "accelmatrix_cpu_small"
    assert set(dag.params) == {"steps", "cells"}
    assert dag.params["steps"] == 20
    # The grid names mapped cells by id.
    assert all(t[f"cpu-small.{s}"].map_index_template == CELL_NAME for s in steps)
    # Teardown follows collect, so a machine is not held while evaluation runs.
    assert "cpu-small.teardown" in t["cpu-small.collect"].downstream_task_ids


def _suite(machines: dict, machine_axis: list[str] | None) -> dict:
    d = {
        "axes": {"x": ["a", "b"]},
        "machines": machines,
        "workload": {"run": ["${python}", "-c", "pass"]},
    }
    if machine_axis:
        d["axes"]["machine"] = machine_axis
    return d


def test_broken_suite_does_not_break_the_others(tmp_path):
    """A broken suite becomes a visible, paused stand-in DAG; the others still load."""
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(_suite({"m": {"backend": "local"}}, None)))
    multi = _suite({"m-a": {"backend": "local"}, "m-b": {"backend": "local"}}, ["m-a", "m-b"])
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump(multi))
    (tmp_path / "broken.yaml").write_text("axes: {x: [a]}\nmachines: {m: {backend: gpu}}\n")
    code = textwrap.dedent(
        """
        import json
        from airflow.dag_processing.dagbag import DagBag
        b = DagBag(dag_folder=DAGS, safe_mode=True)
        print(json.dumps({
            "errors": list(b.import_errors),
            "dags": sorted(b.dag_ids),
            "broken_tasks": [t.task_id for t in b.dags["broken"].tasks],
            "broken_tags": sorted(b.dags["broken"].tags),
            "broken_desc": b.dags["broken"].description,
            "multi_tasks": sorted(t.task_id for t in b.dags["multi"].tasks),
        }))
        """
    ).replace("DAGS", repr(str(ROOT / "dags")))
    import json
    import os

    env = {**os.environ, "ACCELMATRIX_SUITES_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["errors"] == []
    suites = [d for d in res["dags"] if not d.startswith("accelmatrix_")]  # + maintenance DAGs
    assert suites == ["broken", "good", "multi"]
    assert res["broken_tasks"] == ["suite_invalid"]
    assert "invalid-suite" in res["broken_tags"]
    assert "machines.m.backend" in res["broken_desc"]
    # Several machines: one mapped group (and one selector) per machine, one pool each.
    assert {"cells_m-a", "cells_m-b", "m-a.run", "m-b.run"} <= set(res["multi_tasks"])


def _weights(dag) -> dict[str, int]:
    """Each task's priority weight as the scheduler computes it from the serialized DAG."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.task.priority_strategy import validate_and_load_priority_weight_strategy

    tasks = DagSerialization.from_dict(DagSerialization.to_dict(dag)).tasks
    return {
        t.task_id: validate_and_load_priority_weight_strategy(t.weight_rule).get_weight(
            TaskInstance(task=t, run_id="r", dag_version_id=None)
        )
        for t in tasks
    }


def test_slot_order(tmp_path):
    """machine_time: a provisioned cell's steps outrank new provisions; throughput: Airflow's
    default rule, every provision first."""
    from accelmatrix.dag_factory import build_dag

    weights = {}
    for order in ("machine_time", "throughput"):
        path = tmp_path / f"{order}.yaml"
        path.write_text(
            yaml.safe_dump({**_suite({"m": {"backend": "local"}}, None), "slot_order": order})
        )
        weights[order] = _weights(build_dag(path, use_cache=False))
    w = weights["machine_time"]
    assert w["m.setup"] == w["m.run"] > w["m.collect"] == w["m.evaluate"] == w["m.teardown"]
    assert w["m.teardown"] > w["m.provision"]
    w = weights["throughput"]
    assert w["m.provision"] > w["m.setup"] > w["m.run"] > w["m.collect"] > w["m.evaluate"]
