"""The janitor against every backend's loopback setup, with planted orphans and strangers.

Each backend test plants three things: an orphan (a real resource made by the backend with
a TTL already past, whose DAG run does not exist in Airflow's metadata DB), a managed
resource still within its TTL, and resources without ``managed-by=accelmatrix``. The sweep
must delete exactly the orphan, keep the others untouched, and record the reap in the
results store. Owner lookups go to the real (SQLite) Airflow metadata DB.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import CellContext, ManagedResource
from accelmatrix.cleanup import janitor
from accelmatrix.contracts.machine_records import CellIdentity, ManagedDetail
from accelmatrix.results.store import ResultsStore

pytest_plugins = ["tpu_env"]  # also brings tests/sshd.py

RUN = "manual__2026-01-01T00:00:00+00:00"
TPU_ZONE = "us-central2-b"
K8S_CONN = "accelmatrix_janitor_k8s"
K8S_NS = "accel"


def _ctx(home: Path, cell: str, ttl: int, *, dag: str = "janitor_t", run: str = RUN):
    return CellContext(
        dag_id=dag,
        run_id=run,
        cell_id=cell,
        artifacts_dir=home / "artifacts" / cell,
        ttl_seconds=ttl,
        labels={"task-group": "cpu", "map-index": "0"},
    )


def _store() -> ResultsStore:
    return ResultsStore.from_settings()


class Airflow:
    """Stand-in for Airflow's answers in the pure judging tests (runs and cell TIs)."""

    def __init__(self, runs: dict[str, str], tis: dict[str, str | None] | None = None):
        self.runs, self.tis = runs, tis or {}

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self.runs.get(run_id)

    def cell_states(self, dag_id, run_id, task_group, map_index):
        return {k: v for k, v in self.tis.items() if k.startswith(f"{task_group}.")}


def _res(ttl: float, *, exact: bool = True, run: str = RUN, **labels: str) -> ManagedResource:
    base = {"managed-by": "accelmatrix", "dag": "d", "run": run, "cell": "c", "ttl": str(int(ttl))}
    ident = {"dag_id": "d", "run_id": run, "cell_id": "c"} if exact else None
    detail = ManagedDetail(identity=CellIdentity.model_validate(ident) if ident else None)
    return ManagedResource("local", "r", {**base, **labels}, detail=detail)


# -- judging ----------------------------------------------------------------------------------
def test_judge_reasons():
    now = 1_000_000.0
    owner = {"task-group": "cpu", "map-index": "3"}
    j = janitor.judge
    assert not j(_res(now + 60), Airflow({}), now=now, grace_seconds=100).reap
    undated = _res(now - 1)
    undated.labels["ttl"] = "soon"
    kept = j(undated, Airflow({}), now=now, grace_seconds=100)
    assert not kept.reap and "no valid ttl" in kept.reason
    gone = j(_res(now - 10), Airflow({}), now=now, grace_seconds=100)
    assert gone.reap and "does not exist" in gone.reason
    done = j(_res(now - 10), Airflow({RUN: "failed"}), now=now, grace_seconds=100)
    assert done.reap and "is failed" in done.reason
    # The run still runs and the cell's teardown has not run: kept until TTL + grace.
    busy = Airflow({RUN: "running"}, {"cpu.run": "deferred", "cpu.teardown": None})
    kept = j(_res(now - 10, **owner), busy, now=now, grace_seconds=100)
    assert not kept.reap and "cpu.run=deferred" in kept.reason
    late = j(_res(now - 101, **owner), busy, now=now, grace_seconds=100)
    assert late.reap and "grace" in late.reason
    # Every task of the cell finished (teardown failed for good) while other cells run.
    finished = Airflow({RUN: "running"}, {"cpu.run": "success", "cpu.teardown": "failed"})
    reaped = j(_res(now - 10, **owner), finished, now=now, grace_seconds=100)
    assert reaped.reap and "teardown: failed" in reaped.reason
    # Lossy (Google-label) ids that match no run: not trusted before the grace.
    lossy = j(
        _res(now - 10, exact=False, run="manual__2026"), Airflow({}), now=now, grace_seconds=100
    )
    assert not lossy.reap


def test_machines_from_suites_dedupes_by_what_they_list(tmp_path):
    root = Path(__file__).resolve().parents[1] / "include" / "suites"
    machines, broken = janitor.machines_from_suites(root)
    assert broken == []
    assert "local" in machines
    kinds = {spec["backend"] for spec in machines.values()}
    assert {"local", "ssh", "tpu-vm", "k8s-job"} <= kinds
    assert len(machines) == len({janitor.machine_key(s) for s in machines.values()})


