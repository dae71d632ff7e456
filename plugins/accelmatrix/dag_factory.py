"""Suite YAML -> Airflow DAG (the converter from config to graph).

Graph of every suite DAG:

    plan ──> <machine>.[provision -> setup -> run -> collect -> evaluate]  (mapped per cell)
         │                  └──────────── teardown (after collect) ──┘
         └─────────────────────────────────────────────────────────────> gate

* One mapped task group per machine used by the suite, so each group carries that machine's
  Airflow pool (a pool is fixed per task, it cannot vary by map index).
* The matrix is expanded at run time by `plan` (dynamic task mapping), never by parse-time
  loops: a 500-cell suite is still 8 tasks in the DAG file.
* `teardown` is a teardown task of `provision`: it runs after failures. It follows collect
  directly, so a machine is not held while Great Expectations evaluates. A cell whose
  workload ended (passed, or failed as a test) has its machine released by `run` already.
* Free executor slots go first to the steps that hold a machine, last to provision
  (STEP_PRIORITY): machines are created as fast as the cells holding them can be driven.
  A suite of cheap machines can choose Airflow's default order instead (`slot_order:
  throughput`): the shortest run, with every machine created early and waiting idle.
* `gate` fails the run exactly when a non-quarantined cell did not pass: never a green run
  with red cells. It is a teardown task (without setup) with ``on_failure_fail_dagrun``,
  after every cell's teardown, so it also runs when a person marks the run failed.
* `export` (only with ACCELMATRIX_WAREHOUSE_DATASET set) follows the gate: the run's rows to
  BigQuery (accelmatrix.warehouse), a teardown too, so its outcome never changes the verdict.

Parse-time cost: a suite is validated (pydantic + PyYAML) when its file or our code changed;
otherwise its DAG is built from the cached DagShape, and a task process builds only its own
DAG (dag_shape.py). The operators import their steps at the top (the suite models, the
results store's light package, the machine models: about 0.1 s once per process; Airflow's
``parsing_pre_import_modules`` pays it once in the DAG processor). Everything heavy
(pandas, NumPy, Great Expectations, SQLAlchemy, torch) is imported inside tasks.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, get_parsing_context, task, task_group
from airflow.sdk.exceptions import AirflowFailException
from airflow.task.trigger_rule import TriggerRule

from accelmatrix import settings
from accelmatrix.dag_shape import LISTED_CELLS, CellGroup, DagShape, load_shape
from accelmatrix.preflight import preflight_step
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.spec.suite_files import suite_files, suite_id
from accelmatrix.spec.timeouts import CellTimeouts
from accelmatrix.steps.collect.operator import CollectOperator
from accelmatrix.steps.common import RunRef, cell_refs, planned_cells
from accelmatrix.steps.evaluate.operator import EvaluateCellOperator
from accelmatrix.steps.provision.operator import ProvisionOperator
from accelmatrix.steps.run.operator import RunWorkloadOperator
from accelmatrix.steps.setup.operator import SetupOperator
from accelmatrix.steps.teardown.operator import TeardownOperator
from accelmatrix.warehouse.config import export_enabled

log = logging.getLogger(__name__)

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
# The DAG of a suite file whose name is no valid DAG id.
INVALID_SUITE_DAG_ID = "accelmatrix_invalid_suite"


def _ref() -> RunRef:
    return RunRef.from_context(get_current_context())


# -- run-level tasks (thin wrappers over accelmatrix.lifecycle) ---------------------------
@task(task_id="plan", retries=0)
def plan_task(suite_path: str) -> list[dict[str, Any]]:
    # Inside the task: the run's plan and gate load the perf history (NumPy), which DAG
    # parsing must not pay for (bench/bench_parse.py).
    from accelmatrix.lifecycle.plan_step import plan_run

    ctx = get_current_context()
    dr = ctx["dag_run"]
    cells = plan_run(
        suite_path,
        _ref(),
        dict(ctx["params"]),
        logical_date=getattr(dr, "logical_date", None),
        # DagRunType is a str enum whose str() is "DagRunType.BACKFILL": store its value.
        run_type=str(getattr(rt, "value", rt) or "")
        if (rt := getattr(dr, "run_type", None))
        else None,
        conf=dict(getattr(dr, "conf", None) or {}),
    )
    # The cells themselves are in the results store; Airflow maps over references to them
    # (lifecycle/plan_step.py says why).
    return cell_refs(cells)


@task(retries=0)
def select_task(cells: list[dict[str, Any]], machine: str) -> list[dict[str, Any]]:
    """The cells of one machine kind (only in suites that use several machines)."""
    return [c for c in cells if c["machine"] == machine]


@task(task_id="preflight", retries=0)
def preflight_task(suite_path: str, planned: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's preflight checks; when one fails no cell is provisioned."""
    ref = _ref()
    cells = planned_cells(ref, planned)
    return preflight_step(suite_path, cells, ref, dict(get_current_context()["params"]))


