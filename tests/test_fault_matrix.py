"""Fault injection on every backend, on a real Airflow (scheduler, triggerer, dag-processor,
api-server; LocalExecutor), with a faults x backends outcome table.

One stack for each of the two parts (the per-cell run, then the cloud-API outage; the other
run-level faults), with the loopback sshd (the SSH host and "the TPU VM"), the Cloud TPU
emulator and the Kubernetes emulator wired in through the components' environment. One
suite whose axes are ``machine`` (local, ssh, tpu, k8s, jobset: a 2-pod k8s-jobset) x
``fault``; its setup and run commands are tests/fault_workload.py, which fails or stalls as
the cell's fault says.

* One DAG run covers the per-cell faults on all five backends: the workload fails, setup
  fails, provision fails half way (local/SSH/k8s: the cell's artifacts path is blocked by a
  file, so provisioning fails after it created the work dir; TPU: the emulator creates the
  node, then its create operation fails and the node is TERMINATED), the workload runs into
  the suite's timeout, the setup task's process is SIGKILLed mid-setup (its pid from the
  REST API; the run step cannot be SIGKILLed honestly: it defers, no task process runs
  while the workload does), and the TPU node is preempted while the workload runs (on the
  JobSet: its leader pod is disrupted like a node preemption, and the JobSet restarts).
  A sixth per-cell fault: the cell's artifacts dir is a 256 KiB tmpfs and the workload
  leaves a 1 MiB artifact (collect fails as infrastructure, naming the dir).
* Then one run per run-level fault, over one slow cell per backend: the scheduler stopped
  and started again while the workloads run; the DAG run marked failed through
  ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}`` while they run; the triggerer SIGKILLed
  with every run task deferred and started 10 s later; a second triggerer started beside
  the first, the first SIGKILLed while it holds every run task's trigger and left down (the
  second must adopt them all, as Airflow's triggerer HA promises); the api-server stopped while the
  cells' first tasks run and started 10 s later; the results store's PostgreSQL stopped for
  30 s from the first run task's success (the collects meet it); the TPU and Kubernetes
  APIs unreachable for 60 s mid-run (tpu-vm, k8s-job, k8s-jobset only).

The results store is a PostgreSQL of its own (as docker-compose deploys it); the Airflow
metadata DB is SQLite under LocalExecutor. Every entry also counts metric rows: the
workload's own count of the ``step N loss`` lines it printed against the rows the store
holds for the cell ("rows lost"). ACCELMATRIX_FAULT_PHASES=triggerer,cloud runs only
those phases (PHASES in accelmatrix_testkit/fault_matrix.py; set but empty: refused).

After each run, per cell: nothing left (every backend's ``list_managed()``, the emulators'
own state, work dirs, workload processes), exactly one results row whose state agrees with
Airflow's task states (never ``passed`` for a failed cell), and the task log of the failing
step says what happened. Set ACCELMATRIX_FAULT_TABLE=path to get the table in a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy as sa
import yaml
from needs import missing

from accelmatrix import settings
from accelmatrix.backends import tpu_names
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.contracts.run_records import CellRecord
from accelmatrix.lifecycle import EARLIER_FAILURES
from accelmatrix_testkit import AirflowStack
from accelmatrix_testkit.fault_matrix import (
    API_SERVER_RESTART,
    CLOUD_API_DOWN,
    FAULTS,
    MACHINES,
    NO_WORKLOAD,
    NOT_APPLICABLE,
    PHASES,
    RUN_MARKED_FAILED,
    STORE_DOWN,
    TRIGGERER_KILLED,
    TRIGGERER_TAKEOVER,
    Outcome,
    details,
    leftover_dirs,
    phases_from,
    processes_running,
    render_table,
    write_table,
)
from accelmatrix_testkit.k8s_emulator import Cluster
from accelmatrix_testkit.services import PostgresServer, ServiceUnavailable
from accelmatrix_testkit.small_disk import mount_tmpfs, unmount

pytest_plugins = ["tpu_env"]
# Not in `make test`: `make reliability` runs it, its two parts at once (see "the test").
pytestmark = [pytest.mark.integration, pytest.mark.reliability]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("fault_workload.py")
DAG_ID = "fault_matrix"
SSH_CONN, K8S_CONN = "accelmatrix_fault_ssh", "accelmatrix_fault_k8s"
PER_CELL = [f for f in FAULTS.values() if f]
# Above the start skew of the four slow cells on a loaded 2-core machine (k8s starts last):
# the first slow workload must still run when the last one starts. Idle time, not CPU.
WORKLOAD_TIMEOUT = 150
SCHEDULER_RESTART = "scheduler stopped + restarted mid-run"
DISK_FULL_SIZE = "256k"  # the diskfull cells' artifacts dirs (tmpfs); the artifact is 1 MiB
LOSS_RE = r"^step \d+ loss: ([0-9.]+)$"
# The backends behind a cloud API (the TPU and Kubernetes emulators).
CLOUD = ("tpu", "k8s", "jobset")
# Workload processes of one attempt of a cell's run (a JobSet cell runs one per pod).
PODS = {"jobset": 2}
# ACCELMATRIX_FAULT_PHASES=triggerer,cloud runs only those phases (the table then shows
# the others as "-"); all of them by default (`make reliability`); set but empty: refused
# (PHASES and phases_from: accelmatrix_testkit/fault_matrix.py).
SECOND_TRIGGERER = "triggerer-2"  # the HA row's second triggerer (its log: triggerer-2.log)
STORE_WAITED = "results store unreachable (retrying"  # core.py's warning while it waits


def cell_id(machine: str, fault: str) -> str:
    return f"machine={machine},fault={fault}"


# -- environment --------------------------------------------------------------------------
class Env:
    """Everything the module's runs share: paths, emulators, the stack."""

    def __init__(
        self, tmp: Path, server: Any, tpu: Any, cluster: Cluster, results_db: PostgresServer
    ):
        self.tmp, self.server, self.tpu, self.cluster = tmp, server, tpu, cluster
        self.results_db = results_db  # the results store's PostgreSQL, as deployed
        self.signals = tmp / "signals"
        self.ssh_root = tmp / "ssh-work"
        self.vm_root = tmp / "vm"
        self.volume = tmp / "volume"
        for d in (self.signals, self.ssh_root, self.vm_root, self.volume):
            d.mkdir(parents=True, exist_ok=True)
        self.stack: AirflowStack | None = None

    @functools.cached_property
    def metadata(self) -> sa.Engine:
        """Airflow's metadata DB, read only (which triggerer holds which trigger)."""
        assert self.stack is not None
        return sa.create_engine(self.stack.database_url)

    def machines(self) -> dict[str, dict[str, Any]]:
        py = sys.executable
        return {
            "local": {"backend": "local", "hourly_cost": 0.1},
            "ssh": {
                "backend": "ssh",
                "ssh_conn_id": SSH_CONN,
                "python": py,
                "work_root": str(self.ssh_root),
                "hourly_cost": 0.2,
            },
            "tpu": {
                "backend": "tpu-vm",
                "zone": "us-central2-b",
                "accelerator_type": "v4-8",
                "runtime_version": "tpu-ubuntu2204-base",
                "capacity": "spot",
                "ssh_user": self.server.user,
                "ssh_port": self.server.port,
                "python": py,
                "work_root": str(self.vm_root),
                "provision_poll_seconds": 0.5,
                "node_check_seconds": 1,
                "hourly_cost": 12.0,
            },
            "k8s": {
                "backend": "k8s-job",
                "kubernetes_conn_id": K8S_CONN,
                "image": "us-docker.pkg.dev/acme/trainer:1",
                "python": py,
                "artifacts_volume": {"claim_name": "accel-work", "local_path": str(self.volume)},
                "hourly_cost": 1.0,
            },
            # Two pods of one JobSet (the emulator's controller: child Job, pods, headless
            # Service): every pod runs the workload; the first that fails names the failure.
            "jobset": {
                "backend": "k8s-jobset",
                "kubernetes_conn_id": K8S_CONN,
                "image": "us-docker.pkg.dev/acme/trainer:1",
                "python": py,
                "num_nodes": 2,
                "max_restarts": 1,
                "artifacts_volume": {"claim_name": "accel-work", "local_path": str(self.volume)},
                "hourly_cost": 2.0,
            },
        }

    def suite(self) -> dict[str, Any]:
        cmd = ["${python}", str(SCRIPT)]
        return {
            "description": "fault injection: every fault on every backend (tests only)",
            "owners": ["ml-infra"],
            "schedule": None,
            "retries": 1,
            "retry_delay_seconds": 1,
            "axes": {"machine": list(MACHINES), "fault": [*PER_CELL, "slow"]},
            "exclude": [
                {
                    "match": {"machine": ["local", "ssh", "k8s"], "fault": "preempt"},
                    "reason": "preemption: a TPU node, a JobSet pod's node",
                }
            ],
            "machines": self.machines(),
            "workload": {
                "setup": [[*cmd, "setup", "${axis.fault}", str(self.signals)]],
                "run": [*cmd, "run", "${axis.fault}", str(self.signals)],
                "timeout": WORKLOAD_TIMEOUT,
                "setup_timeout": 90,
                "artifacts": ["out/**"],
                # Every "step N loss: X" line is a metric row: the table's "rows lost" is
                # the workload's count of them against the rows the store holds.
                "metrics": [
                    {"type": "log_regex", "name": "loss", "pattern": LOSS_RE, "series": True}
                ],
            },
            "checks": [{"type": "log_contains", "pattern": "Finished training run"}],
        }

    def component_env(self, gcloud_env: dict[str, str]) -> dict[str, str]:
        env = {
            "ACCELMATRIX_RESULTS_URL": self.results_db.url("accelmatrix"),
            f"AIRFLOW_CONN_{SSH_CONN.upper()}": json.dumps(self.server.connection()),
            "ACCELMATRIX_GCLOUD_AUTH": "env",
            # A task whose process died without a word is failed after this long without a
            # heartbeat (default 300 s): the SIGKILL row waits for it.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            **gcloud_env,
            **self.cluster.emulator.airflow_conn_env(K8S_CONN),
        }
        return env


