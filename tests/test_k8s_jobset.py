"""KubernetesJobSetBackend against the API emulator's JobSet controller, through the real client.

Each pod is a real local process (the fake kubelet); the leader's address reaches it over
loopback only because the emulator resolves the JobSet's hostnames once its headless Service
exists, so a test that rendezvouses proves the Service, the hostnames and the env together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import BackendError, CellContext
from accelmatrix.backends.machines.k8s_jobset import KubernetesJobSetMachine
from accelmatrix.hooks import k8s as k8s_hook
from accelmatrix_testkit.k8s_emulator import Cluster

CONN_ID = "accelmatrix_test_jobset"
NS = "train"

# Rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1 connects and says hello: a rendezvous
# through the leader's JobSet hostname, with nothing but the standard library.
RENDEZVOUS = """
import os, socket, sys, time
rank, addr, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} host {os.environ['HOSTNAME']}", flush=True)
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen()
    conn, _ = s.accept()
    print("leader got:", conn.recv(100).decode(), flush=True)
else:
    for _ in range(100):
        try:
            c = socket.create_connection((addr, port)); break
        except OSError:
            time.sleep(0.1)
    c.sendall(f"hello from rank {rank}".encode())
    print("worker sent hello", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("k8s")
    volume = root / "volume"
    volume.mkdir()
    with Cluster(root, ("default", NS), volumes={"accel-work": volume}, grace_seconds=1) as c:
        c.volume = volume
        with pytest.MonkeyPatch.context() as mp:
            for key, value in c.emulator.airflow_conn_env(CONN_ID, NS).items():
                mp.setenv(key, value)
            k8s_hook.forget()
            yield c
            k8s_hook.forget()


@pytest.fixture(autouse=True)
def _reset(cluster):
    cluster.jobsets.kueue_mode = "admit"
    cluster.emulator.forbidden.clear()
    yield
    cluster.emulator.forbidden.clear()


def backend(cluster, **kw):
    from accelmatrix.backends.kubernetes.jobset import KubernetesJobSetBackend

    spec = {
        "backend": "k8s-jobset",
        "kubernetes_conn_id": CONN_ID,
        "image": "python:3.11-slim",
        "python": sys.executable,
        "scheduling_timeout_seconds": 30,
        **kw,
    }
    return backend_of(
        KubernetesJobSetBackend, KubernetesJobSetMachine.model_validate(spec).model_dump()
    )


def ctx(tmp_path: Path, cell: str, dag: str = "jobset_tests") -> CellContext:
    return CellContext(dag, "manual__2026-01-01T00:00:00+00:00", cell, tmp_path / cell)


def wait(b, handle, timeout: float = 30.0, until=lambda st: st.done):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = b.poll(handle)
        if until(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"not reached in {timeout}s: {st}")


def left(cluster, name: str) -> dict:
    """Every object of the cell still on the cluster, by kind (empty: nothing left)."""
    state = cluster.emulator.state()
    found = {kind: [k for k in objs if name in k] for kind, objs in state.items()}
    found["jobsets"] = [n for (_, n) in cluster.jobsets.jobsets if name in n]
    found["workloads"] = [
        n
        for (_, n), w in cluster.jobsets.workloads.items()
        if w["metadata"]["ownerReferences"][0]["name"] == name
    ]
    return {k: v for k, v in found.items() if v}


def running_pods(cluster, name: str) -> list[str]:
    with cluster.emulator.lock:
        return [
            n
            for (_, n), p in cluster.emulator.pods.items()
            if name in n and p["status"]["phase"] == "Running"
        ]


def test_manifest_has_the_group_parts(cluster, tmp_path):
    b = backend(cluster, num_nodes=4, max_restarts=3, kueue={"queue_name": "ml"})
    r = b.provision(ctx(tmp_path, "m"))
    body = b.workload_jobset(r, ["python", "-c", "pass"], {"A": "1"})
    name = r.job_name
    spec = body["spec"]
    assert body["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert spec["network"] == {
        "enableDNSHostnames": True,
        "subdomain": name,
        "publishNotReadyAddresses": True,
    }
    assert spec["failurePolicy"]["maxRestarts"] == 3
    assert spec["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["workers"]}
    assert spec["suspend"] is True and body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    job = spec["replicatedJobs"][0]["template"]["spec"]
    assert job["completions"] == job["parallelism"] == 4 and job["backoffLimit"] == 0
    rules = job["podFailurePolicy"]["rules"]
    assert rules[0]["onPodConditions"][0]["type"] == "DisruptionTarget"  # before exit codes
    env = {e["name"]: e for e in job["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == f"{name}-workers-0-0.{name}"
    assert env["WORLD_SIZE"]["value"] == env["JAX_NUM_PROCESSES"]["value"] == "4"
    assert env["JAX_COORDINATOR_ADDRESS"]["value"] == f"{name}-workers-0-0.{name}:1234"
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert len(f"{name}-workers-0-3") <= 63


def test_two_pods_rendezvous_at_the_leader_hostname(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "rdv"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", RENDEZVOUS], {})
    lines, offset, deadline = [], 0, time.monotonic() + 30
    while time.monotonic() < deadline and not any("leader got" in x for x in lines):
        new, offset = b.read_logs(h, offset)
        lines += new
        time.sleep(0.1)
    assert "leader got: hello from rank 1" in lines, lines
    assert lines[0] == f"rank 0 of 2 host {name}-workers-0-0"  # the JobSet hostname
    st = wait(b, h)
    assert st.done and st.exit_code == 0 and not st.infrastructure_failure, st
    art = Path(r.artifacts_dir)
    logs = {p.name: p.read_text() for p in (art / "pods").iterdir()}
    assert len(logs) == 2
    assert any("worker sent hello" in t for t in logs.values())  # the non-leader's log too
    assert "leader got" in (art / "output.log").read_text()
    status = json.loads((art / "status.json").read_text())
    assert status["exit_code"] == 0 and [p["rank"] for p in status["pods"]] == [0, 1]
    timing = json.loads((art / "resources.jsonl").read_text().splitlines()[-1])
    assert 0 <= timing["rendezvous_s"] <= timing["all_pods_running_s"] < 30
    svc = cluster.emulator.state()["services"][f"{NS}/{name}"]
    assert svc["spec"]["clusterIP"] == "None"
    b.teardown(r)
    assert left(cluster, name) == {}


def test_two_jobsets_with_the_same_port_do_not_collide(cluster, tmp_path):
    b = backend(cluster)
    handles = []
    for cell in ("p1", "p2"):
        r = b.provision(ctx(tmp_path, cell))
        handles.append((r, b.submit(r, [sys.executable, "-c", RENDEZVOUS], {})))
    for r, h in handles:
        assert wait(b, h).exit_code == 0
        b.teardown(r)


def test_one_pod_failing_fails_the_group_at_once_and_names_the_pod(cluster, tmp_path):
    b = backend(cluster, num_nodes=3, max_restarts=2)
    r = b.provision(ctx(tmp_path, "crash"))
    name = r.job_name
    code = (
        "import os, sys, time\nrank = int(os.environ['RANK'])\n"
        "print(f'rank {rank} up', flush=True)\n"
        "if rank == 1:\n    time.sleep(1); print('loss exploded', flush=True); sys.exit(3)\n"
        "time.sleep(3600)"
    )
    h = b.submit(r, [sys.executable, "-c", code], {})
    wait(b, h, until=lambda st: len(running_pods(cluster, name)) == 3 or st.done)
    st = wait(b, h)
    assert st.exit_code == 3 and not st.infrastructure_failure, st
    assert f"pod {name}-workers-0-1-" in st.detail and "exited with 3" in st.detail
    assert "loss exploded" in st.detail  # the last lines of the failing pod
    js = cluster.jobsets.jobsets[(NS, name)]
    assert js["status"]["restarts"] == 0  # a workload exit is not retried
    assert running_pods(cluster, name) == []  # its peers were stopped
    art = Path(r.artifacts_dir)
    assert json.loads((art / "status.json").read_text())["exit_code"] == 3
    b.teardown(r)
    assert json.loads((art / "status.json").read_text())["exit_code"] == 3  # kept
    assert left(cluster, name) == {}


def test_a_group_whose_leader_is_gone_shows_the_log_of_the_pod_left(cluster, tmp_path):
    """A pod fails before the first poll, and the failed JobSet deletes its still-active
    peers, the leader among them, so the first snapshot sees no leader. output.log, which
    collect reads the workload's metrics from, is then the log of the pod left: before,
    it was not written and the cell's metric rows were lost (the fault matrix found it)."""
    b = backend(cluster, num_nodes=2)
    r = b.provision(ctx(tmp_path, "leaderless"))
    name = r.job_name
    code = (
        "import os, sys, time\nrank = int(os.environ['RANK'])\n"
        "if rank == 1:\n    print('step 1 loss: 0.500', flush=True); sys.exit(3)\n"
        "time.sleep(3600)"
    )
    h = b.submit(r, [sys.executable, "-c", code], {})

    def leader_gone_after_failure() -> bool:
        js = cluster.jobsets.jobsets.get((NS, name)) or {}
        with cluster.emulator.lock:
            leaders = [n for (_, n) in cluster.emulator.pods if f"{name}-workers-0-0-" in n]
        return js.get("status", {}).get("terminalState") == "Failed" and not leaders

    deadline = time.monotonic() + 30
    while not leader_gone_after_failure():  # no poll before: no snapshot saw the leader
        assert time.monotonic() < deadline, "the JobSet did not fail and delete its leader"
        time.sleep(0.1)
    st = wait(b, h)
    assert st.exit_code == 3, st
    art = Path(r.artifacts_dir)
    assert "step 1 loss: 0.500" in (art / "output.log").read_text()
    status = json.loads((art / "status.json").read_text())
    assert status["pod"].startswith(f"{name}-workers-0-1-"), status
    b.teardown(r)
    assert left(cluster, name) == {}


def test_teardown_waits_out_an_unreachable_api(cluster, tmp_path):
    """The JobSet's teardown reports an unreachable API as such (not folded into a
    BackendError), so the teardown step's delete tries again until the API answers."""
    from accelmatrix.steps.release import delete_machine

    b = backend(cluster, num_nodes=2)
    r = b.provision(ctx(tmp_path, "outage"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", "import time; time.sleep(3600)"], {})
    wait(b, h, until=lambda st: len(running_pods(cluster, name)) == 2)
    cluster.emulator.take_down()
    up = threading.Timer(5, cluster.emulator.bring_up)
    up.start()
    t = time.monotonic()
    try:
        with pytest.raises(Exception) as bare:
            b.teardown(r)
        assert b.unreachable(bare.value), repr(bare.value)
        delete_machine(b, r, patience=60)
        assert time.monotonic() - t >= 4
    finally:
        up.join()
    assert left(cluster, name) == {}


def test_a_disrupted_pod_restarts_the_group_then_it_succeeds(cluster, tmp_path):
    b = backend(cluster, max_restarts=1)
    r = b.provision(ctx(tmp_path, "disrupt"))
    name = r.job_name
    marker = tmp_path / "restarted"
    code = (
        "import os, pathlib, time\nm = pathlib.Path(os.environ['MARKER'])\n"
        "if os.environ['RANK'] == '0' and not m.exists():\n"
        "    m.touch(); print('first attempt', flush=True); time.sleep(3600)\n"
        "print('second attempt done', flush=True)\n"
    )
    h = b.submit(r, [sys.executable, "-c", code], {"MARKER": str(marker)})
    lines, offset = [], 0
    while "first attempt" not in lines:
        new, offset = b.read_logs(h, offset)
        lines += new
        time.sleep(0.05)
    (leader,) = running_pods(cluster, f"{name}-workers-0-0")
    cluster.kubelet.disrupt(NS, leader)
    st = wait(b, h)
    new, offset = b.read_logs(h, offset)  # the live log follows the new leader
    assert new[0].startswith("--- leader pod") and new[1:] == ["second attempt done"], new
    assert st.exit_code == 0 and not st.infrastructure_failure, st
    assert cluster.jobsets.jobsets[(NS, name)]["status"]["restarts"] == 1
    art = Path(r.artifacts_dir)
    pods = json.loads((art / "status.json").read_text())["pods"]
    assert {p["attempt"] for p in pods if p["rank"] == 0} >= {1}
    assert (art / "output.log").read_text() == "second attempt done\n"
    b.teardown(r)
    assert left(cluster, name) == {}


def test_a_restartable_exit_code_restarts_the_group(cluster, tmp_path):
    b = backend(cluster, max_restarts=1, restart_on_exit_codes=[42])
    r = b.provision(ctx(tmp_path, "exit42"))
    marker = tmp_path / "asked"
    code = (
        "import os, pathlib, sys\nm = pathlib.Path(os.environ['MARKER'] + os.environ['RANK'])\n"
        "if os.environ['RANK'] == '1' and not m.exists():\n    m.touch(); sys.exit(42)\n"
        "print('done', flush=True)\n"
    )
    h = b.submit(r, [sys.executable, "-c", code], {"MARKER": str(marker)})
    st = wait(b, h)
    assert st.exit_code == 0 and not st.infrastructure_failure, st
    assert cluster.jobsets.jobsets[(NS, r.job_name)]["status"]["restarts"] == 1
    b.teardown(r)


def test_disruption_past_max_restarts_is_infrastructure_not_the_exit_code(cluster, tmp_path):
    b = backend(cluster, max_restarts=0)
    r = b.provision(ctx(tmp_path, "disrupt0"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", "import time; time.sleep(3600)"], {})
    wait(b, h, until=lambda st: len(running_pods(cluster, name)) == 2)
    cluster.kubelet.disrupt(NS, running_pods(cluster, f"{name}-workers-0-1")[0])
    st = wait(b, h)
    assert st.infrastructure_failure and st.exit_code is None, st
    assert "ReachedMaxRestarts" in st.detail and "Preemption" in st.detail
    pods = json.loads((Path(r.artifacts_dir) / "status.json").read_text())["pods"]
    (hit,) = [p for p in pods if p["rank"] == 1]
    assert hit["exit_code"] == 143 and "PreemptionByScheduler" in hit["disruption"]  # SIGTERM
    b.teardown(r)
    assert left(cluster, name) == {}


def unschedulable_pods(cluster, name: str) -> list[str]:
    """The cell's pods that the emulated kube-scheduler has already marked Unschedulable."""
    with cluster.emulator.lock:
        return [
            n
            for (_, n), p in cluster.emulator.pods.items()
            if name in n
            and any(c.get("reason") == "Unschedulable" for c in p["status"]["conditions"])
        ]


def test_unschedulable_pods_are_infrastructure_with_the_scheduler_reason(cluster, tmp_path):
    b = backend(cluster, image="fault/unschedulable", scheduling_timeout_seconds=1)
    r = b.provision(ctx(tmp_path, "unsched"))
    try:
        h = b.submit(r, [sys.executable, "-c", "pass"], {})
        # Wait for the scheduler's verdict on both pods first: on a loaded machine the
        # 1 s timeout can pass before the scheduler has looked at a pod, and the
        # backend then rightly says "not scheduled yet" instead of the scheduler's reason.
        deadline = time.monotonic() + 30
        while len(unschedulable_pods(cluster, r.job_name)) < 2:
            assert time.monotonic() < deadline, "the scheduler never marked the pods"
            time.sleep(0.05)
        st = wait(b, h)
        assert st.infrastructure_failure and "Insufficient nvidia.com/gpu" in st.detail, st
    finally:
        b.teardown(r)
    assert left(cluster, r.job_name) == {}


def test_kueue_not_admitted_in_time_is_a_capacity_failure(cluster, tmp_path):
    cluster.jobsets.kueue_mode = "hold"
    b = backend(
        cluster,
        kueue={"queue_name": "team-a", "priority_class": "batch", "admission_timeout_seconds": 2},
    )
    r = b.provision(ctx(tmp_path, "held"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", "print('never')"], {})
    st = b.poll(h)
    assert not st.done and "waiting for Kueue admission" in st.detail, st
    labels = cluster.jobsets.jobsets[(NS, name)]["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "batch"
    st = wait(b, h, timeout=15)
    assert st.infrastructure_failure and "not admitted by Kueue" in st.detail, st
    assert "team-a" in st.detail and "insufficient unused quota" in st.detail
    assert "pods" not in left(cluster, name)  # a suspended JobSet ran nothing
    b.teardown(r)
    assert left(cluster, name) == {}


def test_kueue_eviction_mid_run_is_infrastructure(cluster, tmp_path):
    b = backend(cluster, kueue={"queue_name": "team-a"})
    r = b.provision(ctx(tmp_path, "evicted"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", "import time; time.sleep(3600)"], {})
    wait(b, h, until=lambda st: len(running_pods(cluster, name)) == 2)
    cluster.jobsets.evict(NS, name)
    st = wait(b, h)
    assert st.infrastructure_failure and "evicted by Kueue" in st.detail, st
    assert "Preempted" in st.detail
    status = json.loads((Path(r.artifacts_dir) / "status.json").read_text())
    assert status["exit_code"] is None and "evicted by Kueue" in status["reason"]
    deadline = time.monotonic() + 10
    while running_pods(cluster, name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running_pods(cluster, name) == []
    # The run step's retry submits again: the evicted JobSet is replaced, queued, admitted.
    h2 = b.submit(r, [sys.executable, "-c", "print('second try')"], {})
    assert not h2.reattached and h2.uid != h.uid
    assert wait(b, h2).exit_code == 0
    assert (Path(r.artifacts_dir) / "output.log").read_text() == "second try\n"
    b.teardown(r)
    assert left(cluster, name) == {}


def test_names_fit_every_derived_hostname(cluster, tmp_path):
    b = backend(cluster, num_nodes=1000)
    c = ctx(tmp_path, "model=" + "x" * 200, dag="d" * 200)
    r = b.provision(c)
    assert len(f"{r.job_name}-workers-0-999") <= 63
    # The emulator refuses what the JobSet webhook refuses.
    from accelmatrix.hooks import jobset as api

    body = b.workload_jobset(r, ["true"], {})
    body["metadata"]["name"] = "a" * 60
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as e:
        api.create_jobset(b.clients(r), NS, body)
    assert e.value.status == 422 and "63 characters" in e.value.body


def test_a_role_without_pods_log_is_named_and_teardown_still_deletes(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "rbac"))
    name = r.job_name
    cluster.emulator.forbidden.add(("get", "pods/log"))
    h = b.submit(r, [sys.executable, "-c", "print('hi')"], {})
    with pytest.raises(BackendError, match=r"`get` on resource `pods/log`"):
        wait(b, h)
    b.teardown(r)
    assert left(cluster, name) == {}


def test_janitor_reaps_an_orphaned_jobset_by_exact_ids(airflow_db, accel_home, cluster):
    from accelmatrix.cleanup import janitor
    from accelmatrix.results.store import ResultsStore

    # Expired a minute ago (ttl -60 s); its Job's deadline must still be valid (>= 0).
    b = backend(cluster, active_deadline_seconds=600)
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    orphan_ctx = CellContext("jobset_janitor", "gone_run", "model=old", accel_home / "a", -60)
    orphan = b.provision(orphan_ctx)
    h = b.submit(orphan, sleep, {})
    wait(b, h, until=lambda st: len(running_pods(cluster, orphan.job_name)) == 2)
    fresh = b.provision(CellContext("jobset_janitor", "gone_run", "model=new", accel_home / "b"))
    b.submit(fresh, sleep, {})
    from accelmatrix.backends.kubernetes.job import KubernetesJobBackend

    single = backend_of(
        KubernetesJobBackend,
        {"backend": "k8s-job", "kubernetes_conn_id": CONN_ID, "image": "x", "python": "python"},
    )
    job_cell = single.provision(CellContext("jobset_janitor", "gone_run", "single", accel_home))
    single.submit(job_cell, sleep, {})
    try:
        # Each kind lists only its own cells, though they share the namespace and labels.
        assert job_cell.name not in {e.name for e in b.list_managed()}
        assert {e.name for e in single.list_managed()} == {job_cell.name}
        (entry,) = [e for e in b.list_managed() if e.name == orphan.name]
        assert entry.detail.identity.cell_id == "model=old"
        assert entry.detail.services == [orphan.job_name]
        assert len(entry.detail.pods) == 2
        machines = {
            janitor.machine_key(b.machine.model_dump(mode="json")): b.machine.model_dump(
                mode="json"
            )
        }
        store = ResultsStore.from_settings()
        report = janitor.sweep(machines, janitor.DbOwnerLookup(), dry_run=False, store=store)
        assert [d.resource.name for d in report.reaped] == [orphan.name], report.table()
        assert left(cluster, orphan.job_name) == {}
        assert left(cluster, fresh.job_name)  # within its TTL: kept
        (row,) = store.get_reaped(backend="k8s-jobset")
        assert row.cell_id == "model=old"
        for pod in entry.detail.pods:
            assert f"Pod {NS}/{pod}" in row.reason
        assert f"Service {NS}/{orphan.job_name}" in row.reason
        assert f"JobSet {NS}/{orphan.job_name} uid=" in row.reason
    finally:
        b.teardown(fresh)
        single.teardown(job_cell)


def test_a_pod_stuck_in_container_creating_fails_the_group_as_infrastructure(cluster, tmp_path):
    b = backend(cluster, image="fault/stuck-creating", container_creating_timeout_seconds=1)
    r = b.provision(ctx(tmp_path, "stuck"))
    h = b.submit(r, [sys.executable, "-c", "pass"], {})
    st = wait(b, h)
    assert st.infrastructure_failure and "stuck in ContainerCreating" in st.detail, st
    b.teardown(r)
    assert left(cluster, r.job_name) == {}


def test_cluster_validation_workload_runs_one_worker_per_pod(cluster, tmp_path):
    """ddp_validation.py on the JobSet machine: the launcher's env makes each pod one worker."""
    script = Path(__file__).resolve().parents[1] / "include/workloads/cluster/ddp_validation.py"
    b = backend(cluster, scheduling_timeout_seconds=60)
    r = b.provision(ctx(tmp_path, "hyperpod"))
    argv = [sys.executable, str(script), "--mode", "quick", "--quick-seconds", "3"]
    h = b.submit(r, argv + ["--out-dir", "/workspace/out"], {})
    st = wait(b, h, timeout=120)
    assert st.exit_code == 0, st
    art = Path(r.artifacts_dir)
    leader = (art / "output.log").read_text()
    assert "job: worker 0 of 2" in leader and "Finished training run" in leader
    assert any("job: worker 1 of 2" in p.read_text() for p in (art / "pods").iterdir())
    b.teardown(r)
    assert left(cluster, r.job_name) == {}


def test_real_kubectl_sees_the_jobset_its_hostnames_and_headless_service(
    cluster, tmp_path, needs_kubectl
):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "kubectl"))
    name = r.job_name
    h = b.submit(r, [sys.executable, "-c", "import time; time.sleep(30)"], {})
    wait(b, h, until=lambda st: len(running_pods(cluster, name)) == 2)
    env = {**os.environ, "KUBECONFIG": str(cluster.emulator.write_kubeconfig(tmp_path / "kc"))}

    def kubectl(*args: str) -> str:
        p = subprocess.run(  # noqa: S603 (argv list)
            [needs_kubectl, "-n", NS, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    assert kubectl("get", "jobsets", "-o", "name").split() == [f"jobset.jobset.x-k8s.io/{name}"]
    hosts = kubectl(
        "get", "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={name}",
        "-o", "jsonpath={range .items[*]}{.spec.hostname}.{.spec.subdomain} {end}",
    ).split()  # fmt: skip
    assert hosts == [f"{name}-workers-0-0.{name}", f"{name}-workers-0-1.{name}"]
    assert kubectl("get", "svc", name, "-o", "jsonpath={.spec.clusterIP}") == "None"
    b.cancel(h)
    b.teardown(r)
    assert left(cluster, name) == {}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"kueue": {"queue_name": "Team A"}}, "machines.big.kueue.queue_name"),
        ({"kueue": {"queue": "a"}}, "machines.big.kueue.queue"),
        ({"rendezvous_port": 1234}, "both 1234"),
        ({"token": "abc"}, "a k8s-jobset machine takes no cluster endpoint"),
        ({"num_nodes": 0}, "machines.big.num_nodes"),
    ],
)
def test_bad_jobset_machines_get_one_clear_error(tmp_path, change, needle):
    import yaml

    from accelmatrix.spec.loader import SuiteError, load_suite

    spec = {"backend": "k8s-jobset", "image": "x", **change}
    suite = {
        "description": "d",
        "machines": {"big": spec},
        "machine": "big",
        "workload": {"run": ["python", "-c", "pass"]},
    }
    path = tmp_path / "bad_jobset.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    text = str(e.value) + "\n".join(e.value.problems)
    assert str(path) in text and needle in text, text


def test_ttl_after_finished_removes_the_finished_group(cluster, tmp_path):
    """The backstop for a dead triggerer: the finished JobSet and everything it owns go."""
    b = backend(cluster, ttl_seconds_after_finished=1)
    r = b.provision(ctx(tmp_path, "ttl"))
    h = b.submit(r, [sys.executable, "-c", "print('quick')"], {})
    assert wait(b, h).exit_code == 0
    deadline = time.monotonic() + 10
    while left(cluster, r.job_name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left(cluster, r.job_name) == {}
    st = b.poll(h)  # a poll after that says what happened, as infrastructure
    assert st.infrastructure_failure and "ttlSecondsAfterFinished" in st.detail


def test_a_kueue_wait_does_not_count_toward_the_workload_timeout(cluster, tmp_path):
    """Held in the queue longer than its timeout, then admitted: the workload runs to the
    end (its clock starts when its pods run, for the timeout and for hang detection); once
    running, the timeout still applies."""
    import asyncio

    from accelmatrix.steps.run.trigger import WorkloadTrigger

    kueue = {"queue_name": "team-a", "admission_timeout_seconds": 120}
    spec = KubernetesJobSetMachine.model_validate(
        {
            "backend": "k8s-jobset",
            "kubernetes_conn_id": CONN_ID,
            "image": "python:3.11-slim",
            "python": sys.executable,
            "kueue": kueue,
        }
    ).model_dump()
    b = backend(cluster, kueue=kueue)
    timeout = 4.0

    def run(cell: str, code: str, hold: float, hang: dict | None = None) -> tuple[dict, float]:
        cluster.jobsets.kueue_mode = "hold"
        r = b.provision(ctx(tmp_path, cell))
        h = b.submit(r, [sys.executable, "-c", code], {})
        submitted = time.time()
        trigger = WorkloadTrigger(
            machine_spec=spec,
            handle=h,
            deadline=submitted + timeout,
            poll_interval=0.2,
            timeout=timeout,
            deferred_at=0.0,  # no settling before the event (there is no task to resume)
            hang_detection=hang,
        )

        async def first_event() -> dict:
            async def admit_later() -> None:
                await asyncio.sleep(hold)
                cluster.jobsets.kueue_mode = "admit"

            task = asyncio.create_task(admit_later())
            async for event in trigger.run():
                await task
                return event.payload
            raise AssertionError("no event")

        payload = asyncio.run(first_event())
        b.cancel(h)
        b.teardown(r)
        return payload, time.time() - submitted

    # Queued for 6 s (> the 4 s timeout and the 3 s heartbeat limit), then runs 2 s: passes.
    payload, took = run(
        "queued",
        "import time; print('step 1', flush=True); time.sleep(2); print('done')",
        hold=6,
        hang={"pattern": "step", "start_within": 3, "recur_within": 60},
    )
    assert payload["status"] == "exited" and payload["exit_code"] == 0, payload
    assert took > 6 + 2
    # Queued for 3 s, then runs for ever: timed out 4 s after its pods ran, not after submit.
    payload, took = run("queued-slow", "import time; time.sleep(60)", hold=3)
    assert payload["status"] == "timeout", payload
    assert 3 + timeout <= took < 3 + timeout + 4, took