@task(task_id="gate", trigger_rule=TriggerRule.ALL_DONE, retries=0)
def gate_task(planned: list[dict[str, Any]], suite_path: str | None = None) -> dict[str, Any]:
    # Inside the task: the run's plan and gate load the perf history (NumPy), which DAG
    # parsing must not pay for (bench/bench_parse.py).
    from accelmatrix.lifecycle.gate import gate

    ref = _ref()
    return gate(planned_cells(ref, planned), ref, suite_path)


@task(task_id="export", retries=0)
def export_task() -> dict[str, Any]:
    # Retries inside (the export as a unit, with backoff): one log line if it still fails.
    from accelmatrix.warehouse.task import export_step

    ref = _ref()
    return export_step(ref.dag_id, ref.run_id)


@task(task_id="suite_invalid", retries=0)
def invalid_task(message: str) -> None:
    raise AirflowFailException(message)


# -- graph --------------------------------------------------------------------------------
def _params(shape: DagShape) -> dict[str, Param]:
    params = {
        name: Param(p["default"], description=p["description"], **p["schema"])
        for name, p in shape.params.items()
    }
    params["cells"] = Param(
        ["*"], type="array", items={"type": "string"}, description=_cells_doc(shape)
    )
    return params


def _cells_doc(shape: DagShape) -> str:
    """The `cells` param's help in the trigger form: the globs' form and the suite's cell ids."""
    text = "Run only the cells whose id matches one of these globs"
    ids = shape.cell_ids
    if not ids:
        return text + ", e.g. model=tiny-mlp,*"
    text += f", e.g. {ids[0].split(',')[0]},*. The {len(ids)} cell id(s) with default params: "
    listed = ids[:LISTED_CELLS]
    more = f" ... and {len(ids) - len(listed)} more" if len(ids) > len(listed) else ""
    return text + "; ".join(listed) + more


def used_machines(suite: Any) -> list[str]:
    """The machine kinds a validated suite runs its cells on (one task group each)."""
    if "machine" in suite.axes:
        return suite.axis_labels("machine")
    return [suite.machine or next(iter(suite.machines))]


# Which ready task gets a free executor slot first (absolute priority_weight). The steps that
# hold a machine (setup, run) outrank the steps after it is gone (collect, evaluate, and
# teardown: `run` releases a passing cell's machine, so teardown usually only checks; when it
# does release one, it still outranks every provision), and provision ranks last: a new
# machine is created only when no cell that already holds one is waiting for a slot. Under
# Airflow's default rule (downstream) every provision came first, so a 64-cell run held all
# 64 machines while each waited its turn for the steps that use it.
STEP_PRIORITY = {"provision": 1, "collect": 2, "evaluate": 2, "teardown": 2, "setup": 3, "run": 3}


def _priority(shape: DagShape, step: str) -> dict[str, Any]:
    """The priority arguments of one step's operator under the suite's ``slot_order``.

    ``machine_time`` (the default): STEP_PRIORITY as absolute weights. ``throughput``: nothing,
    so Airflow's default rule applies (a task's weight is the sum over its downstream tasks,
    which ranks every provision first). At 256 cells that order ran in 1.12x the bare DAG's
    time against 1.52x, but the median cell held its machine 247 s longer than its workload
    ran (BENCHMARKS.md): the right trade only where an idle machine costs nothing.
    """
    if shape.slot_order == "throughput":
        return {}
    return {"priority_weight": STEP_PRIORITY[step]}