@pytest.fixture(scope="module")
def env(server, emulator, gcloud_env, tmp_path_factory):
    from accelmatrix.hooks import k8s as k8s_hook

    tmp = tmp_path_factory.mktemp("faults")
    volume = tmp / "volume"
    volume.mkdir()
    try:
        results_db = PostgresServer(databases=("accelmatrix",))
    except ServiceUnavailable as e:
        missing("celery", f"the results store's PostgreSQL: {e}")
    with (
        results_db,
        Cluster(tmp / "cluster", ("default",), volumes={"accel-work": volume}) as cluster,
    ):
        e = Env(tmp, server, emulator, cluster, results_db)
        suites = tmp / "suites"
        suites.mkdir()
        (suites / f"{DAG_ID}.yaml").write_text(yaml.safe_dump(e.suite(), sort_keys=False))
        extra = e.component_env(gcloud_env)
        stack = AirflowStack(
            home=tmp / "airflow",
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            env_extra=extra,
            parallelism=12,
        )
        # The test process inspects the same homes and clouds the components use.
        with pytest.MonkeyPatch.context() as mp:
            for k, v in extra.items():
                mp.setenv(k, v)
            mp.setenv("ACCELMATRIX_HOME", str(stack.accel_home))
            k8s_hook.forget()
            emulator.reset()
            with stack:
                e.stack = stack
                for m in MACHINES:
                    stack.create_pool(f"accelmatrix_{m}", 16, include_deferred=True)
                stack.wait_for_dag(DAG_ID)
                yield e
                e.stack = None
            k8s_hook.forget()
        _kill_fault_processes(e.signals)
        for line in Path("/proc/mounts").read_text().splitlines():  # a diskfull tmpfs left
            target = line.split()[1]
            if target.startswith(str(tmp)):
                unmount(Path(target))


def _kill_fault_processes(signals: Path) -> list[str]:
    """Kill leftovers of the suite's commands (by pid: they run our script with this
    module's signals dir)."""
    killed = []
    for p in processes_running(SCRIPT, signals):
        with contextlib.suppress(psutil.Error):
            killed.append(" ".join(p.cmdline()[-3:]))
            p.kill()
    return killed


# -- running and observing ----------------------------------------------------------------
def trigger(env: Env, run_id: str, cells: list[str]) -> str:
    env.stack.api(
        "POST",
        f"dags/{DAG_ID}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": None, "conf": {"cells": cells}},
    )
    return run_id


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what} not seen within {timeout} s")


def mapped_cells(env: Env, run_id: str) -> dict[tuple[str, int], str]:
    """(machine group, map index) -> cell id, from what each group was mapped over (the
    ``cells_<machine>`` XCom): a task instance that never ran (or failed) has no rendered
    name, so names alone would lose exactly the steps a fault is about."""
    out: dict[tuple[str, int], str] = {}
    for m in MACHINES:
        try:
            entry = env.stack.api(
                "GET",
                f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/cells_{m}/xcomEntries/return_value",
            )
        except Exception:  # noqa: BLE001 - not pushed yet
            continue
        value = entry.get("value")
        if isinstance(value, str):
            value = json.loads(value)
        for i, cell in enumerate(value or []):
            out[(m, i)] = cell["id"]
    return out