# -- local ------------------------------------------------------------------------------------
def _plant_unmanaged_local(root: Path) -> list[Path]:
    out = []
    for i, labels in enumerate(({"dag": "x"}, {"managed-by": "someone-else", "ttl": "1"})):
        d = root / "other" / "run" / f"cell{i}"
        d.mkdir(parents=True)
        (d / "resource.json").write_text(json.dumps({"name": str(d), "labels": labels}))
        out.append(d)
    return out


def test_local_orphans_reaped_fresh_and_unmanaged_kept(airflow_db, accel_home):
    from accelmatrix import settings
    from accelmatrix.backends.local.backend import LocalBackend

    b = backend_of(LocalBackend, {"backend": "local"})
    orphan = b.provision(_ctx(accel_home, "model=old", ttl=-60))
    fresh = b.provision(_ctx(accel_home, "model=new", ttl=3600))
    strangers = _plant_unmanaged_local(settings.work_root())
    machines = {"local": {"backend": "local"}}

    # Dry run: decides and records, deletes nothing.
    report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=True, store=_store())
    assert [d.resource.name for d in report.reaped] == [orphan.name]
    assert Path(orphan.work_dir).is_dir()
    assert report.ignored_unmanaged == 2

    report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=False, store=_store())
    assert [d.resource.name for d in report.reaped] == [orphan.name]
    assert not Path(orphan.work_dir).exists()
    assert Path(fresh.work_dir, "resource.json").is_file()
    assert all((s / "resource.json").is_file() for s in strangers)
    rows = _store().get_reaped(backend="local")
    assert [(r.name, r.dry_run) for r in rows] == [
        (orphan.name, True),
        (orphan.name, False),
    ]
    assert rows[1].cell_id == "model=old" and rows[1].run_id == RUN
    assert "does not exist" in rows[1].reason and rows[1].labels["managed-by"]


def test_reap_run_takes_only_that_runs_resources_whatever_their_ttl(airflow_db, accel_home):
    """A run stopped from outside: its machines go now (TTL not past), nobody else's do."""
    from accelmatrix import settings
    from accelmatrix.backends.local.backend import LocalBackend

    b = backend_of(LocalBackend, {"backend": "local"})
    mine = [b.provision(_ctx(accel_home, f"n={i}", ttl=3600)) for i in range(2)]
    other_run = b.provision(_ctx(accel_home, "n=0", ttl=3600, run="manual__other"))
    other_dag = b.provision(_ctx(accel_home, "n=0", ttl=3600, dag="janitor_other"))
    strangers = _plant_unmanaged_local(settings.work_root())
    said: list[str] = []

    report = janitor.reap_run(
        "janitor_t", RUN, [{"backend": "local"}], reason="stopped", say=said.append, store=_store()
    )
    assert sorted(d.resource.name for d in report.reaped) == sorted(r.name for r in mine)
    assert not any(Path(r.work_dir).exists() for r in mine)
    for kept in (other_run, other_dag):
        assert Path(kept.work_dir, "resource.json").is_file()
    assert all((s / "resource.json").is_file() for s in strangers)
    rows = _store().get_reaped(backend="local")
    assert sorted(r.cell_id for r in rows) == ["n=0", "n=1"]
    assert all(r.run_id == RUN and "stopped" in r.reason for r in rows)
    assert said, "the reaps are logged"


