"""The Kubernetes API emulator answers like a real API server where clients depend on it:
field selectors, watches, PATCH, create-time validation (accelmatrix_testkit.k8s_semantics).

Each test failed against the emulator before it modelled the behaviour (selectors were
ignored, a watch got a list, PATCH got the stdlib's HTML 501, invalid Jobs were accepted);
where the real kubectl can check it, kubectl does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import BackendError, CellContext
from accelmatrix_testkit.k8s_emulator import Cluster

NS = "default"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.usefixtures("needs_kubectl")  # the real kubectl (needs.py)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("k8s-api")
    with Cluster(root, (NS,)) as c:
        c.kubeconfig = c.emulator.write_kubeconfig(root / "kubeconfig")
        yield c


@pytest.fixture(scope="module")
def api(cluster):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(str(cluster.kubeconfig), client_configuration=cfg)
    api_client = client.ApiClient(cfg)
    return client.CoreV1Api(api_client), client.BatchV1Api(api_client)


def job(name: str, code: str, **pod_spec) -> dict:
    return {
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"test": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "img", "command": [sys.executable, "-c", code]}
                    ],
                    **pod_spec,
                },
            },
        },
    }


def kubectl(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    p = subprocess.run(  # noqa: S603 (argv list)
        [KUBECTL, "-n", NS, *args], env=env, capture_output=True, text=True, timeout=60
    )
    if check:
        assert p.returncode == 0, p.stderr
    return p


def until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError("not reached")


@pytest.fixture(scope="module")
def two_jobs(cluster, api):
    """`done-job` has completed; `slow-job` is running."""
    core, batch = api
    batch.create_namespaced_job(NS, job("done-job", "print('done')"))
    batch.create_namespaced_job(NS, job("slow-job", "import time; time.sleep(120)"))
    until(lambda: (batch.read_namespaced_job("done-job", NS).status.succeeded or 0) == 1)
    until(
        lambda: [
            p
            for p in core.list_namespaced_pod(NS, label_selector="test=slow-job").items
            if p.status.phase == "Running"
        ]
    )
    yield
    for name in ("done-job", "slow-job"):
        batch.delete_namespaced_job(name, NS, propagation_policy="Background")


def test_field_selectors_filter_pods_and_jobs(cluster, api, two_jobs):
    from kubernetes.client.exceptions import ApiException

    core, batch = api
    running = core.list_namespaced_pod(NS, field_selector="status.phase=Running").items
    assert [p.metadata.labels["test"] for p in running] == ["slow-job"]
    done = core.list_namespaced_pod(NS, field_selector="status.phase!=Running").items
    assert [p.metadata.labels["test"] for p in done] == ["done-job"]
    name = running[0].metadata.name
    assert [p.metadata.name for p in core.list_namespaced_pod(NS, field_selector=f"metadata.name={name}").items] == [name]  # fmt: skip
    by_name = batch.list_namespaced_job(NS, field_selector="metadata.name=slow-job").items
    assert [j.metadata.name for j in by_name] == ["slow-job"]
    succeeded = batch.list_namespaced_job(NS, field_selector="status.successful=1").items
    assert [j.metadata.name for j in succeeded] == ["done-job"]
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod(NS, field_selector="spec.containers=main")
    assert e.value.status == 400
    assert json.loads(e.value.body)["message"] == 'field label not supported: "spec.containers"'


@needs_kubectl
def test_kubectl_wait_and_field_selectors_pick_the_named_job(cluster, two_jobs):
    assert kubectl(cluster, "wait", "--for=condition=complete", "job/done-job", "--timeout=20s")
    slow = kubectl(
        cluster, "wait", "--for=condition=complete", "job/slow-job", "--timeout=2s", check=False
    )
    assert slow.returncode != 0 and "timed out" in slow.stderr, (slow.stdout, slow.stderr)
    out = kubectl(
        cluster, "get", "pods", "--field-selector", "status.phase=Running", "-o", "name"
    ).stdout.split()
    assert len(out) == 1 and "slow-job" in out[0]


def test_a_watch_streams_added_modified_deleted(cluster, api):
    from kubernetes import watch

    core, batch = api
    go = Path(cluster.root) / "watch-go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    batch.create_namespaced_job(NS, job("watched", code))
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for ev in w.stream(
        core.list_namespaced_pod, NS, label_selector="test=watched", timeout_seconds=30
    ):
        seen.append((ev["type"], ev["object"].status.phase))
        if ev["object"].status.phase == "Running":
            go.touch()
        if ev["object"].status.phase == "Succeeded" and ("DELETING", "") not in seen:
            seen.append(("DELETING", ""))
            batch.delete_namespaced_job("watched", NS, propagation_policy="Background")
        if ev["type"] == "DELETED":
            w.stop()
    assert seen[0][0] == "ADDED"
    assert ("MODIFIED", "Succeeded") in seen and seen[-1][0] == "DELETED", seen
    # The watch of jobs filters by field too (kubectl's list-then-watch of one object).
    events = list(
        watch.Watch().stream(
            batch.list_namespaced_job,
            NS,
            field_selector="metadata.name=watched-not-there",
            timeout_seconds=1,
        )
    )
    assert events == []


@needs_kubectl
def test_patch_label_annotate_and_immutable_fields(cluster, api, two_jobs):
    core, batch = api
    pod = kubectl(cluster, "get", "pods", "-l", "test=slow-job", "-o", "name").stdout.strip()
    kubectl(cluster, "label", pod, "owner=ml-infra")
    kubectl(cluster, "annotate", "job/slow-job", "note=patched")
    kubectl(cluster, "patch", "job/slow-job", "--type=merge", "-p", '{"spec":{"parallelism":1}}')
    kubectl(
        cluster, "patch", "job/slow-job", "--type=json",
        "-p", '[{"op":"add","path":"/metadata/labels/tier","value":"nightly"}]',
    )  # fmt: skip
    j = batch.read_namespaced_job("slow-job", NS)
    assert j.metadata.annotations["note"] == "patched" and j.metadata.labels["tier"] == "nightly"
    p = core.read_namespaced_pod(pod.split("/", 1)[1], NS)
    assert p.metadata.labels["owner"] == "ml-infra" and p.status.phase == "Running"
    bad = kubectl(
        cluster, "patch", "job/slow-job", "--type=merge", "-p", '{"spec":{"completions":5}}',
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "field is immutable" in bad.stderr, bad.stderr
    bad = kubectl(
        cluster, "patch", pod, "--type=merge", "-p", '{"spec":{"restartPolicy":"Always"}}',
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "pod updates may not change fields" in bad.stderr


def test_put_and_unknown_patch_types_answer_a_json_status(cluster, api, two_jobs):
    url = f"{cluster.emulator.url}/apis/batch/v1/namespaces/{NS}/jobs/slow-job"
    for method, ctype, code in (
        ("PUT", "application/json", 405),
        ("PATCH", "text/plain", 415),
    ):
        req = urllib.request.Request(  # noqa: S310 (loopback emulator)
            url, data=b"{}", method=method, headers={"Content-Type": ctype}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)  # noqa: S310
        assert e.value.code == code
        assert e.value.headers["Content-Type"] == "application/json"
        body = json.loads(e.value.read())
        assert body["kind"] == "Status" and body["code"] == code


def test_invalid_jobs_are_refused_with_422_and_causes(cluster, api):
    from kubernetes.client.exceptions import ApiException

    _, batch = api
    body = job("invalid", "pass", activeDeadlineSeconds=0)
    body["spec"]["ttlSecondsAfterFinished"] = -1
    main = body["spec"]["template"]["spec"]["containers"][0]
    main["env"] = [{"name": "1BAD", "value": "x"}, {"name": "GOOD_NAME", "value": "y"}]
    main["resources"] = {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "1"}}
    with pytest.raises(ApiException) as e:
        batch.create_namespaced_job(NS, body)
    assert e.value.status == 422
    status = json.loads(e.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert status["message"].startswith('Job.batch "invalid" is invalid: [')
    fields = [c["field"] for c in status["details"]["causes"]]
    assert fields == [
        "spec.ttlSecondsAfterFinished",
        "spec.template.spec.activeDeadlineSeconds",
        "spec.template.spec.containers[0].env[0].name",
        "spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]",
    ]
    assert "invalid" not in [j.metadata.name for j in batch.list_namespaced_job(NS).items]
    # A request without a limit is refused too; equal request and limit are fine.
    main["env"] = []
    body["spec"].pop("ttlSecondsAfterFinished")
    body["spec"]["template"]["spec"].pop("activeDeadlineSeconds")
    main["resources"] = {"requests": {"google.com/tpu": "4"}}
    with pytest.raises(ApiException) as e:
        batch.create_namespaced_job(NS, body)
    assert (
        "Limit must be set for non overcommitable resources" in json.loads(e.value.body)["message"]
    )
    main["resources"] = {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}
    body["metadata"]["name"] = "valid"
    batch.create_namespaced_job(NS, body)
    batch.delete_namespaced_job("valid", NS, propagation_policy="Background")


def test_the_backend_names_a_refused_env_var_and_its_gpu_pods_are_valid(cluster, tmp_path):
    from accelmatrix.backends.kubernetes.job import KubernetesJobBackend
    from accelmatrix.backends.machines.k8s_job import KubernetesJobMachine
    from accelmatrix.hooks import k8s as k8s_hook

    env = cluster.emulator.airflow_conn_env("accelmatrix_api_semantics", NS)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        k8s_hook.forget()
        spec = {
            "backend": "k8s-job",
            "kubernetes_conn_id": "accelmatrix_api_semantics",
            "image": "python:3.11-slim",
            "python": sys.executable,
            "gpus": 2,
        }
        b = backend_of(
            KubernetesJobBackend, KubernetesJobMachine.model_validate(spec).model_dump(mode="json")
        )
        ctx = CellContext("api_tests", "manual__1", "env=bad", tmp_path / "c")
        r = b.provision(ctx)
        with pytest.raises(BackendError, match=r"env\[\d+\]\.name.*1BAD"):
            b.submit(r, [sys.executable, "-c", "pass"], {"1BAD": "x"})
        h = b.submit(r, [sys.executable, "-c", "print('gpu pod ok')"], {"GOOD": "1"})
        deadline = time.monotonic() + 30
        while not (st := b.poll(h)).done and time.monotonic() < deadline:
            time.sleep(0.1)
        assert st.exit_code == 0, st
        b.teardown(r)
        k8s_hook.forget()