def tis_by_cell(env: Env, run_id: str) -> dict[str, dict[str, dict[str, Any]]]:
    """cell id -> step -> task instance (map indexes named by ``mapped_cells``)."""
    tis = [t for t in env.stack.task_instances(DAG_ID, run_id) if t["map_index"] >= 0]
    names = mapped_cells(env, run_id)
    for t in tis:  # a rendered name must agree with the mapping
        key = (t["task_id"].rsplit(".", 1)[0], t["map_index"])
        rendered = t.get("rendered_map_index")
        if rendered == str(t["map_index"]):  # Airflow's fallback when rendering failed
            rendered = None
        if rendered and names.get(key, rendered) != rendered:
            raise AssertionError(f"{t['task_id']}[{key[1]}] is {rendered}, mapped {names[key]}")
        if rendered:
            names.setdefault(key, rendered)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for t in tis:
        group, step = t["task_id"].rsplit(".", 1)
        name = names.get((group, t["map_index"]))
        if name:
            out.setdefault(name, {})[step] = t
    return out


def census(env: Env, run_id: str) -> dict[str, list[str]]:
    """cell id -> what it left behind (resources, dirs, processes) in ``run_id``."""
    leaks: dict[str, list[str]] = {}

    def add(cell: str, what: str) -> None:
        leaks.setdefault(cell, []).append(what)

    specs = env.machines()
    for m, spec in specs.items():
        try:
            managed = get_backend(spec).list_managed()
        except Exception as e:  # noqa: BLE001 - a broken lister must show, not hide leaks
            add(f"machine={m},*", f"list_managed failed: {e}")
            continue
        for r in managed:
            ident = r.detail.identity.model_dump() if r.detail.identity else {}
            if ident.get("run_id") == run_id:
                add(ident["cell_id"], f"1 {r.backend} resource ({r.name})")
    cells_by_safe = {
        settings.safe_name(cell_id(m, f)): cell_id(m, f)
        for m in MACHINES
        for f in [*PER_CELL, "slow"]
    }
    safe_dag, safe_run = settings.safe_name(DAG_ID), settings.safe_name(run_id)
    for root, what in (
        (settings.work_root(), "local work dir"),
        (env.ssh_root, "ssh work dir"),
        (env.vm_root, "TPU VM work dir"),
        (env.volume, "k8s volume dir"),
    ):
        for d in leftover_dirs(root, safe_dag, safe_run):
            add(cells_by_safe.get(d.name, d.name), f"1 {what}")
    nodes = {tpu_names.node_name(DAG_ID, run_id, c): c for c in cells_by_safe.values()}
    for full in env.tpu.state["nodes"]:
        short = full.rsplit("/", 1)[-1]
        if short in nodes:
            add(nodes[short], f"1 TPU node ({env.tpu.state['nodes'][full]['state']})")
    k8s = env.cluster.emulator.state()
    with env.cluster.emulator.lock:
        k8s["jobsets"] = {f"{ns}/{n}": js for (ns, n), js in env.cluster.jobsets.jobsets.items()}
    # A JobSet's Service carries no accelmatrix annotations: it belongs to its JobSet's cell.
    jobset_cells: dict[str, tuple[str, str]] = {}
    for name, obj in k8s["jobsets"].items():
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        jobset_cells[name.split("/", 1)[1]] = (
            ann.get("accelmatrix.io/cell-id") or name,
            ann.get("accelmatrix.io/run-id", run_id),
        )
    for kind in ("jobsets", "jobs", "pods", "services"):
        for name, obj in (k8s.get(kind) or {}).items():
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            labels = (obj.get("metadata") or {}).get("labels") or {}
            owner = jobset_cells.get(labels.get("jobset.sigs.k8s.io/jobset-name", ""))
            cell = ann.get("accelmatrix.io/cell-id") or labels.get("cell") or str(name)
            run = ann.get("accelmatrix.io/run-id", run_id)
            if owner and "accelmatrix.io/cell-id" not in ann:
                cell, run = owner
            if run == run_id:  # unattributable objects count against every run
                add(cell, f"1 k8s {kind[:-1]}")
    for p in processes_running(SCRIPT, env.signals):
        try:
            e = p.environ()
        except psutil.Error:
            e = {}
        m, f = e.get("ACCELMATRIX_AXIS_MACHINE"), e.get("ACCELMATRIX_AXIS_FAULT")
        add(cell_id(m, f) if m and f else f"pid {p.pid}", "1 process")
    return leaks


def settled_census(env: Env, run_id: str, grace: float = 20) -> dict[str, list[str]]:
    """The census once nothing changes any more (a teardown may still be finishing)."""
    deadline = time.monotonic() + grace
    leaks = census(env, run_id)
    while leaks and time.monotonic() < deadline:
        time.sleep(2)
        leaks = census(env, run_id)
    return leaks


def count_rows(env: Env, run_id: str, o: Outcome, machine: str, fault: str) -> None:
    """The metric rows the workload printed (its own count, by its last attempt) against the
    ones the results store holds for the cell; a row lost or stored twice is a problem of
    the cell. Where the fault comes before the workload (NO_WORKLOAD) there is nothing to
    count: "rows n/a", and any stored row, or a workload that ran, is a problem."""
    from accelmatrix.results.store import ResultsStore

    counted = env.signals / f"{machine}-{fault}.steps"
    store = ResultsStore(settings.results_url())
    try:
        rows = store.get_metrics(DAG_ID, run_id, cell_id(machine, fault))
    finally:
        store.close()
    o.stored_rows = len([r for r in rows if r.name == "loss"])
    if fault in NO_WORKLOAD:
        o.workload_ran = False
        if counted.exists():
            o.problems.append(f"the workload ran, though the {fault} fault comes before it")
    else:
        o.expected_rows = int(counted.read_text().split()[0]) if counted.exists() else 0
    o.problems.extend(o.row_problems())


def store_cells(env: Env, run_id: str) -> list[CellRecord]:
    from accelmatrix.results.store import ResultsStore

    store = ResultsStore(settings.results_url())
    try:
        return store.get_cells(DAG_ID, run_id)
    finally:
        store.close()


def log_of(env: Env, run_id: str, ti: dict[str, Any], try_number: int | None = None) -> str:
    """The task's log of one try: through REST, else from the shared log folder (3.3.2's
    REST has no record of a try that a deferral resume superseded without a history row)."""
    number = try_number or ti["try_number"]
    try:
        return env.stack.task_log(
            DAG_ID, run_id, ti["task_id"], map_index=ti["map_index"], try_number=number
        )
    except Exception as e:  # noqa: BLE001 - fall back to the files
        folder = (
            env.stack.logs_dir
            / f"dag_id={DAG_ID}"
            / f"run_id={run_id}"
            / f"task_id={ti['task_id']}"
            / f"map_index={ti['map_index']}"
        )
        files = sorted(folder.glob(f"attempt={number}.log*"))
        if not files:
            return f"(no log: {e!r:.200})"
        return "\n".join(f.read_text(errors="replace") for f in files)


def retried_steps(env: Env, run_id: str, tis: dict[str, dict[str, Any]]) -> list[str]:
    """Steps with an earlier try that failed (Airflow's tries, not ``try_number``: 3.3.2
    bumps it when a deferred task resumes)."""
    out = []
    for step, ti in sorted(tis.items()):
        if int(ti.get("try_number") or 0) < 2:
            continue
        try:
            tries = env.stack.api(
                "GET",
                f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/"
                f"{ti['map_index']}/tries",
            )["task_instances"]
        except Exception:  # noqa: BLE001
            continue
        last = max(int(t["try_number"]) for t in tries)
        if any(
            t["state"] in ("failed", "up_for_retry") and int(t["try_number"]) < last for t in tries
        ):
            out.append(step)
    return out