# -- ssh --------------------------------------------------------------------------------------
def test_ssh_orphans_reaped_over_ssh(airflow_db, accel_home, sshd_server, tmp_path):
    from accelmatrix.backends.machines.ssh import SshMachine
    from accelmatrix.backends.ssh.backend import SshBackend
    from accelmatrix.hooks import ssh as ssh_hook

    spec = SshMachine(
        backend="ssh",
        ssh_conn_id=sshd_server.conn_id,
        python=sys.executable,
        work_root=str(tmp_path / "remote"),
    ).model_dump(mode="json")
    b = backend_of(SshBackend, spec)
    try:
        orphan = b.provision(_ctx(accel_home, "model=old", ttl=-60))
        # A workload still running on the orphan: reaping must stop it, not only rm the dir.
        h = b.submit(orphan, [sys.executable, "-c", "import time; time.sleep(300)"], {})
        fresh = b.provision(_ctx(accel_home, "model=new", ttl=3600))
        strangers = _plant_unmanaged_local(Path(spec["work_root"]))
        machines = {janitor.machine_key(spec): spec}
        report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=False, store=_store())
        assert [d.resource.name for d in report.reaped] == [orphan.name]
        assert not report.failed, report.table()
        assert not Path(orphan.work_dir).exists()
        from accelmatrix.backends.local.processes import pid_alive as _pid_alive

        deadline = time.time() + 10
        while _pid_alive(h.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(h.pid)
        assert Path(fresh.work_dir, "resource.json").is_file()
        assert all((s / "resource.json").is_file() for s in strangers)
        assert [r.name for r in _store().get_reaped(backend="ssh")] == [orphan.name]
    finally:
        ssh_hook.close_all()


# -- tpu-vm -----------------------------------------------------------------------------------
@pytest.mark.usefixtures("needs_gcloud")
@pytest.mark.slow(40)
def test_tpu_orphans_reaped_through_gcloud(
    airflow_db, accel_home, emu, gcloud_in_environ, server, tmp_path
):
    from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
    from accelmatrix.backends.tpu_vm.backend import TpuVmBackend

    spec = TpuVmMachine.model_validate(
        {
            "backend": "tpu-vm",
            "zone": TPU_ZONE,
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
            "ssh_user": server.user,
            "ssh_port": server.port,
            "python": sys.executable,
            "work_root": str(tmp_path / "vm"),
            "provision_timeout_seconds": 60,
            "provision_poll_seconds": 0.2,
        }
    ).model_dump(mode="json")
    b = backend_of(TpuVmBackend, spec, poll_interval=0.2)
    # A run id that Google labels can only hold lossily: the node's metadata has it exactly.
    run = "scheduled__2026-01-01T00:00:00+00:00"
    orphan = b.provision(_ctx(accel_home, "model=Old", ttl=-60, run=run))
    now = time.time()
    emu.plant_node(
        "am-fresh",
        TPU_ZONE,
        labels={"managed-by": "accelmatrix", "dag": "d", "ttl": str(int(now + 3600))},
    )
    emu.plant_node("theirs", TPU_ZONE, labels={"managed-by": "terraform", "ttl": "1"})
    emu.plant_node("bare", TPU_ZONE)
    listed = {m.name: m for m in b.list_managed()}
    assert listed[orphan.name].detail.identity.model_dump() == {
        "dag_id": "janitor_t",
        "run_id": run,
        "cell_id": "model=Old",
    }
    machines = {janitor.machine_key(spec): spec}
    report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=False, store=_store())
    assert [d.resource.name for d in report.reaped] == [orphan.name], report.table()
    assert not report.failed, report.table()
    nodes = {n["name"].rsplit("/", 1)[-1] for n in emu.state["nodes"].values()}
    assert nodes == {"am-fresh", "theirs", "bare"}
    (row,) = _store().get_reaped(backend="tpu-vm")
    assert row.run_id == run and row.cell_id == "model=Old"


# -- k8s-job ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from accelmatrix.hooks import k8s as k8s_hook
    from accelmatrix_testkit.k8s_emulator import Cluster

    root = tmp_path_factory.mktemp("k8s")
    with Cluster(root, ("default", K8S_NS)) as c:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in c.emulator.airflow_conn_env(K8S_CONN, K8S_NS).items():
                mp.setenv(key, value)
            k8s_hook.forget()
            yield c
            k8s_hook.forget()


def test_k8s_orphans_reaped_through_the_api(airflow_db, accel_home, cluster):
    from accelmatrix.backends.kubernetes.job import KubernetesJobBackend
    from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
    from accelmatrix.hooks import k8s as k8s_hook

    spec = KubernetesJobMachine.model_validate(
        {
            "backend": "k8s-job",
            "kubernetes_conn_id": K8S_CONN,
            "image": "python:3.11-slim",
            "python": sys.executable,
        }
    ).model_dump(mode="json")
    b = backend_of(KubernetesJobBackend, spec)
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    orphan = b.provision(_ctx(accel_home, "model=old", ttl=-60))
    b.submit(orphan, sleep, {})
    fresh = b.provision(_ctx(accel_home, "model=new", ttl=3600))
    b.submit(fresh, sleep, {})
    clients = k8s_hook.get_clients(K8S_CONN)
    stranger = {
        "metadata": {"name": "someone-elses-job", "labels": {"team": "infra", "ttl": "1"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x", "command": sleep}],
                }
            }
        },
    }
    clients.batch.create_namespaced_job(K8S_NS, stranger)
    machines = {janitor.machine_key(spec): spec}
    try:
        report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=False, store=_store())
        assert [d.resource.name for d in report.reaped] == [orphan.name], report.table()
        assert not report.failed, report.table()
        jobs = set(cluster.emulator.state()["jobs"])
        assert f"{K8S_NS}/{orphan.job_name}" not in jobs
        assert {f"{K8S_NS}/{fresh.job_name}", f"{K8S_NS}/someone-elses-job"} <= jobs
        (row,) = _store().get_reaped(backend="k8s-job")
        assert row.cell_id == "model=old" and row.name == orphan.name
    finally:
        b.teardown(fresh)
        clients.batch.delete_namespaced_job(
            "someone-elses-job", K8S_NS, propagation_policy="Background"
        )
