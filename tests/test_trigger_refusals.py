"""No silent greens and every suite triggerable: what a run is refused at trigger and plan
time, and what every example suite's trigger form accepts.

* A `cells` glob that selects no cell (``model=tiny-mpl,*``) planned 0 cells and the run
  ended green. It is refused by ``expand`` (so ``plan --cells`` and the DAG's ``plan`` task)
  and, before a run exists, by the plugin's trigger guard in front of
  ``POST /api/v2/dags/{dag_id}/dagRuns`` (the trigger form posts there too), each time with
  the valid cell ids. A plan with no cell to run fails the run.
* A param value out of range is refused through REST with the CLI's own message.
* Every example suite's defaults pass its trigger form: the form requires a value for
  each field whose type does not admit null, and validates it against the param's schema.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import jsonschema
import pytest
import yaml

from accelmatrix import lifecycle
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.params import ParamsError, parse_params
from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.spec.suite_files import suite_files, suite_id

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "include" / "suites"
SMOKE = SUITES / "local_smoke.yaml"
SMOKE_IDS = [
    "model=tiny-mlp,config=baseline",
    "model=tiny-mlp,config=diverge",
    "model=tiny-wide,config=baseline",
]
TYPO = "model=tiny-mpl,*"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "accelmatrix", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "plugins"), "PATH": "/usr/bin:/bin"},
        check=False,
    )


# -- the planner ---------------------------------------------------------------------------
def test_a_glob_selecting_nothing_is_refused_with_the_valid_cell_ids():
    suite = load_suite(SMOKE)
    with pytest.raises(PlanError) as e:
        expand(suite, "local_smoke", only=[TYPO])
    msg = str(e.value)
    assert f"cells: {TYPO!r} matches no cell id of local_smoke" in msg
    assert all(cid in msg for cid in SMOKE_IDS)
    # The excluded cell is not offered as a valid id, and a glob that reaches only it is
    # refused with the exclusion's reason.
    excluded = "model=tiny-wide,config=diverge"
    assert excluded + ";" not in msg and not msg.endswith(excluded)
    with pytest.raises(PlanError, match=r"matches only cells this run excludes: .*one diverging"):
        expand(suite, "local_smoke", only=["model=tiny-mlp,*", excluded])
    # Every glob must select something; together they still select what they match.
    plan = expand(suite, "local_smoke", only=["model=tiny-mlp,*", "*wide,config=baseline"])
    assert [c.id for c in plan.cells] == SMOKE_IDS


def test_plan_cli_refuses_a_glob_selecting_nothing():
    r = _cli("plan", str(SMOKE), "--cells", TYPO)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cells: {TYPO!r} matches no cell id of local_smoke" in r.stderr
    assert all(cid in r.stderr for cid in SMOKE_IDS)
    assert "Run plan" not in r.stdout  # no plan of 0 cells printed as if fine
    ok = _cli("plan", str(SMOKE), "--cells", "model=tiny-mlp,*")
    assert ok.returncode == 0 and "2 cell(s) to run" in ok.stdout, ok.stderr


def test_plan_step_fails_the_run_and_records_nothing(accel_home, tmp_path):
    ref = lifecycle.RunRef(dag_id="local_smoke", run_id="manual__typo")
    with pytest.raises(lifecycle.PlanRejected, match="matches no cell id") as e:
        lifecycle.plan_run(str(SMOKE), ref, {"cells": [TYPO]})
    assert all(cid in str(e.value) for cid in SMOKE_IDS)
    store = lifecycle.results_store()
    assert store.get_run("local_smoke", "manual__typo") is None  # never the "latest run"
    # A suite whose params exclude every cell: no cell to run is a failed plan, not a green run.
    raw = yaml.safe_load(SMOKE.read_text())
    raw["exclude"] = [{"match": {"model": "*"}, "reason": "everything out"}]
    empty = tmp_path / "empty_smoke.yaml"
    empty.write_text(yaml.safe_dump(raw))
    ref = lifecycle.RunRef(dag_id="empty_smoke", run_id="manual__empty")
    with pytest.raises(lifecycle.PlanRejected, match=r"no cell to run: all 4 cell\(s\)"):
        lifecycle.plan_run(str(empty), ref, {})
    assert store.get_run("empty_smoke", "manual__empty") is None


# -- optional params ------------------------------------------------------------------------
def test_optional_params_admit_null_and_the_rest_stay_required(tmp_path):
    raw = yaml.safe_load(SMOKE.read_text())
    raw["params"] = {
        "steps": {"type": "integer", "default": 20, "minimum": 8},
        "note": {"type": "string", "default": ""},
        "since": {"type": ["null", "string"], "default": None, "pattern": r"^\d{4}-\d\d-\d\d$"},
        "tier": {"type": "string", "default": None, "enum": ["a", "b"]},
    }
    p = tmp_path / "opt.yaml"
    p.write_text(yaml.safe_dump(raw))
    params = load_suite(p).params
    schemas = {k: v.json_schema() for k, v in params.items()}
    assert schemas["steps"] == {"type": "integer", "minimum": 8}
    assert schemas["note"] == {"type": ["string", "null"]}
    assert schemas["since"]["type"] == ["null", "string"]
    assert schemas["tier"] == {"type": ["string", "null"], "enum": ["a", "b", None]}
    for name in ("note", "since", "tier"):
        jsonschema.validate(None, schemas[name])  # an empty form field
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("March", schemas["since"])
    with pytest.raises(ParamsError, match=r"since: 'March' does not match .*\(allowed: null or"):
        parse_params('{"since": "March"}', load_suite(p), "x")
    raw["params"] = {"p": {"type": "integer", "pattern": "x"}}
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="pattern only applies to string params"):
        load_suite(p)


# -- through the REST API (and so the trigger form) -----------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from accelmatrix_testkit import AirflowStack

    root = tmp_path_factory.mktemp("trigger")
    with AirflowStack(
        home=root / "airflow",
        dags_folder=ROOT / "dags",
        suites_dir=SUITES,
        components=("dag-processor", "api-server"),
        all_admins=False,
        env_extra={"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer"},
    ) as s:
        yield s
    assert s.leftovers == []


def _token(stack, user: str) -> str:
    import json

    pw = json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())
    r = httpx.post(
        f"{stack.base_url}/auth/token", json={"username": user, "password": pw[user]}, timeout=30
    )
    r.raise_for_status()
    return r.json()["access_token"]


def _post_run(stack, dag_id: str, conf: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/api/v2/dags/{quote(dag_id)}/dagRuns",
        json={"logical_date": None, "conf": conf},
        headers=headers if headers is not None else dict(stack.client.headers),
        timeout=60,
    )


@pytest.mark.integration
@pytest.mark.slow(40)
def test_rest_trigger_refuses_a_glob_selecting_nothing(stack):
    stack.wait_for_dag("local_smoke", timeout=180)
    bad = _post_run(stack, "local_smoke", {"cells": [TYPO]})
    assert bad.status_code == 400, bad.text
    detail = bad.json()["detail"]
    assert f"cells: {TYPO!r} matches no cell id of local_smoke" in detail
    assert all(cid in detail for cid in SMOKE_IDS)
    runs = stack.api("GET", "dags/local_smoke/dagRuns")["dag_runs"]
    assert runs == []  # refused: no run exists, none becomes the latest

    # A param below its minimum: the message `plan --params` (and demo --conf) prints.
    low = _post_run(stack, "local_smoke", {"steps": 5})
    assert low.status_code == 400, low.text
    cli = _cli("plan", str(SMOKE), "--params", '{"steps": 5}')
    problem = "steps: 5 is less than the minimum of 8 (allowed: integer, >= 8, <= 500)"
    assert problem in cli.stderr and problem in low.json()["detail"]
    assert "- stepz: not a param" in _post_run(stack, "local_smoke", {"stepz": 5}).text

    # Only someone who may trigger the suite learns its cell ids: others get Airflow's answer.
    viewer = _post_run(
        stack,
        "local_smoke",
        {"cells": [TYPO]},
        {"Authorization": f"Bearer {_token(stack, 'viewer')}"},
    )
    assert viewer.status_code == 403 and SMOKE_IDS[0] not in viewer.text, viewer.text
    anonymous = _post_run(stack, "local_smoke", {"cells": [TYPO]}, {})
    assert anonymous.status_code == 401 and SMOKE_IDS[0] not in anonymous.text

    good = _post_run(stack, "local_smoke", {"cells": ["model=tiny-mlp,*"], "steps": 20})
    assert good.status_code == 200, good.text
    assert good.json()["conf"] == {"cells": ["model=tiny-mlp,*"], "steps": 20}


def _form_problems(params: dict) -> list[str]:
    """What Airflow 3.3.2's trigger form says about these params' initial values: a field
    whose schema type does not admit null is required (null or "" is "This field is
    required"), and each value must pass its schema (as the api-server validates it)."""
    problems = []
    for name, p in params.items():
        schema, value = p["schema"], p["value"]
        types = schema.get("type")
        required = bool(types) and not (isinstance(types, list) and "null" in types)
        if required and value in (None, ""):
            problems.append(f"{name}: This field is required (default {value!r}, {schema})")
            continue
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as e:
            problems.append(f"{name}: {e.message}")
    return problems


@pytest.mark.integration
@pytest.mark.parametrize("suite_file", suite_files(SUITES), ids=suite_id)
def test_every_example_suite_triggers_with_its_defaults(stack, suite_file):
    dag_id = suite_id(suite_file)
    stack.wait_for_dag(dag_id, timeout=180)
    details = stack.api("GET", f"dags/{dag_id}/details")
    assert "invalid-suite" not in [t["name"] for t in details["tags"]]
    params = details["params"]
    assert set(params) == {*load_suite(suite_file).params, "cells"}
    assert _form_problems(params) == []
    conf = {name: p["value"] for name, p in params.items()}
    r = _post_run(stack, dag_id, conf)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "queued"