def _weight_rule(shape: DagShape) -> dict[str, str]:
    """Default args for the whole DAG: with STEP_PRIORITY each task's own weight counts."""
    return {} if shape.slot_order == "throughput" else {"weight_rule": "absolute"}


def _cell_group(shape: DagShape, group: CellGroup, cells: Any) -> Any:
    """The mapped task group running every cell of one machine kind."""
    pool = group.pool
    timeouts = CellTimeouts(setup_s=shape.setup_timeout, workload_s=shape.run_timeout)

    @task_group(group_id=group.machine)
    def cell_group(cell: dict[str, Any]) -> None:
        provision = ProvisionOperator(
            task_id="provision", cell=cell, pool=pool, **_priority(shape, "provision")
        )
        resource = provision.output
        done_setup = SetupOperator(
            task_id="setup",
            cell=cell,
            resource=resource,
            pool=pool,
            execution_timeout=timeouts.setup_task(),
            **_priority(shape, "setup"),
        )
        run = RunWorkloadOperator(
            task_id="run",
            cell=cell,
            resource=resource,
            pool=pool,
            execution_timeout=timeouts.run_task(),
            **_priority(shape, "run"),
        )
        collected = CollectOperator(
            task_id="collect",
            cell=cell,
            trigger_rule=TriggerRule.ALL_DONE_SETUP_SUCCESS,
            **_priority(shape, "collect"),
        )
        evaluated = EvaluateCellOperator(
            task_id="evaluate",
            cell=cell,
            trigger_rule=TriggerRule.ALL_DONE_SETUP_SUCCESS,
            retries=0,
            **_priority(shape, "evaluate"),
        )
        torn = TeardownOperator(
            task_id="teardown",
            cell=cell,
            resource=resource,
            **_priority(shape, "teardown"),
        ).as_teardown(setups=provision)
        done_setup >> run >> collected >> evaluated
        collected >> torn

    return cell_group.expand(cell=cells)


# DAGs built by prebuild_dags() in a process that then forks task processes, by (suite file,
# hash of its content), and the pid that built them.
_prebuilt: dict[tuple[str, str], DAG] = {}
_prebuilt_by: int | None = None


def prebuild_dags(suites_dir: Path | str | None = None) -> int:
    """Build every valid suite's DAG now, for the task processes this process will fork.

    Why: a task process parses the DAG file to find its task, and building a suite's DAG
    (operators, the mapped task group, its edges) was ~12 % of a short task's CPU in a
    py-spy profile of a 64-cell run. Built once here (accelmatrix.deploy.preload), each forked
    process takes its DAG from memory instead (build_dag), once, and only while the suite
    file's content is what it was here; the code is the same by construction (a fork).
    Returns how many DAGs were built.
    """
    global _prebuilt_by
    root = Path(suites_dir) if suites_dir else settings.suites_dir()
    _prebuilt.clear()
    for path in suite_files(root):
        try:
            _prebuilt[(str(path), _content_key(path))] = build_dag(path)
        except (SuiteError, OSError):
            continue  # each task process reports it where it belongs, as it did before
    _prebuilt_by = os.getpid()
    return len(_prebuilt)


