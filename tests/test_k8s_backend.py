"""KubernetesJobBackend against the Kubernetes API emulator, through the real client.

The emulator (accelmatrix_testkit.k8s_emulator) serves the API on 127.0.0.1; its fake
kubelet runs each Job's container command as a local process, so every test here drives the
whole lifecycle: the real ``kubernetes`` client, the provider's KubernetesHook building it
from an Airflow connection, Job and pod objects, pod logs, deletes with propagation.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from backend_of import backend_of
from pydantic import ValidationError

from accelmatrix.backends.base import CellContext, InfrastructureError, SetupFailed
from accelmatrix.backends.kubernetes.job import CONTAINER
from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
from accelmatrix.hooks import k8s as k8s_hook
from accelmatrix_testkit.k8s_emulator import Cluster

CONN_ID = "accelmatrix_test_k8s"
NS = "accel"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("k8s")
    volume = root / "volume"
    volume.mkdir()
    with Cluster(root, ("default", NS), volumes={"accel-work": volume}) as c:
        c.volume = volume
        with pytest.MonkeyPatch.context() as mp:
            for key, value in c.emulator.airflow_conn_env(CONN_ID, NS).items():
                mp.setenv(key, value)
            k8s_hook.forget()
            yield c
            k8s_hook.forget()


def machine(cluster, **kw) -> dict:
    spec = {
        "backend": "k8s-job",
        "kubernetes_conn_id": CONN_ID,
        "image": "python:3.11-slim",
        "python": sys.executable,
        "artifacts_volume": {"claim_name": "accel-work", "local_path": str(cluster.volume)},
        "scheduling_timeout_seconds": 30,
    }
    spec.update(kw)
    return KubernetesJobMachine.model_validate(spec).model_dump(mode="json")


def backend(cluster, **kw):
    from accelmatrix.backends.kubernetes.job import KubernetesJobBackend

    return backend_of(KubernetesJobBackend, machine(cluster, **kw))


def ctx(tmp_path: Path, cell: str) -> CellContext:
    return CellContext("k8s_tests", "manual__2026-01-01T00:00:00+00:00", cell, tmp_path / cell)


def wait(b, handle, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = b.poll(handle)
        if st.done:
            return st
        time.sleep(0.1)
    raise AssertionError(f"not done in {timeout}s: {st}")


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def state(cluster) -> dict:
    return cluster.emulator.state()


def test_provision_and_submit_are_idempotent(cluster, tmp_path):
    b = backend(cluster)
    c = ctx(tmp_path, "model=a")
    r1, r2 = b.provision(c), b.provision(c)
    assert r1.name == r2.name == f"{NS}/{r1.job_name}"
    assert len(r1.job_name) <= 63 and r1.labels["managed-by"] == "accelmatrix"
    argv = py("import time; print('up', flush=True); time.sleep(1)")
    h1 = b.submit(r1, argv, {})
    h2 = b.submit(r2, argv, {})  # a retried run task
    assert not h1.reattached and h2.reattached and h1.uid == h2.uid
    jobs = [k for k in state(cluster)["jobs"] if r1.job_name in k]
    assert jobs == [f"{NS}/{r1.job_name}"]
    assert wait(b, h2).exit_code == 0
    pods = [p for p in state(cluster)["pods"] if r1.job_name in p]
    assert len(pods) == 1  # one pod: nothing ran twice
    b.teardown(r1)


@pytest.mark.parametrize("code", [0, 3])
def test_exit_codes_and_status_json(cluster, tmp_path, code):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, f"exit={code}"))
    h = b.submit(r, py(f"print('bye', flush=True); raise SystemExit({code})"), {})
    st = wait(b, h)
    assert st.done and st.exit_code == code and not st.infrastructure_failure
    art = Path(r.artifacts_dir)
    status = json.loads((art / "status.json").read_text())  # written by poll at the end
    assert status["exit_code"] == code and status["ended_at"] >= status["started_at"]
    assert (art / "output.log").read_text() == "bye\n"
    b.teardown(r)


def test_logs_stream_while_the_pod_runs(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "live=1"))
    go = tmp_path / "go"
    code = (
        "import os, time\nprint('first line', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('last line')"
    )
    h = b.submit(r, py(code), {})
    lines, offset, deadline = [], 0, time.monotonic() + 20
    while not lines and time.monotonic() < deadline:
        lines, offset = b.read_logs(h, offset)
        time.sleep(0.05)
    assert lines == ["first line"] and offset == len("first line\n")
    assert not b.poll(h).done  # seen while running, not after
    go.touch()
    assert wait(b, h).exit_code == 0
    assert b.read_logs(h, offset) == (["last line"], offset + len("last line\n"))
    b.teardown(r)


def test_argv_is_never_split_or_interpreted_by_a_shell(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "argv=1"))
    # $(VAR) and $$ are the kubelet's own expansion syntax: they must arrive literally too.
    args = ["a b", 'it\'s "q"', "x; touch pwned", "$HOME", "`id`", "$(TRICKY)", "$(HOME)", "a$$b"]
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    h = b.submit(r, py(code) + args, {"TRICKY": "$(touch pwned2); 'q'"})
    assert wait(b, h).exit_code == 0
    assert json.loads((Path(r.artifacts_dir) / "output.log").read_text()) == args
    job = state(cluster)["jobs"][r.name]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][3:] == [a.replace("$", "$$") for a in args]
    assert "args" not in container
    assert {"name": "TRICKY", "value": "$(touch pwned2); 'q'"} in container["env"]
    assert not any(Path(r.local_work_dir).glob("pwned*"))
    b.teardown(r)


def test_gpu_mig_and_cpu_only_pod_specs(cluster, tmp_path):
    gpu = backend(cluster, gpus=2, accelerator="nvidia-l4", cpu=8, memory="32Gi")
    r = gpu.provision(ctx(tmp_path, "gpu=1"))
    h = gpu.submit(r, py("import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"), {})
    wait(gpu, h)
    # What the API server received (not just what we rendered).
    pod = state(cluster)["jobs"][r.name]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert not any(e["name"] == "CUDA_VISIBLE_DEVICES" for e in c["env"])
    assert pod["restartPolicy"] == "Never"
    gpu.teardown(r)

    mig = backend(cluster, mig_profile="1g.10gb", accelerator="nvidia-a100-80gb")
    body = mig.workload_job(mig.provision(ctx(tmp_path, "mig=1")), ["true"], {})
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/mig-1g.10gb": "1"}
    }

    cpu = backend(cluster, cpu="500m", service_account="runner", num_nodes=3)
    r = cpu.provision(ctx(tmp_path, "cpu=1"))
    body = cpu.workload_job(r, ["true"], {"A": "1"})
    pod = body["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "-1" and env["A"] == "1"
    assert "tolerations" not in pod and "nodeSelector" not in pod
    assert pod["serviceAccountName"] == "runner"
    spec = body["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] == 6 * 3600
    labels = body["metadata"]["labels"]
    assert labels["managed-by"] == "accelmatrix" and labels["cell"] == "cpu_1"
    assert body["metadata"]["annotations"]["accelmatrix.io/cell-id"] == "cpu=1"


def test_indexed_job_runs_every_index_and_reports_index_zero(cluster, tmp_path):
    b = backend(cluster, num_nodes=2)
    r = b.provision(ctx(tmp_path, "nodes=2"))
    code = "import os; print('index', os.environ['JOB_COMPLETION_INDEX'])"
    h = b.submit(r, py(code), {})
    assert wait(b, h).exit_code == 0
    art = Path(r.artifacts_dir)
    assert (art / "output.log").read_text() == "index 0\n"
    assert (art / "output-1.log").read_text() == "index 1\n"
    b.teardown(r)


def test_unschedulable_is_an_infrastructure_failure_after_the_timeout(cluster, tmp_path):
    b = backend(cluster, image="fault/unschedulable", gpus=1, scheduling_timeout_seconds=2)
    r = b.provision(ctx(tmp_path, "sched=1"))
    h = b.submit(r, ["true"], {})
    time.sleep(0.5)
    assert not b.poll(h).done  # Pending, but not yet for long enough
    st = wait(b, h)
    assert st.infrastructure_failure and st.exit_code is None
    assert "unschedulable for" in st.detail
    assert "0/3 nodes are available: 3 Insufficient nvidia.com/gpu" in st.detail
    b.teardown(r)
    assert r.name not in state(cluster)["jobs"]


def test_bad_image_is_an_infrastructure_failure_naming_the_image(cluster, tmp_path):
    b = backend(cluster, image="fault/bad-image:v1")
    r = b.provision(ctx(tmp_path, "image=bad"))
    h = b.submit(r, ["true"], {})
    st = wait(b, h)
    assert st.infrastructure_failure and st.exit_code is None
    assert "cannot pull image 'fault/bad-image:v1'" in st.detail
    assert "ErrImagePull" in st.detail or "ImagePullBackOff" in st.detail
    # A retry of the run finds the Job, sees it failed for infrastructure, starts afresh.
    h2 = b.submit(r, ["true"], {})
    assert not h2.reattached and h2.uid != h.uid
    b.teardown(r)


def test_evicted_pod_is_an_infrastructure_failure(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "evict=1"))
    h = b.submit(r, py("import time; print('up', flush=True); time.sleep(60)"), {})
    deadline = time.monotonic() + 20
    while not b.read_logs(h, 0)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    pod = next(p for p in state(cluster)["pods"] if r.job_name in p)
    cluster.kubelet.evict(NS, pod.split("/")[1])
    st = wait(b, h)
    assert st.infrastructure_failure and "evicted" in st.detail
    assert "low on resource" in st.detail
    b.teardown(r)


def test_teardown_deletes_job_and_pods_and_tolerates_gone(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "teardown=1"))
    h = b.submit(r, py("import time; print('up', flush=True); time.sleep(60)"), {})
    deadline = time.monotonic() + 20
    while not b.read_logs(h, 0)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    proc = next(iter(cluster.kubelet.procs.values()))
    b.teardown(r)
    assert r.name not in state(cluster)["jobs"]
    assert not [p for p in state(cluster)["pods"] if r.job_name in p]
    assert proc.wait(timeout=10) is not None  # the workload process is gone too
    status = json.loads((Path(r.artifacts_dir) / "status.json").read_text())
    assert status["exit_code"] is None and status["started_at"]  # saved before the delete
    assert (Path(r.artifacts_dir) / "output.log").read_text() == "up\n"
    assert not Path(r.local_work_dir).exists()
    b.teardown(r)  # already gone: fine
    st = b.poll(h)
    assert st.done and st.infrastructure_failure and "disappeared" in st.detail


@pytest.mark.slow(20)
def test_teardown_task_waits_out_an_unreachable_api(cluster, tmp_path, accel_home):
    """The teardown task's delete meets the API down (a control-plane upgrade, a network
    blip): it tries again until the API answers, then the Job and its pods are gone. Before,
    the first refused connection failed the task and the Job ran on until the janitor."""
    from accelmatrix import lifecycle
    from accelmatrix_testkit.cells import bare_cell
    from accelmatrix_testkit.log_capture import logged

    spec = machine(cluster)
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "outage=1"))
    h = b.submit(r, py("import time; print('up', flush=True); time.sleep(60)"), {})
    while not b.read_logs(h, 0)[0]:
        time.sleep(0.05)
    cell = bare_cell("outage=1", spec, "gpu")
    ref = lifecycle.RunRef(dag_id="k8s_tests", run_id="manual__2026-01-01T00:00:00+00:00")
    cluster.emulator.take_down()
    up = threading.Timer(6, cluster.emulator.bring_up)
    up.start()
    t = time.monotonic()
    try:
        with pytest.raises(Exception) as bare:  # one try, as the teardown task made before
            b.teardown(r)
        assert b.unreachable(bare.value), repr(bare.value)
        with logged() as warned:
            lifecycle.teardown(cell, r, ref)
        assert time.monotonic() - t >= 5  # it waited for the API
    finally:
        up.join()
    out = "\n".join(warned)
    assert "could not reach the API to delete" in out
    assert r.name not in state(cluster)["jobs"]
    assert not [p for p in state(cluster)["pods"] if r.job_name in p]
    # An answer is not an outage: a 403 fails at once.
    from kubernetes.client.exceptions import ApiException

    assert not b.unreachable(ApiException(status=403, reason="Forbidden"))
    assert b.unreachable(ApiException(status=503, reason="Service Unavailable"))


def test_teardown_removes_orphaned_pods(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "orphan=1"))
    h = b.submit(r, py("import time; print('up', flush=True); time.sleep(60)"), {})
    while not b.read_logs(h, 0)[0]:
        time.sleep(0.05)
    clients = k8s_hook.get_clients(CONN_ID)
    clients.batch.delete_namespaced_job(r.job_name, NS)  # API default for Jobs: orphan
    assert [p for p in state(cluster)["pods"] if r.job_name in p]
    b.teardown(r)
    assert not [p for p in state(cluster)["pods"] if r.job_name in p]


def test_cancel_saves_the_log_and_stops_the_pod(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "cancel=1"))
    h = b.submit(r, py("import time; print('tick', flush=True); time.sleep(60)"), {})
    while not b.read_logs(h, 0)[0]:
        time.sleep(0.05)
    b.cancel(h)
    assert (Path(r.artifacts_dir) / "output.log").read_text() == "tick\n"
    assert not [p for p in state(cluster)["pods"] if r.job_name in p]
    b.cancel(h)  # idempotent


def test_list_managed_sees_only_managed_jobs(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "janitor=1"))
    b.submit(r, py("import time; time.sleep(30)"), {})
    clients = k8s_hook.get_clients(CONN_ID)
    planted = {
        "metadata": {"name": "someone-elses-job", "labels": {"team": "infra"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "fault/unschedulable"}],
                }
            }
        },
    }
    clients.batch.create_namespaced_job(NS, planted)
    names = {m.name for m in b.list_managed()}
    assert r.name in names and f"{NS}/someone-elses-job" not in names
    managed = next(m for m in b.list_managed() if m.name == r.name)
    assert managed.labels["cell"] == "janitor_1" and managed.created_at
    assert managed.detail.annotations["accelmatrix.io/cell-id"] == "janitor=1"
    b.teardown(r)
    assert r.name not in {m.name for m in b.list_managed()}
    clients.batch.delete_namespaced_job("someone-elses-job", NS, propagation_policy="Background")


def test_setup_job_runs_commands_in_order_and_reports_failures(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "setup=1"))
    lines: list[str] = []
    b.setup(
        r,
        [py("open('data.txt', 'w').write('prepared')"), py("print(open('data.txt').read())")],
        {},
        30,
        lines.append,
    )
    assert "[setup-1] prepared" in lines
    assert r.setup_job_name not in str(state(cluster)["jobs"])  # deleted after success
    # What setup wrote under the work dir (the PVC) is there for the run.
    h = b.submit(r, py("print(open('data.txt').read())"), {})
    assert wait(b, h).exit_code == 0
    assert (Path(r.artifacts_dir) / "output.log").read_text() == "prepared\n"
    b.teardown(r)

    r = b.provision(ctx(tmp_path, "setup=2"))
    with pytest.raises(SetupFailed, match=r"setup\[1\].*exited with 4[\s\S]*broken dep"):
        b.setup(
            r,
            [py("print('ok')"), py("print('broken dep'); raise SystemExit(4)"), py("print(1)")],
            {},
            30,
            lambda _: None,
        )
    bad = backend(cluster, image="fault/bad-image")
    r = bad.provision(ctx(tmp_path, "setup=3"))
    with pytest.raises(InfrastructureError, match="cannot pull image 'fault/bad-image'"):
        bad.setup(r, [["true"]], {}, 30, lambda _: None)
    assert r.setup_job_name not in str(state(cluster)["jobs"])


def test_a_setup_job_left_by_a_killed_attempt_is_replaced(cluster, tmp_path):
    """The task running setup was SIGKILLed; its setup Job hangs on. The retry must not wait
    on it (it may be what hung): it deletes it and runs setup afresh."""
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "setup=killed"))
    name = r.setup_job_name
    hung = b.manifest.job_body(
        r,
        name,
        "setup",
        [b.manifest.container("setup-0", py("import time; time.sleep(600)"), {})],
        [],
    )
    b.clients(r).batch.create_namespaced_job(r.namespace, hung)
    lines: list[str] = []
    started = time.monotonic()
    b.setup(r, [py("print('fresh setup')")], {}, 60, lines.append)
    assert time.monotonic() - started < 45
    assert any("left by an earlier attempt" in line for line in lines), lines
    assert "[setup-0] fresh setup" in lines
    assert name not in str(state(cluster)["jobs"])
    b.teardown(r)


def test_collect_copies_globs_from_the_volume(cluster, tmp_path):
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "collect=1"))
    code = "import os; os.makedirs('out', exist_ok=True); open('out/m.json', 'w').write('{}')"
    h = b.submit(r, py(code), {})
    wait(b, h)
    dest = Path(r.artifacts_dir) / "files"
    assert b.collect(r, ["out/**"], dest) == ["out/m.json"]
    assert (dest / "out" / "m.json").read_text() == "{}"
    b.teardown(r)


def test_workload_trigger_streams_a_k8s_cell(cluster, tmp_path):
    from accelmatrix.steps.run.trigger import WorkloadTrigger

    spec = machine(cluster)
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "trigger=1"))
    h = b.submit(r, py("print('a'); print('b'); raise SystemExit(3)"), {})
    trigger = WorkloadTrigger(
        machine_spec=spec, handle=h, deadline=time.time() + 30, poll_interval=0.1
    )

    async def first_event():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "exited" and payload["exit_code"] == 3
    assert payload["log_offset"] == len("a\nb\n")
    b.teardown(r)


def test_kubectl_sees_what_the_backend_made(cluster, tmp_path, needs_kubectl):
    kubectl = needs_kubectl
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "kubectl=1"))
    b.submit(r, py("import time; time.sleep(20)"), {})
    config = cluster.emulator.write_kubeconfig(tmp_path / "kubeconfig", NS)
    out = subprocess.run(  # noqa: S603
        [
            kubectl,
            "--kubeconfig",
            str(config),
            "get",
            "jobs",
            "-l",
            "managed-by=accelmatrix",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert r.job_name in [j["metadata"]["name"] for j in json.loads(out)["items"]]
    b.teardown(r)


def test_machine_spec_validation_errors_are_clear():
    base = {"backend": "k8s-job", "image": "python:3.11"}
    with pytest.raises(ValidationError, match="Airflow connection named by kubernetes_conn_id"):
        KubernetesJobMachine.model_validate({**base, "token": "abc"})
    with pytest.raises(ValidationError, match="either gpus .* or mig_profile"):
        KubernetesJobMachine.model_validate({**base, "gpus": 1, "mig_profile": "1g.10gb"})
    with pytest.raises(ValidationError, match="also set gpus or mig_profile"):
        KubernetesJobMachine.model_validate({**base, "accelerator": "nvidia-l4"})
    with pytest.raises(ValidationError, match="mig_profile"):
        KubernetesJobMachine.model_validate({**base, "mig_profile": "mig-1g.10gb"})
    with pytest.raises(ValidationError, match="gpu_count"):
        KubernetesJobMachine.model_validate({**base, "gpu_count": 1})
    with pytest.raises(ValidationError, match="image"):
        KubernetesJobMachine.model_validate({"backend": "k8s-job"})
    m = KubernetesJobMachine.model_validate(
        {**base, "cpu": 4, "gpus": 1, "accelerator": "nvidia-l4"}
    )
    assert m.cpu == "4" and m.resources.gpus == 1 and m.resources.gpu_type == "nvidia-l4"
    assert m.kubernetes_conn_id == "kubernetes_default" and m.scheduling_timeout_seconds == 600


def test_suite_accepts_a_k8s_machine(tmp_path):
    from accelmatrix.backends.machine_kinds import KINDS
    from accelmatrix.spec.suite import Suite

    suite = Suite.model_validate(
        {
            "axes": {"model": ["a"]},
            "machines": {"l4": {"backend": "k8s-job", "image": "x", "gpus": 1}},
            "workload": {"run": ["python", "train.py"]},
        }
    )
    assert suite.machines["l4"].backend == "k8s-job" and "k8s-job" in KINDS


def test_a_pod_the_cluster_stops_is_infrastructure_not_its_exit_code(cluster, tmp_path):
    """Preemption: DisruptionTarget, SIGTERM, exit 143. Judged by the condition, not the code."""
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "preempted=1"))
    h = b.submit(r, py("import time; print('up', flush=True); time.sleep(300)"), {})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not b.read_logs(h, 0)[0]:
        time.sleep(0.05)
    (pod,) = [k.split("/", 1)[1] for k in state(cluster)["pods"] if r.job_name in k]
    cluster.kubelet.disrupt(NS, pod)
    st = wait(b, h)
    assert st.infrastructure_failure and st.exit_code is None, st
    assert "PreemptionByScheduler" in st.detail and pod in st.detail
    terminated = state(cluster)["pods"][f"{NS}/{pod}"]["status"]["containerStatuses"][0]
    assert terminated["state"]["terminated"]["exitCode"] == 143  # what an exit-code reading sees
    b.teardown(r)


def test_a_container_stuck_in_container_creating_times_out(cluster, tmp_path):
    b = backend(cluster, image="fault/stuck-creating", container_creating_timeout_seconds=1)
    r = b.provision(ctx(tmp_path, "stuck=1"))
    h = b.submit(r, py("print('never')"), {})
    st = wait(b, h)
    assert st.infrastructure_failure and "ContainerCreating" in st.detail, st
    b.teardown(r)
    assert not [k for k in state(cluster)["pods"] if r.job_name in k]


@pytest.mark.slow(30)
def test_a_25_mib_log_streams_and_is_collected_whole(cluster, tmp_path):
    """The kubelet rotates the log at 10 MiB and `pods/log` serves the current file only: the
    live log and output.log still hold every line once, in order (k8s_logs follows it)."""
    n, width = 262_144, 100  # 25 MiB
    b = backend(cluster)
    r = b.provision(ctx(tmp_path, "log=25mib"))
    code = (
        "import sys\nw = sys.stdout.write\npad = 'x' * 90\n"
        f"for i in range({n}): w(f'{{i:08d}} {{pad}}\\n')\n"
    )
    h = b.submit(r, py(code), {})
    seen, offset = 0, 0
    while True:  # what the trigger does: read the new lines, poll, about once a second
        lines, offset = b.read_logs(h, offset)
        for line in lines:
            assert line[:8] == f"{seen:08d}", (line[:20], seen)
            seen += 1
        st = b.poll(h)
        if st.done:
            break
        time.sleep(0.5)
    # The job is done; the follower may still be spooling the last file (a loaded host lags
    # seconds behind a 25 MiB burst): read on, as collect's settle waits, up to 30 s.
    deadline = time.monotonic() + 30
    while True:
        lines, offset = b.read_logs(h, offset)
        for line in lines:
            assert line[:8] == f"{seen:08d}", (line[:20], seen)
            seen += 1
        if seen >= n or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st.exit_code == 0 and seen == n and offset == n * width, (st, seen, offset)
    (pod,) = [k.split("/", 1)[1] for k in state(cluster)["pods"] if r.job_name in k]
    log = cluster.emulator.container_logs[(NS, pod, CONTAINER)]
    assert log.rotations >= 2  # 25 MiB of output (more in CRI lines) in 10 MiB files
    current = b.clients(r).core.read_namespaced_pod_log(pod, NS, _preload_content=False).data
    first, last = current.splitlines()[0], current.splitlines()[-1]  # the last file only
    assert len(current) < 10 * 1024 * 1024 and int(first[:8]) > 0 and int(last[:8]) == n - 1
    b.collect(r, [], tmp_path / "dest")
    out = Path(r.artifacts_dir) / "output.log"
    assert out.stat().st_size == n * width
    with open(out, "rb") as f:
        for i, line in enumerate(f):
            assert line[:8] == b"%08d" % i
    assert i == n - 1
    b.teardown(r)
