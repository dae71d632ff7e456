"""The `gke-tpu` machine: XPK's JobSet shape for a TPU request, validation, and a run.

The manifest assertions are the facts XPK's own template has for `--tpu-type v5litepod-16
--num-slices 2` (replicated job `slice-job`, one replica per slice, 4 VMs of 4 chips, the
GKE TPU node selectors, `google.com/tpu`, host network, one node pool per slice); the run
goes through the emulator's JobSet controller, one local process per TPU VM.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml
from backend_of import backend_of

from accelmatrix.backends.base import CellContext
from accelmatrix.backends.machines.gke_tpu import GkeTpuMachine
from accelmatrix.hooks import k8s as k8s_hook
from accelmatrix.spec.loader import SuiteError, load_suite
from accelmatrix_testkit.k8s_emulator import Cluster

CONN_ID = "accelmatrix_test_gke_tpu"


def machine(**kw) -> dict:
    spec = {
        "backend": "gke-tpu",
        "kubernetes_conn_id": CONN_ID,
        "image": "us-docker.pkg.dev/acme/maxtext:1",
        "accelerator_type": "v5litepod-16",
        "topology": "4x4",
        "num_slices": 2,
        "python": sys.executable,
        **kw,
    }
    return GkeTpuMachine.model_validate(spec).model_dump(mode="json")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("k8s")
    with Cluster(root, ("default",)) as c:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in c.emulator.airflow_conn_env(CONN_ID).items():
                mp.setenv(key, value)
            k8s_hook.forget()
            yield c
            k8s_hook.forget()


def test_the_jobset_is_the_one_xpk_makes_for_the_same_request(cluster, tmp_path):
    from accelmatrix.backends.kubernetes.gke_tpu import GkeTpuBackend

    b = backend_of(GkeTpuBackend, machine(kueue={"queue_name": "multislice-queue"}))
    r = b.provision(CellContext("tpu", "r", "model=llama", tmp_path / "a"))
    body = b.workload_jobset(r, ["python", "train.py"], {})
    name = r.job_name
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "multislice-queue"
    assert (
        body["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"]
        == "cloud.google.com/gke-nodepool"
    )
    (rj,) = body["spec"]["replicatedJobs"]
    assert rj["name"] == "slice-job" and rj["replicas"] == 2
    job = rj["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4 and job["backoffLimit"] == 0
    (exit_rule,) = [r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert {42, 137, 143, 255} <= set(exit_rule["onExitCodes"]["values"])  # XPK's restarts
    assert 1 not in exit_rule["onExitCodes"]["values"]
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4"
    assert {8471, 8080} <= {p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e for e in c["env"]}
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == f"{name}-slice-job-0-0.{name}"
    assert "job-index" in env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["JAX_NUM_PROCESSES"]["value"] == "8"
    assert "CUDA_VISIBLE_DEVICES" not in env and "nvidia.com/gpu" not in str(pod)
    assert len(f"{name}-slice-job-1-3") <= 63
    assert b.machine.resources.chips == 32 and b.machine.resources.gpus is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"topology": "2x4"}, "topology 2x4 is 8 chips = 8 TensorCores"),
        ({"accelerator_type": "v9x-16"}, "v4, v5p, v5litepod, v6e"),
        ({"topology": "4by4"}, "expected AxB or AxBxC"),
        ({"gpus": 1}, "gpus: a gke-tpu machine derives"),
    ],
)
def test_bad_tpu_machines_get_one_clear_error(tmp_path, change, needle):
    spec = {
        "backend": "gke-tpu",
        "image": "x",
        "accelerator_type": "v5litepod-16",
        "topology": "4x4",
        **change,
    }
    suite = {
        "description": "d",
        "machines": {"tpu": spec},
        "machine": "tpu",
        "workload": {"run": ["python", "-c", "pass"]},
    }
    path = tmp_path / "bad_tpu.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    text = str(e.value) + "\n".join(e.value.problems)
    assert str(path) in text and "machines.tpu" in text and needle in text, text


def test_two_single_vm_slices_run_with_their_slice_ids(cluster, tmp_path):
    from accelmatrix.backends.kubernetes.gke_tpu import GkeTpuBackend

    b = backend_of(GkeTpuBackend, machine(accelerator_type="v5litepod-4", topology="2x2"))
    r = b.provision(CellContext("tpu", "r", "model=tiny", tmp_path / "a"))
    code = (
        "import os; print('slice', os.environ['MEGASCALE_SLICE_ID'], 'of',"
        " os.environ['MEGASCALE_NUM_SLICES'], 'coordinator',"
        " os.environ['MEGASCALE_COORDINATOR_ADDRESS'], flush=True)"
    )
    h = b.submit(r, [sys.executable, "-c", code], {})
    deadline = time.monotonic() + 30
    while not (st := b.poll(h)).done and time.monotonic() < deadline:
        time.sleep(0.1)
    assert st.exit_code == 0, st
    logs = sorted(p.read_text() for p in (Path(r.artifacts_dir) / "pods").iterdir())
    assert [line.split()[:4] for line in logs] == [
        ["slice", "0", "of", "2"],
        ["slice", "1", "of", "2"],
    ]
    assert all("coordinator 127.0.0.1" in line for line in logs)  # the emulated DNS
    b.teardown(r)
    assert cluster.emulator.state()["pods"] == {} and cluster.jobsets.jobsets == {}