def _content_key(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _take_prebuilt(path: Path) -> DAG | None:
    """The DAG prebuild_dags() built in the parent of this forked process, taken once."""
    if not _prebuilt or _prebuilt_by in (None, os.getpid()):
        return None
    try:
        return _prebuilt.pop((str(path), _content_key(path)), None)
    except OSError:
        return None


def build_dag(path: Path | str, *, use_cache: bool = True) -> DAG:
    """The DAG of one suite file. Raises SuiteError when the file is invalid.

    ``use_cache``: take the DAG prebuilt before this process was forked (prebuild_dags),
    else build from the cached DagShape when it matches the file and the code.
    """
    path = Path(path)
    if use_cache and (dag := _take_prebuilt(path)) is not None:
        return dag
    shape = load_shape(path, use_cache=use_cache)
    dag_id = shape.dag_id
    doc = (
        f"### {dag_id}\n\n{shape.description}\n\nSuite file: `{path.name}`. "
        "Trigger with params to select cells (`cells`) or change suite params."
    )
    with DAG(
        dag_id=dag_id,
        description=(shape.description or f"accelmatrix suite {dag_id}")[:200],
        schedule=shape.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=shape.max_active_runs,
        params=_params(shape),
        tags=sorted({"accelmatrix", *shape.tags}),
        default_args={
            "owner": ",".join(shape.owners),
            "retries": shape.retries,
            "retry_delay": timedelta(seconds=shape.retry_delay_seconds),
            "execution_timeout": timedelta(minutes=30),
            **_weight_rule(shape),
        },
        doc_md=doc,
    ) as dag:
        planned = plan_task(str(path))
        groups = []
        for group in shape.groups:
            # Airflow maps only over a task's whole return value, so a suite with several
            # machines gets one tiny selector per machine; a single-machine suite maps the
            # plan directly.
            cells = planned
            if len(shape.groups) > 1:
                cells = select_task.override(task_id=f"cells_{group.machine}")(
                    planned, group.machine
                )
            groups.append(_cell_group(shape, group, cells))
        if shape.preflight:  # between plan and every provision
            preflight_task(str(path), planned) >> groups
        # A teardown (with no setup) that fails the run: "Mark run as failed" skips every
        # other unfinished task, and with the gate skipped Airflow 3.3.2 would end the run
        # green. As a teardown it still runs, after every cell's teardown, settles the
        # results of cut-short cells and keeps the run red (see accelmatrix.cleanup.stopped).
        gate = gate_task(planned, str(path)).as_teardown(on_failure_fail_dagrun=True)
        gate << groups
        for group in shape.groups:
            dag.get_task(f"{group.machine}.teardown") >> gate
        if export_enabled():
            # After the gate decided, never inside it; a teardown, so it runs whatever the
            # verdict and its own outcome never changes it (accelmatrix.warehouse.task).
            gate >> export_task().as_teardown()
    return dag


def build_invalid_dag(path: Path, error: SuiteError) -> DAG:
    """Stand-in for a broken suite: visible in the UI with the error, never runs a cell.

    Raising would turn the whole DAG file into an import error and take every other suite
    down with it; this keeps the other suites working and the problem in plain sight.
    """
    dag_id = suite_id(path)
    problems = "\n".join(f"- {p}" for p in error.problems)
    with DAG(
        dag_id=dag_id if _valid_dag_id(dag_id) else INVALID_SUITE_DAG_ID,
        description=f"INVALID SUITE: {error.problems[0] if error.problems else ''}"[:200],
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        is_paused_upon_creation=True,
        tags=["accelmatrix", "invalid-suite"],
        doc_md=f"### Invalid suite `{path.name}`\n\n{problems}\n\n"
        "Fix the file; `python -m accelmatrix validate` shows the same errors.",
    ) as dag:
        invalid_task(str(error))
    return dag


def _valid_dag_id(dag_id: str) -> bool:
    import re

    return bool(re.match(r"^[A-Za-z0-9_.-]{1,250}$", dag_id))


def build_dags(suites_dir: Path | str | None = None) -> dict[str, DAG]:
    """Every suite under ``suites_dir`` as a DAG; a broken file never breaks the others.

    A task process parses the DAG file only to find its own DAG: Airflow says which one
    (``get_parsing_context``), and only that suite is loaded and built. Every task start
    of a matrix run pays this parse, so it must not grow with the number of suites.
    """
    root = Path(suites_dir) if suites_dir else settings.suites_dir()
    wanted = get_parsing_context().dag_id
    dags: dict[str, DAG] = {}
    files: dict[str, Path] = {}
    for path in suite_files(root):
        if wanted and wanted != INVALID_SUITE_DAG_ID and suite_id(path) != wanted:
            continue
        try:
            if (other := files.setdefault(suite_id(path), path)) != path:
                raise SuiteError(path, [f"DAG id {suite_id(path)!r} is also the suite {other}"])
            dag = build_dag(path)
        except SuiteError as e:
            log.error("%s", e)
            dag = build_invalid_dag(path, e)
        dags.setdefault(dag.dag_id, dag)
    return dags