# A cell's state once its run is over (the others are steps on the way).
FINAL_STATES = {"passed", "failed", *EARLIER_FAILURES, "excluded"}


# -- expectations per fault ---------------------------------------------------------------
# fault -> (allowed final cell states, the step that fails or is retried, a line its log
# must contain (on-call's view), which try of that step holds it: "last" or "first").
EXPECT: dict[str, tuple[set[str], str, str, str]] = {
    "workload": ({"run_failed"}, "run", "workload exited with 3", "last"),
    "setup": ({"setup_failed"}, "setup", "injected failure: dependency", "last"),
    "provision": ({"infra_failed"}, "provision", "provision failed", "last"),
    "timeout": ({"timed_out"}, "run", f"timed out after {WORKLOAD_TIMEOUT} s", "last"),
    "kill": ({"passed"}, "setup", "setup ok (a retry)", "last"),
    # Retried on a replacement node (retries: 1): the retry passes.
    "preempt": ({"passed"}, "run", "PREEMPTED", "first"),
    # Infrastructure (this host's disk), retried by Airflow, failing again.
    "diskfull": ({"infra_failed"}, "collect", "artifacts disk full: no space left in", "last"),
    "slow": ({"passed"}, "run", "Finished training run", "last"),
}
# (machine, fault) -> the same, where a backend answers a fault in its own way.
EXPECT_ON: dict[tuple[str, str], tuple[set[str], str, str, str]] = {
    # The JobSet restarts its own group after a disruption (max_restarts), no Airflow retry:
    # the run task's live log follows the new leader.
    ("jobset", "preempt"): ({"passed"}, "run", "(restart 1) ---", "last"),
}
# Faults a (machine, fault) pair answers without an Airflow retry of the failing step.
NOT_RETRIED = {("jobset", "preempt")}
FAILED_STEP_STATE = {
    "diskfull": "failed",
    "workload": "failed",
    "setup": "failed",
    "provision": "failed",
    "timeout": "failed",
}


def judge_cell(
    env: Env,
    run_id: str,
    row_label: str,
    machine: str,
    fault: str,
    rows: list[CellRecord],
    tis: dict[str, dict[str, Any]],
    leaks: list[str],
    raced: set[str],
) -> Outcome:
    cid = cell_id(machine, fault)
    o = Outcome(row_label, MACHINES[machine], leaks=list(leaks))
    count_rows(env, run_id, o, machine, fault)
    mine = [r for r in rows if r.cell_id == cid]
    if len(mine) != 1:
        o.problems.append(f"{len(mine)} results rows for {cid} (expected exactly 1)")
        return o
    row = mine[0]
    o.state = row.state
    o.retried = retried_steps(env, run_id, tis)
    if fault == "preempt" and machine == "tpu" and "run" not in o.retried:
        # The run try that was preempted left no history row (see log_of): its successor's
        # log says whether the node was replaced.
        run = tis.get("run")
        if run and "replacing the machine before this retry" in log_of(env, run_id, run):
            o.retried.append("run")
    states, step, line, which = EXPECT_ON.get((machine, fault), EXPECT[fault])
    if row.state not in states:
        o.problems.append(f"cell state {row.state!r} (expected {sorted(states)}): {row.message}")
    ti = tis.get(step)
    if ti is None:
        o.problems.append(f"no {step} task instance")
        return o
    # Airflow agrees with the results store.
    if fault in FAILED_STEP_STATE and ti["state"] != "failed":
        o.problems.append(f"{step} task is {ti['state']}, the cell {row.state}")
    if row.state == "passed":
        for s, t in tis.items():
            if t["state"] != "success":  # the defer/resume race is named, never tolerated
                race = " (the scheduler logged its defer/resume race)" if t["id"] in raced else ""
                o.problems.append(f"cell passed but its {s} task is {t['state']}{race}")
    elif "evaluate" in tis and tis["evaluate"]["state"] == "success":
        o.problems.append("cell did not pass but its evaluate task succeeded")
    if fault == "diskfull":
        art = settings.cell_artifacts_dir(DAG_ID, run_id, cid)
        if str(art) not in (row.message or ""):
            o.problems.append(f"the cell's message does not name {art}: {row.message}")
        if "collect" not in o.retried:
            o.problems.append("collect (an infrastructure failure) was not retried")
    if fault == "workload" and row.exit_code != 3:
        o.problems.append(f"exit code {row.exit_code} recorded (the workload exited 3)")
    if (
        fault in ("kill", "preempt")
        and (machine, fault) not in NOT_RETRIED
        and step not in o.retried
    ):
        o.problems.append(f"{step} was not retried after the fault")
    teardown = (tis.get("teardown") or {}).get("state")
    provision = (tis.get("provision") or {}).get("state")
    # A teardown's setup is provision: after a failed provision Airflow marks the teardown
    # upstream_failed (the provision cleaned up after itself; the census checks that).
    ok_teardown = {"success"} | ({"upstream_failed"} if provision == "failed" else set())
    if teardown not in ok_teardown:
        o.problems.append(f"teardown task is {teardown} (provision {provision})")
    text = log_of(env, run_id, ti, try_number=1 if which == "first" else None)
    if line not in text:
        o.problems.append(
            f"the {step} log (try {1 if which == 'first' else ti['try_number']}) lacks {line!r}"
        )
    return o


# -- fault injectors (threads watching the signals dir) -----------------------------------
def kill_setup_tasks(env: Env, run_id: str, done: list[str], stop: threading.Event) -> None:
    """SIGKILL the task process of each backend's `kill` cell while its setup command runs.

    The pid is the one Airflow records for the running task instance (REST ``pid``: the
    task runner's child that executes the operator); it is checked to be alive and a
    descendant of this stack's components before it is signalled.
    """
    pending = set(MACHINES)
    seen: dict[str, str] = {}  # what REST last showed, per machine (reported if never killed)
    while pending and not stop.is_set():
        time.sleep(0.3)
        ready = [m for m in sorted(pending) if (env.signals / f"{m}-kill.setup").exists()]
        if not ready:
            continue
        try:
            tis = tis_by_cell(env, run_id)
        except Exception as e:  # noqa: BLE001 - a busy api-server: look again
            seen["*"] = f"REST: {e!r:.100}"
            continue
        for m in ready:
            ti = tis.get(cell_id(m, "kill"), {}).get("setup")
            seen[m] = (
                "no setup TI"
                if not ti
                else f"state={ti['state']} pid={ti.get('pid')} host={ti.get('hostname')}"
            )
            if not ti or ti["state"] != "running" or not ti.get("pid"):
                continue
            try:
                proc = psutil.Process(int(ti["pid"]))
                # Not its environment: the task process's setproctitle overwrites
                # /proc/<pid>/environ. Its ancestry: a descendant of this stack's components.
                components = {c.pid for c in env.stack.procs.values()}
                if not any(a.pid in components for a in proc.parents()):
                    done.append(f"{m}: pid {proc.pid} is not this stack's: not killed")
                    pending.discard(m)
                    continue
                cmd = " ".join(proc.cmdline())[:60]
                os.kill(proc.pid, signal.SIGKILL)
            except (psutil.Error, ProcessLookupError) as e:
                seen[m] += f" ({e!r:.80})"
                continue
            done.append(f"{m}: SIGKILL setup task pid {proc.pid} ({cmd})")
            pending.discard(m)
    for m in sorted(pending):
        done.append(f"{m}: the kill cell's setup task was never killed (last seen: {seen.get(m)})")


