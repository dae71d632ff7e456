"""TpuVmHook and TpuVmBackend (provisioning) through the REAL gcloud CLI against the emulator.

Every gcloud run costs 1-2 s of CPU start-up, so each test makes few calls; the emulator log
(``emu.requests``) is what the assertions read, to see what actually reached "the API".
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from accelmatrix.backends.base import InfrastructureError
from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.tpu_vm.backend import TpuVmBackend
from accelmatrix.hooks.tpu import (
    TpuAlreadyExists,
    TpuNotFound,
    TpuQuotaExceeded,
    TpuStockout,
    TpuVmHook,
    dict_flag,
    parse_gcloud_error,
    queued_resource_state,
)
from accelmatrix_testkit.tpu_emulator import TpuEmulator

ZONE = "us-central2-b"
Z = f"/v2/projects/p/locations/{ZONE}"

needs_gcloud = pytest.mark.usefixtures("needs_gcloud")  # the real gcloud (needs.py)


@pytest.fixture(scope="module")
def emulator():
    with TpuEmulator(op_delay=0.0, qr_wait=0.3, qr_provision=0.3) as emu:
        yield emu


@pytest.fixture(scope="module")
def gcloud_env(emulator, tmp_path_factory):
    return emulator.gcloud_env(tmp_path_factory.mktemp("gcloud-config"))


@pytest.fixture
def emu(emulator):
    emulator.reset()
    emulator.op_delay = 0.0
    yield emulator
    emulator.reset()


@pytest.fixture
def hook(gcloud_env, emu):
    return TpuVmHook(env=gcloud_env, timeout=60)


def posts(emu: TpuEmulator, coll: str) -> list[dict]:
    return emu.requests("POST", f"/{coll}")


# -- hook: pure parsing (no gcloud) -------------------------------------------------------------
def test_parse_gcloud_errors():
    e = parse_gcloud_error(
        "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource 'x' was not found. "
        "This command is authenticated with an access token from /t specified by the ..."
    )
    assert isinstance(e, TpuNotFound) and e.status == "NOT_FOUND"
    assert e.command == "gcloud.compute.tpus.tpu-vm.describe"
    assert "authenticated" not in str(e)
    op_err = (
        "Waiting for operation [x] to complete...failed.\n"
        "ERROR: (gcloud.compute.tpus.tpu-vm.create) {\n"
        '  "code": 8,\n  "message": "There is no more capacity in the zone"\n}\n'
    )
    e = parse_gcloud_error(op_err)
    assert isinstance(e, TpuStockout) and isinstance(e, InfrastructureError)
    assert e.status == "RESOURCE_EXHAUSTED"
    e = parse_gcloud_error(
        "ERROR: (gcloud.compute.tpus.tpu-vm.create) RESOURCE_EXHAUSTED: Quota limit 'X' has "
        "been exceeded.\n- '@type': type.googleapis.com/google.rpc.QuotaFailure\n"
    )
    assert isinstance(e, TpuQuotaExceeded) and str(e).startswith("RESOURCE_EXHAUSTED: Quota")
    assert type(parse_gcloud_error("ERROR: (gcloud.x) ALREADY_EXISTS: y")) is TpuAlreadyExists
    assert type(parse_gcloud_error("something odd")).__name__ == "TpuError"


def test_dict_flag_escaping_and_input_checks(hook):
    assert dict_flag("--labels", {"a": "b", "c": "d"}) == "--labels=a=b,c=d"
    assert dict_flag("--metadata", {"k": "x,y"}) == "--metadata=^|^k=x,y"
    with pytest.raises(ValueError):
        dict_flag("--metadata", {"a=b": "c"})
    # Invalid names/labels never reach gcloud (and cannot smuggle in a flag).
    with pytest.raises(ValueError):
        hook.describe_node("--zone=evil", ZONE)
    with pytest.raises(ValueError):
        hook.create_node("n", ZONE, "v4-8", "rt", labels={"Bad": "x"})
    with pytest.raises(ValueError):
        hook.create_node("n", ZONE, "v4-8", "rt", spot=True, reserved=True)
    assert hook.calls == []


def test_credentials_mode(monkeypatch):
    monkeypatch.delenv("ACCELMATRIX_GCLOUD_AUTH", raising=False)
    assert TpuVmHook().uses_airflow_connection  # production: the Airflow connection
    assert not TpuVmHook(env={"CLOUDSDK_CONFIG": "/x"}).uses_airflow_connection
    monkeypatch.setenv("ACCELMATRIX_GCLOUD_AUTH", "env")
    assert not TpuVmHook().uses_airflow_connection


# -- hook through gcloud --------------------------------------------------------------------------
@needs_gcloud
def test_node_lifecycle_labels_spot_metadata(hook, emu):
    emu.op_delay = 0.2  # one real CREATING -> READY wait inside gcloud
    labels = {"managed-by": "accelmatrix", "dag": "tpu_smoke", "ttl": "1900000000"}
    ssh = "alice:ssh-ed25519 AAAAC3Nza alice@host,with,commas"
    node = hook.create_node(
        "n1",
        ZONE,
        "v4-16",
        "tpu-ubuntu2204-base",
        labels=labels,
        spot=True,
        metadata={"ssh-keys": ssh, "startup-script": "echo a=b"},
    )
    assert node["state"] == "READY" and len(node["networkEndpoints"]) == 2
    (req,) = posts(emu, "nodes")
    assert req["query"]["nodeId"] == "n1"
    body = req["body"]
    assert body["schedulingConfig"] == {"preemptible": False, "reserved": False, "spot": True}
    assert body["labels"] == labels
    assert body["metadata"] == {"ssh-keys": ssh, "startup-script": "echo a=b"}
    assert body["acceleratorType"] == "v4-16" and body["runtimeVersion"] == "tpu-ubuntu2204-base"

    emu.plant_node("other", ZONE, labels={"managed-by": "someone-else"})
    emu.plant_node("bare", ZONE)
    got = hook.describe_node("n1", ZONE)
    assert got["labels"] == labels and got["state"] == "READY"
    listed = hook.list_nodes(ZONE, labels={"managed-by": "accelmatrix"})
    assert [n["name"].rsplit("/", 1)[1] for n in listed] == ["n1"]

    assert hook.delete_node("n1", ZONE) is True
    assert emu.node("n1") is None
    assert hook.delete_node("n1", ZONE) is False  # not found is tolerated
    assert [c["returncode"] for c in hook.calls] == [0, 0, 0, 0, 1]


@needs_gcloud
def test_typed_errors_quota_stockout_exists(hook, emu):
    emu.plant_node("taken", ZONE)
    with pytest.raises(TpuAlreadyExists):
        hook.create_node("taken", ZONE, "v4-8", "rt", reserved=True)
    emu.quota_exceeded()
    with pytest.raises(TpuQuotaExceeded) as qe:
        hook.create_node("n2", ZONE, "v4-8", "rt", preemptible=True)
    assert isinstance(qe.value, InfrastructureError) and "Quota" in str(qe.value)
    assert emu.node("n2") is None
    emu.clear_faults()
    emu.stockout()  # the create operation fails; gcloud prints the operation's error JSON
    with pytest.raises(TpuStockout, match="no more capacity") as so:
        hook.create_node("n3", ZONE, "v4-8", "rt")
    assert isinstance(so.value, InfrastructureError) and so.value.status == "RESOURCE_EXHAUSTED"
    assert [r["body"]["schedulingConfig"] for r in posts(emu, "nodes")][:2] == [
        {"preemptible": False, "reserved": True, "spot": False},
        {"preemptible": True, "reserved": False, "spot": False},
    ]


@needs_gcloud
def test_queued_resource_lifecycle(hook, emu):
    qr = hook.create_queued_resource(
        "q1",
        ZONE,
        "v5litepod-16",
        "v2-alpha-tpuv5-lite",
        labels={"managed-by": "accelmatrix"},
        spot=True,
        valid_until_duration=600,
    )
    assert queued_resource_state(qr) == "WAITING_FOR_RESOURCES"
    (req,) = posts(emu, "queuedResources")
    assert req["query"]["queuedResourceId"] == "q1"
    assert req["body"]["spot"] == {}
    assert req["body"]["queueingPolicy"] == {"validUntilDuration": "600s"}
    spec = req["body"]["tpu"]["nodeSpec"][0]
    assert spec["nodeId"] == "q1" and spec["node"]["labels"] == {"managed-by": "accelmatrix"}
    # describe, list and delete --force run in the backend tests below (gcloud is slow).


# -- machine model ------------------------------------------------------------------------------
SPEC = {
    "backend": "tpu-vm",
    "zone": ZONE,
    "accelerator_type": "v4-8",
    "runtime_version": "tpu-ubuntu2204-base",
}


def test_machine_model():
    m = TpuVmMachine.model_validate(SPEC)
    assert m.capacity == "on-demand" and m.gcp_conn_id == "google_cloud_default"
    assert m.valid_until_seconds is None
    q = TpuVmMachine.model_validate({**SPEC, "capacity": "queued"})
    assert q.valid_until_seconds == 3600
    for bad in (
        {"zone": "us central"},
        {"accelerator_type": "tpu-8"},
        {"capacity": "cheap"},
        {"valid_until_seconds": 60},  # only with capacity: queued
        {"colour": "red"},  # extra="forbid"
        {"metadata": {"a=b": "c"}},
    ):
        with pytest.raises(ValidationError):
            TpuVmMachine.model_validate({**SPEC, **bad})
    dumped = TpuVmMachine.model_validate({**SPEC, "resources": {"chips": 4}}).model_dump(
        mode="json"
    )
    assert TpuVmMachine.model_validate(dumped).resources.chips == 4


def test_registered_through_get_backend():
    assert isinstance(get_backend(SPEC), TpuVmBackend)