def preempt_tpu(env: Env, run_id: str, done: list[str], stop: threading.Event) -> None:
    name = tpu_names.node_name(DAG_ID, run_id, cell_id("tpu", "preempt"))
    while not stop.is_set():
        marker = env.signals / "tpu-preempt.run"
        if marker.exists() and marker.read_text().strip():
            env.tpu.preempt(name)
            # The VM goes with its node: its processes die (the emulated VM is this host,
            # so the workload's process group is killed here).
            pid = int(marker.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                pgid = os.getpgid(pid)
                if pgid != os.getpgid(0):
                    os.killpg(pgid, signal.SIGKILL)
            done.append(f"preempted {name}, killed the workload's group")
            return
        time.sleep(0.3)


def preempt_jobset_pod(env: Env, run_id: str, done: list[str], stop: threading.Event) -> None:
    """The node under the JobSet cell's leader pod is preempted while the workload runs:
    the kubelet marks the pod DisruptionTarget, SIGTERMs it (SIGKILL after the grace
    period), and the pod stays listed Failed (exit 143/137), as on a real cluster. The
    JobSet (max_restarts 1) restarts the group; the cell passes on the restarted pods."""
    cid = cell_id("jobset", "preempt")
    marker = env.signals / "jobset-preempt.run"
    while not stop.is_set():
        time.sleep(0.3)
        if not (marker.exists() and marker.read_text().strip()):
            continue
        with env.cluster.emulator.lock:  # the cell's JobSet: its annotations name the cell
            names = [
                n
                for (_, n), js in env.cluster.jobsets.jobsets.items()
                if (js["metadata"].get("annotations") or {}).get("accelmatrix.io/cell-id") == cid
                and js["metadata"]["annotations"].get("accelmatrix.io/run-id") == run_id
            ]
            want = {
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": "0",
            }
            leaders = [
                (ns, n)
                for (ns, n), p in env.cluster.emulator.pods.items()
                if p["status"].get("phase") == "Running"
                and (p["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name")
                in names
                and all(p["metadata"]["labels"].get(k) == v for k, v in want.items())
            ]
        if not leaders:
            continue
        ns, name = leaders[0]
        env.cluster.kubelet.disrupt(ns, name)
        done.append(f"disrupted JobSet leader pod {ns}/{name} (DisruptionTarget, SIGTERM)")
        return


def block_artifacts(run_id: str, machine: str) -> Path:
    """An environmental fault: the cell's artifacts path is taken by a file."""
    path = settings.cell_artifacts_dir(DAG_ID, run_id, cell_id(machine, "provision"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory: the fault-injection test put this file here\n")
    return path


# -- the test -----------------------------------------------------------------------------
# `make reliability` runs the matrix in two parts at once, each on a stack of its own
# (pytest-xdist, `--dist loadgroup`): the per-cell run and then the cloud-API outage; the
# other run-level faults one after another. Each restarts or takes down a part every cell of
# its run shares, so a stack runs one phase at a time, in PHASES order. The metadata-DB
# restart (test_metadata_db_restart.py, a Celery stack of its own) runs after the first part,
# on its worker: the parts measured 646 s (+ ~120 s) and 1,094 s when split as per-cell vs
# all run-level faults on loaded cores, the cloud phase ~124 s of the latter. Each part
# stores its outcomes for the run; the part that ends last writes the whole table
# (ACCELMATRIX_FAULT_TABLE).
PER_CELL_PART = ("per_cell", "cloud")
RUN_LEVEL_PART = tuple(p for p in PHASES if p not in PER_CELL_PART)


@pytest.mark.xdist_group("fault_matrix_per_cell")
@pytest.mark.slow(750)
def test_fault_matrix_per_cell_and_cloud(request, tmp_path, testrun_uid):
    run_part(request, tmp_path, testrun_uid, "per_cell_and_cloud", PER_CELL_PART)


@pytest.mark.xdist_group("fault_matrix_run_level")
@pytest.mark.slow(900)
def test_fault_matrix_run_level(request, tmp_path, testrun_uid):
    run_part(request, tmp_path, testrun_uid, "run_level", RUN_LEVEL_PART)


def run_part(request, tmp_path: Path, uid: str, name: str, part: tuple[str, ...]) -> None:
    phases = [p for p in phases_from(os.environ.get("ACCELMATRIX_FAULT_PHASES")) if p in part]
    if not phases:  # the other part has them (ACCELMATRIX_FAULT_PHASES named only those)
        pytest.skip(f"ACCELMATRIX_FAULT_PHASES names none of the {name} phases {part}")
    env: Env = request.getfixturevalue("env")  # only now: a stack starts for a real part
    outcomes, notes, seconds = fault_matrix(env, phases)
    with parts_of_this_run(uid) as folder:  # locked: the other part may end at once
        (folder / f"{name}.json").write_text(
            json.dumps(
                {
                    "outcomes": [dataclasses.asdict(o) for o in outcomes],
                    "notes": notes,
                    "seconds": seconds,
                }
            )
        )
        parts = {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))}
        every = [Outcome(**o) for p in parts.values() for o in p["outcomes"]]
        table = render_table(every)
        text = (
            f"{table}\n\n{details(every)}\n\n"
            + "\n".join(n for p in parts.values() for n in p["notes"])
            + "\n\n"
            + "; ".join(f"{k} part: {p['seconds']:.0f} s" for k, p in parts.items())
        )
        written = write_table(text, tmp_path / "fault_table.md")
    print(f"\n{text}\n(written to {', '.join(map(str, written))})")
    # This part's cases only: the other part asserts its own.
    failing = [o for o in outcomes if o.failing]
    problems = [n for n in notes if n.startswith("PROBLEM")]
    assert not failing and not problems, (
        f"\n{render_table(outcomes)}\n{details(failing)}\n" + "\n".join(problems)
    )


@contextlib.contextmanager
def parts_of_this_run(uid: str) -> Iterator[Path]:
    """The folder where the parts of this test run (``testrun_uid``: the same on every xdist
    worker) keep their outcomes, held under an exclusive lock."""
    folder = Path(tempfile.gettempdir()) / f"accelmatrix-fault-table-{uid}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fault_matrix(env: Env, phases: list[str]) -> tuple[list[Outcome], list[str], float]:
    """Run ``phases`` on ``env``'s stack: their outcomes, notes and seconds."""
    stack = env.stack
    outcomes: list[Outcome] = []
    notes: list[str] = []
    t0 = time.monotonic()

    if "per_cell" in phases:
        # 1. Every per-cell fault on every backend, in one DAG run.
        run_id = "faults_per_cell"
        for m in ("local", "ssh", "k8s", "jobset"):
            block_artifacts(run_id, m)
        small = [
            settings.cell_artifacts_dir(DAG_ID, run_id, cell_id(m, "diskfull")) for m in MACHINES
        ]
        for d in small:
            why = mount_tmpfs(d, DISK_FULL_SIZE)
            if why is not None:
                notes.append(f"PROBLEM: cannot mount a {DISK_FULL_SIZE} tmpfs on {d}: {why}")
        node = tpu_names.node_name(DAG_ID, run_id, cell_id("tpu", "provision"))
        env.tpu.set_faults(fail_create_nodes=[node])
        stop = threading.Event()
        injected: list[str] = []
        threads = [
            threading.Thread(
                target=kill_setup_tasks, args=(env, run_id, injected, stop), daemon=True
            ),
            threading.Thread(target=preempt_tpu, args=(env, run_id, injected, stop), daemon=True),
            threading.Thread(
                target=preempt_jobset_pod, args=(env, run_id, injected, stop), daemon=True
            ),
        ]
        trigger(env, run_id, [f"*,fault={f}" for f in PER_CELL])
        for t in threads:
            t.start()
        try:
            state = stack.wait_for_run(DAG_ID, run_id, timeout=900)
        except TimeoutError as e:  # judge what there is; name what never finished
            state = "unfinished"
            notes.append(f"PROBLEM: {e}")
            notes += unfinished(env, run_id)
        finally:
            stop.set()
        notes.append(
            f"per-cell run: {state} in {time.monotonic() - t0:.0f} s; injected: "
            + "; ".join(injected)
        )
        leaks = settled_census(env, run_id)
        rows, tis, raced = (
            store_cells(env, run_id),
            tis_by_cell(env, run_id),
            stack.stale_success_failures(),
        )
        for label, fault in FAULTS.items():
            if fault is None:
                continue
            for m, backend in MACHINES.items():
                if fault == "preempt" and m not in ("tpu", "jobset"):
                    outcomes.append(Outcome(label, backend, applicable=False))
                    continue
                cid = cell_id(m, fault)
                outcomes.append(
                    judge_cell(
                        env,
                        run_id,
                        label,
                        m,
                        fault,
                        rows,
                        tis.get(cid, {}),
                        leaks.pop(cid, []),
                        raced,
                    )
                )
        if state != "failed":
            notes.append(f"PROBLEM: the per-cell run ended {state}; failed cells must fail it")
        for m in MACHINES:  # a fault that was never injected proves nothing
            if not any(i.startswith(f"{m}: SIGKILL") for i in injected):
                notes.append(f"PROBLEM: the {m} kill cell's setup task was never SIGKILLed")
        if not any(i.startswith("preempted") for i in injected):
            notes.append("PROBLEM: the TPU node was never preempted")
        if not any(i.startswith("disrupted JobSet") for i in injected):
            notes.append("PROBLEM: the JobSet leader pod was never disrupted")
        for cid, what in leaks.items():
            notes.append(f"PROBLEM: leak not attributed to a judged cell: {cid}: {what}")
        env.tpu.set_faults(fail_create_nodes=[])
        for d in small:
            unmount(d)

        for f in env.signals.iterdir():
            f.unlink()

    if "marked_failed" in phases:
        # 2. One slow cell per backend; the DAG run marked failed through the REST API while
        #    their workloads run.
        t1 = time.monotonic()
        failed_run = trigger(env, "faults_run_marked_failed", ["*,fault=slow"])
        all_slow_running(env)
        stack.api("PATCH", f"dags/{DAG_ID}/dagRuns/{failed_run}", json={"state": "failed"})
        # Not released: the workloads would run on for 40 s unless stopped. The gate (a
        # teardown) settles the cut-short cells after every cell's teardown.
        gate = wait_for(
            lambda: next(
                (
                    t
                    for t in stack.task_instances(DAG_ID, failed_run)
                    if t["task_id"] == "gate" and t["state"] in ("success", "failed")
                ),
                None,
            ),
            90,
            "the gate of the run marked failed",
            poll=1,
        )
        leaks = settled_census(env, failed_run, grace=10)
        rows, tis = store_cells(env, failed_run), tis_by_cell(env, failed_run)
        # The scheduler settles the run's state in its loop after the gate (a teardown with
        # on_failure_fail_dagrun) ended: wait for that, do not read it the same second.
        try:
            run_state = stack.wait_for_run(DAG_ID, failed_run, timeout=60)
        except TimeoutError:
            run_state = stack.get_run(DAG_ID, failed_run)["state"]
        notes.append(
            f"run marked failed: {run_state}, gate {gate['state']}, checked "
            f"{time.monotonic() - t1:.0f} s after its trigger"
        )
        if run_state != "failed":
            notes.append(f"PROBLEM: the run marked failed ended {run_state}")
        for m, backend in MACHINES.items():
            cid = cell_id(m, "slow")
            o = Outcome(RUN_MARKED_FAILED, backend, leaks=leaks.pop(cid, []))
            mine = [r for r in rows if r.cell_id == cid]
            o.state = mine[0].state if len(mine) == 1 else f"{len(mine)} rows"
            o.retried = retried_steps(env, failed_run, tis.get(cid, {}))
            if len(mine) != 1:
                o.problems.append(f"{len(mine)} results rows")
            elif o.state != "cancelled":
                o.problems.append(f"cell {o.state!r} in the results store (expected cancelled)")
            steps = {s: t["state"] for s, t in sorted(tis.get(cid, {}).items())}
            notes.append(f"  {backend}: task states {steps}")
            outcomes.append(o)
        cleaned = cleanup(env, failed_run)
        if cleaned:
            notes.append("cleaned up after the run marked failed: " + "; ".join(cleaned))
        for f in env.signals.iterdir():
            f.unlink()

    if "scheduler" in phases:
        # 3. The scheduler stopped and started again while one slow cell per backend runs.
        t2 = time.monotonic()
        run_id = trigger(env, "faults_scheduler_restart", ["*,fault=slow"])
        all_slow_running(env)
        code = stack.stop_component("scheduler")
        time.sleep(5)
        stack.start_component("scheduler")
        (env.signals / "release").touch()
        state = stack.wait_for_run(DAG_ID, run_id, timeout=240)
        notes.append(
            f"scheduler-restart run: {state} in {time.monotonic() - t2:.0f} s (scheduler exited "
            f"{code} on SIGTERM, down 5 s)"
        )
        leaks = settled_census(env, run_id)
        rows, tis, raced = (
            store_cells(env, run_id),
            tis_by_cell(env, run_id),
            stack.stale_success_failures(),
        )
        for m in MACHINES:
            cid = cell_id(m, "slow")
            outcomes.append(
                judge_cell(
                    env,
                    run_id,
                    SCHEDULER_RESTART,
                    m,
                    "slow",
                    rows,
                    tis.get(cid, {}),
                    leaks.pop(cid, []),
                    raced,
                )
            )

    if "triggerer" in phases:
        outcomes += slow_phase(
            env, "faults_triggerer_killed", TRIGGERER_KILLED, kill_triggerer, notes
        )
    if "triggerer_ha" in phases:
        try:
            outcomes += slow_phase(
                env, "faults_triggerer_takeover", TRIGGERER_TAKEOVER, triggerer_takeover, notes
            )
        finally:
            one_triggerer_again(env)
    if "api_server" in phases:
        outcomes += slow_phase(
            env, "faults_api_server_restart", API_SERVER_RESTART, restart_api_server, notes
        )
    if "store" in phases:
        store = slow_phase(env, "faults_store_down", STORE_DOWN, store_down, notes)
        outcomes += store
        if not any("collect" in o.retried for o in store):
            notes.append(f"PROBLEM: {STORE_DOWN}: no collect met the outage")
    if "cloud" in phases:
        cloud = slow_phase(env, "faults_cloud_api_down", CLOUD_API_DOWN, cloud_api_down, notes)
        outcomes += cloud
        if not any("API polls" in o.retried for o in cloud):
            notes.append(f"PROBLEM: {CLOUD_API_DOWN}: no poll met the outage")

    return outcomes, notes, time.monotonic() - t0


def unfinished(env: Env, run_id: str) -> list[str]:
    """One line per task instance of the run that has not ended, with its log's last lines."""
    out = []
    for t in env.stack.task_instances(DAG_ID, run_id):
        if t["state"] in ("success", "failed", "upstream_failed", "skipped", "removed"):
            continue
        tail = log_of(env, run_id, t)[-1200:] if t["state"] else "(never started)"
        out.append(
            f"  unfinished: {t['task_id']}[{t.get('rendered_map_index') or t['map_index']}] "
            f"{t['state']}: ...{tail}"
        )
    return out


def all_slow_running(env: Env, machines: tuple[str, ...] = tuple(MACHINES)) -> None:
    wait_for(
        lambda: all((env.signals / f"{m}-slow.run").exists() for m in machines),
        300,
        "every slow workload running",
    )


# -- run-level faults over one slow cell per backend -------------------------------------
def slow_phase(env: Env, run_id: str, label: str, inject, notes: list[str]) -> list[Outcome]:
    """One run of the slow cell of every backend ``label`` applies to; ``inject(env, run_id,
    machines)`` injects the fault while it runs, releases the workloads and says what it
    did. Each cell must pass, run its workload once per attempt, lose no metric row and
    leave nothing behind."""
    skip, why = NOT_APPLICABLE.get(label, ((), ""))
    machines = tuple(m for m in MACHINES if m not in skip)
    for f in env.signals.iterdir():
        f.unlink()
    t = time.monotonic()
    trigger(env, run_id, [cell_id(m, "slow") for m in machines])
    try:
        did = inject(env, run_id, machines)
    finally:
        (env.signals / "release").touch()
    try:
        state = env.stack.wait_for_run(DAG_ID, run_id, timeout=420)
    except TimeoutError as e:
        state = "unfinished"
        notes.append(f"PROBLEM: {label}: {e}")
        notes += unfinished(env, run_id)
    notes.append(f"{label}: run {state} in {time.monotonic() - t:.0f} s; {did}")
    if state != "success":
        notes.append(f"PROBLEM: {label}: the run ended {state}")
    leaks = settled_census(env, run_id)
    rows, tis, raced = (
        store_cells(env, run_id),
        tis_by_cell(env, run_id),
        env.stack.stale_success_failures(),
    )
    out = []
    for m, backend in MACHINES.items():
        if m in skip:
            out.append(Outcome(label, backend, applicable=False))
            continue
        cid = cell_id(m, "slow")
        o = judge_cell(
            env, run_id, label, m, "slow", rows, tis.get(cid, {}), leaks.pop(cid, []), raced
        )
        marker = env.signals / f"{m}-slow.run"
        started = len(marker.read_text().split()) if marker.exists() else 0
        # A retried run starts the workload again, except where a double run is the fault's
        # failure (the api-server row: no task may run twice).
        attempts = 1 + ("run" in o.retried and label != API_SERVER_RESTART)
        if started != PODS.get(m, 1) * attempts:
            o.problems.append(
                f"the workload started {started} times ({attempts} run attempt(s) of "
                f"{PODS.get(m, 1)} process(es)): a double run"
            )
        if label == STORE_DOWN:
            judge_store_outage(env, run_id, o, tis.get(cid, {}))
        if label == CLOUD_API_DOWN and polls_waited(env, run_id, m):
            o.retried.append("API polls")  # they met the outage and went on
        out.append(o)
    for cid, what in leaks.items():
        notes.append(f"PROBLEM: {label}: leak not attributed to a judged cell: {cid}: {what}")
    if why:
        notes.append(f"{label}: not applicable to {', '.join(skip)}: {why}")
    return out


def every_run_deferred(env: Env, run_id: str, machines: tuple[str, ...]) -> list[dict[str, Any]]:
    """Wait until the run task of every slow cell is deferred; their task instances."""
    return wait_for(
        lambda: (
            d
            if len(
                d := [
                    t
                    for t in env.stack.task_instances(DAG_ID, run_id)
                    if t["task_id"].endswith(".run") and t["state"] == "deferred"
                ]
            )
            == len(machines)
            else None
        ),
        60,
        "every run task deferred",
    )


def kill_triggerer(env: Env, run_id: str, machines: tuple[str, ...]) -> str:
    """SIGKILL the triggerer (its process group) while every run task is deferred; start it
    again 10 s later. The workloads go on meanwhile; the new triggerer picks up the
    deferred tasks' triggers from the database and follows them from their saved state."""
    all_slow_running(env, machines)
    deferred = every_run_deferred(env, run_id, machines)
    pid = env.stack.procs["triggerer"].pid
    code = env.stack.stop_component("triggerer", sig=signal.SIGKILL, grace=5)
    time.sleep(10)
    env.stack.start_component("triggerer")
    time.sleep(5)  # the new triggerer follows the workloads for a while before they end
    return f"triggerer pid {pid} SIGKILLed (exit {code}) with {len(deferred)} run tasks deferred, restarted 10 s later"


def run_triggers(env: Env, run_id: str) -> dict[str, int | None]:
    """The run tasks' triggers in the metadata DB: task id -> the triggerer job holding it."""
    query = sa.text(
        "SELECT ti.task_id, t.triggerer_id FROM task_instance ti JOIN trigger t"
        " ON ti.trigger_id = t.id WHERE ti.dag_id = :dag AND ti.run_id = :run"
        " AND ti.task_id LIKE '%.run'"
    )
    with env.metadata.connect() as c:
        return {r.task_id: r.triggerer_id for r in c.execute(query, {"dag": DAG_ID, "run": run_id})}


def alive_triggerer_jobs(env: Env) -> set[int]:
    """Triggerer jobs that have not ended and beat in the last 10 s."""
    since = datetime.now(UTC) - timedelta(seconds=10)
    query = sa.text(
        "SELECT id, latest_heartbeat FROM job WHERE job_type = 'TriggererJob' AND end_date IS NULL"
    )
    with env.metadata.connect() as c:
        rows = c.execute(query).all()
    # SQLite hands timestamps back as naive UTC strings or datetimes, PostgreSQL as aware.
    return {
        r.id for r in rows if r.latest_heartbeat is not None and _utc(r.latest_heartbeat) > since
    }


def _utc(value: Any) -> datetime:
    ts = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def triggerer_takeover(env: Env, run_id: str, machines: tuple[str, ...]) -> str:
    """Airflow's HA promise: with two triggerers running, one may die and the other adopts
    its triggers. Every run task's trigger is held by the first triggerer (the only one when
    they deferred); a second starts, and once it beats the first is SIGKILLed and stays
    down. The second must adopt every orphaned trigger (Airflow reassigns a trigger whose
    triggerer has not beaten for ``[triggerer] triggerer_health_check_threshold``, 30 s)
    and follow the workloads to their end from their saved log offsets."""
    all_slow_running(env, machines)
    every_run_deferred(env, run_id, machines)
    held = wait_for(
        lambda: (
            h
            if len(h := run_triggers(env, run_id)) == len(machines) and None not in h.values()
            else None
        ),
        60,
        "every run task's trigger held by a triggerer",
    )
    first = set(held.values())
    env.stack.start_another(SECOND_TRIGGERER, like="triggerer")
    second = wait_for(
        lambda: alive_triggerer_jobs(env) - first, 120, "the second triggerer's heartbeat"
    )
    pid = env.stack.procs["triggerer"].pid
    env.stack.stop_component("triggerer", sig=signal.SIGKILL, grace=5)
    t = time.monotonic()
    adopted = wait_for(
        lambda: h if set((h := run_triggers(env, run_id)).values()) <= second else None,
        180,
        "the second triggerer adopting every run task's trigger",
    )
    took = time.monotonic() - t
    time.sleep(5)  # the second triggerer follows the workloads for a while before they end
    return (
        f"triggerer pid {pid} (job {sorted(first)}) SIGKILLed holding {len(held)} run "
        f"triggers; job {sorted(second)} adopted all {len(adopted)} in {took:.0f} s"
    )


def one_triggerer_again(env: Env) -> None:
    """Back to one triggerer for the phases that follow: the second stopped, the first
    started again."""
    if SECOND_TRIGGERER in env.stack.procs:
        env.stack.stop_component(SECOND_TRIGGERER)
    if "triggerer" not in env.stack.procs:
        env.stack.start_component("triggerer")


def restart_api_server(env: Env, run_id: str, machines: tuple[str, ...]) -> str:
    """Stop the api-server while the cells' provision/setup task processes run (their
    Execution API calls meet a closed port), start it again 10 s later."""
    running = wait_for(
        lambda: [
            t["task_id"]
            for t in env.stack.task_instances(DAG_ID, run_id)
            if t["state"] == "running" and t["map_index"] >= 0
        ],
        120,
        "a running cell task",
        poll=0.2,
    )
    code = env.stack.stop_component("api-server")
    time.sleep(10)
    env.stack.start_component("api-server")
    all_slow_running(env, machines)
    return (
        f"api-server stopped (exit {code}) while {', '.join(sorted(set(running)))} ran, down 10 s"
    )


def store_down(env: Env, run_id: str, machines: tuple[str, ...]) -> str:
    """The results store's PostgreSQL stopped (fast shutdown) as soon as the first run task
    succeeded, so the collect tasks that follow meet it down; started again 30 s later."""
    all_slow_running(env, machines)
    (env.signals / "release").touch()
    first = wait_for(
        lambda: [
            t["task_id"]
            for t in env.stack.task_instances(DAG_ID, run_id)
            if t["task_id"].endswith(".run") and t["state"] == "success"
        ],
        120,
        "a run task that succeeded",
        poll=0.2,
    )
    t = time.monotonic()
    env.results_db.take_down()
    try:
        time.sleep(30)
    finally:
        env.results_db.bring_up()
    return f"results PostgreSQL down {time.monotonic() - t:.0f} s from when {first[0]} succeeded"


def judge_store_outage(env: Env, run_id: str, o: Outcome, tis: dict[str, dict[str, Any]]) -> None:
    """Whether this cell's collect met the outage (its log shows the store's wait) is in the
    table (count_rows judged its rows: none lost, none stored twice)."""
    collect = tis.get("collect")
    if collect and STORE_WAITED in log_of(env, run_id, collect):
        o.retried.append("collect")  # it waited for the store (one try, no Airflow retry)


# What a poll that met the cloud outage logs (backends/kubernetes/unreachable.py, the TPU
# backend's node check), in the run task's trigger log.
POLL_WAITED = ("cannot reach the Kubernetes API", "could not check TPU node")


def polls_waited(env: Env, run_id: str, machine: str) -> bool:
    folder = env.stack.logs_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={machine}.run"
    return any(
        any(w in f.read_text(errors="replace") for w in POLL_WAITED)
        for f in folder.glob("map_index=*/attempt=*.log*")
    )


def cloud_api_down(env: Env, run_id: str, machines: tuple[str, ...]) -> str:
    """Both cloud APIs unreachable for 60 s while the workloads run; the workloads end
    25 s into the outage, so their polls, the run step's release and the teardown all
    meet the outage and must wait it out."""
    all_slow_running(env, machines)
    t = time.monotonic()
    env.tpu.take_down()
    env.cluster.emulator.take_down()
    try:
        time.sleep(25)
        (env.signals / "release").touch()
        time.sleep(35)
    finally:
        env.tpu.bring_up()
        env.cluster.emulator.bring_up()
    return f"TPU and Kubernetes APIs down {time.monotonic() - t:.0f} s; workloads released 25 s in"


def cleanup(env: Env, run_id: str) -> list[str]:
    """Release what a run left behind (after it was recorded as a leak) via the backends."""
    done = []
    for spec in env.machines().values():
        backend = get_backend(spec)
        with contextlib.suppress(Exception):
            for r in backend.list_managed():
                if r.detail.identity is not None and r.detail.identity.run_id == run_id:
                    try:
                        backend.teardown(r.detail.resource)
                        done.append(f"tore down {r.name}")
                    except Exception as e:  # noqa: BLE001
                        done.append(f"could not tear down {r.name}: {e}")
    done += [f"killed {k}" for k in _kill_fault_processes(env.signals)]
    return done
