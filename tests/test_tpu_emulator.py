"""The Cloud TPU v2 API emulator over plain HTTP (no gcloud: fast).

What gcloud itself sends and accepts is covered in test_tpu_hook.py; these tests pin the
emulator's own behaviour: JSON shapes, state machines, faults, control endpoints.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from accelmatrix_testkit.tpu_emulator import TpuEmulator, workers_for

P = "/v2/projects/p/locations/us-central2-b"


def call(emu: TpuEmulator, method: str, path: str, body: Any = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(emu.url.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(fn, timeout: float = 5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.02)
    raise AssertionError("condition not reached")


NODE = {
    "acceleratorType": "v4-16",
    "runtimeVersion": "tpu-ubuntu2204-base",
    "labels": {"managed-by": "accelmatrix"},
    "schedulingConfig": {"spot": True},
    "metadata": {"ssh-keys": "u:ssh-ed25519 AAAA u"},
}


@pytest.fixture
def emu():
    with TpuEmulator(op_delay=0.15, qr_wait=0.1, qr_provision=0.1, page_size=2) as e:
        yield e


def test_node_create_operation_and_ready(emu):
    status, op = call(emu, "POST", f"{P}/nodes?nodeId=n1", NODE)
    assert status == 200 and op["done"] is False
    assert op["name"].startswith("projects/p/locations/us-central2-b/operations/operation-")
    assert op["metadata"]["verb"] == "create"
    assert call(emu, "GET", f"{P}/nodes/n1")[1]["state"] == "CREATING"
    done = wait_for(lambda: (o := call(emu, "GET", f"/v2/{op['name']}")[1])["done"] and o)
    node = done["response"]
    assert node["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert node["state"] == "READY" and node["apiVersion"] == "V2"
    assert node["schedulingConfig"]["spot"] is True
    assert node["labels"] == {"managed-by": "accelmatrix"}
    assert [ep["accessConfig"]["externalIp"] for ep in node["networkEndpoints"]] == [
        "127.0.0.1"
    ] * 2
    assert node["networkConfig"]["network"] == "projects/p/global/networks/default"
    status, got = call(emu, "GET", f"{P}/nodes/n1")
    assert got["state"] == "READY" and got["name"] == f"{P[4:]}/nodes/n1"
    status, err = call(emu, "POST", f"{P}/nodes?nodeId=n1", NODE)
    assert status == 409 and err["error"]["status"] == "ALREADY_EXISTS"
    assert [r["method"] for r in emu.requests(contains="/nodes")][:2] == ["POST", "GET"]


@pytest.mark.parametrize(
    "accel,workers",
    [("v2-8", 1), ("v3-32", 4), ("v4-8", 1), ("v4-16", 2), ("v5p-8", 1), ("v5litepod-8", 1)]
    + [("v5litepod-16", 4), ("v6e-1", 1), ("v6e-16", 4), ("v6e-256", 64), ("odd", 1)],
)
def test_workers_per_accelerator_type(accel, workers):
    assert workers_for(accel) == workers


def test_validation_and_unknown_paths(emu):
    for node_id in ("Bad", "a_b", "a-", "1a", "a" * 64):
        status, err = call(emu, "POST", f"{P}/nodes?nodeId={node_id}", NODE)
        assert status == 400 and err["error"]["status"] == "INVALID_ARGUMENT", node_id
    status, err = call(emu, "POST", f"{P}/nodes?nodeId=ok", {**NODE, "labels": {"A": "b"}})
    assert status == 400 and "label" in err["error"]["message"]
    status, err = call(emu, "POST", f"{P}/nodes?nodeId=ok", {"acceleratorType": "v4-8"})
    assert status == 400
    for path in ("/nope", "/v1/projects/p", f"{P}/widgets/x", f"{P}/nodes/n1:start"):
        status, err = call(emu, "GET", path)
        assert status == 404 and err["error"]["status"] == "NOT_FOUND", path
    assert call(emu, "GET", f"{P}/nodes/missing")[0] == 404
    assert call(emu, "DELETE", f"{P}/nodes/missing")[0] == 404
    assert emu.state["nodes"] == {}


def test_list_pagination_and_filter(emu):
    for i in range(3):
        emu.plant_node(f"n{i}", "us-central2-b", labels={"managed-by": "x" if i == 1 else "y"})
    emu.plant_node("elsewhere", "europe-west4-a")
    status, page1 = call(emu, "GET", f"{P}/nodes")
    assert [n["name"].rsplit("/", 1)[1] for n in page1["nodes"]] == ["n0", "n1"]
    status, page2 = call(emu, "GET", f"{P}/nodes?pageToken={page1['nextPageToken']}")
    assert [n["name"].rsplit("/", 1)[1] for n in page2["nodes"]] == ["n2"]
    assert "nextPageToken" not in page2
    status, filtered = call(emu, "GET", f"{P}/nodes?filter=labels.managed-by%3Dy")
    assert [n["name"].rsplit("/", 1)[1] for n in filtered["nodes"]] == ["n0", "n2"]


def test_quota_fault_via_control_endpoint(emu):
    status, faults = call(emu, "POST", "/_emulator/faults", {"quota_exceeded": True})
    assert status == 200 and faults["quota_exceeded"] is True
    status, err = call(emu, "POST", f"{P}/nodes?nodeId=n1", NODE)
    assert status == 429
    assert err["error"]["status"] == "RESOURCE_EXHAUSTED" and "Quota" in err["error"]["message"]
    types = [d["@type"] for d in err["error"]["details"]]
    assert "type.googleapis.com/google.rpc.QuotaFailure" in types
    assert emu.state["nodes"] == {}
    assert call(emu, "POST", "/_emulator/faults", {"no_such_fault": 1})[0] == 400
    call(emu, "POST", "/_emulator/reset", {})
    assert call(emu, "GET", "/_emulator/faults")[1]["quota_exceeded"] is False


@pytest.mark.parametrize("leaves_node", [False, True])
def test_stockout_fails_the_create_operation(emu, leaves_node):
    emu.stockout(leaves_node=leaves_node)
    _, op = call(emu, "POST", f"{P}/nodes?nodeId=n1", NODE)
    done = wait_for(lambda: (o := call(emu, "GET", f"/v2/{op['name']}")[1])["done"] and o)
    assert done["error"]["code"] == 8 and "no more capacity" in done["error"]["message"]
    assert "response" not in done
    node = emu.node("n1")
    assert (node or {}).get("state") == ("TERMINATED" if leaves_node else None)


def test_preempt_and_slow_delete(emu):
    emu.plant_node("n1", "us-central2-b")
    assert call(emu, "POST", "/_emulator/preempt", {"name": "n1"})[0] == 200
    assert emu.node("n1")["state"] == "PREEMPTED"
    emu.slow_delete(0.6)
    t0 = time.time()
    status, op = call(emu, "DELETE", f"{P}/nodes/n1")
    assert status == 200 and op["done"] is False
    assert call(emu, "GET", f"{P}/nodes/n1")[1]["state"] == "DELETING"
    wait_for(lambda: call(emu, "GET", f"{P}/nodes/n1")[0] == 404)
    assert time.time() - t0 >= 0.6
    assert call(emu, "GET", f"/v2/{op['name']}")[1]["done"] is True


QR = {
    "tpu": {
        "nodeSpec": [
            {
                "parent": "projects/p/locations/us-central2-b",
                "nodeId": "q1",
                "node": {"acceleratorType": "v4-8", "runtimeVersion": "rt", "labels": {"a": "b"}},
            }
        ]
    },
    "spot": {},
    "queueingPolicy": {"validUntilDuration": "0.4s"},
}


def test_queued_resource_lifecycle(emu):
    status, op = call(emu, "POST", f"{P}/queuedResources?queuedResourceId=q1", QR)
    assert status == 200 and op["done"] is True  # accepting is quick
    qr = op["response"]
    assert qr["state"]["state"] == "WAITING_FOR_RESOURCES"
    states = set()

    def active():
        s = call(emu, "GET", f"{P}/queuedResources/q1")[1]["state"]["state"]
        states.add(s)
        return s == "ACTIVE"

    wait_for(active)
    assert "PROVISIONING" in states
    node = call(emu, "GET", f"{P}/nodes/q1")[1]
    assert node["state"] == "READY" and node["queuedResource"].endswith("/queuedResources/q1")
    assert node["labels"] == {"a": "b"}
    emu.preempt("q1")
    assert call(emu, "GET", f"{P}/queuedResources/q1")[1]["state"]["state"] == "SUSPENDED"
    status, err = call(emu, "DELETE", f"{P}/queuedResources/q1")
    assert status == 400 and err["error"]["status"] == "FAILED_PRECONDITION"
    status, op = call(emu, "DELETE", f"{P}/queuedResources/q1?force=True")
    wait_for(lambda: call(emu, "GET", f"{P}/queuedResources/q1")[0] == 404)
    assert call(emu, "GET", f"{P}/nodes/q1")[0] == 404


def test_queued_resource_expires_under_stockout(emu):
    emu.stockout()
    call(emu, "POST", f"{P}/queuedResources?queuedResourceId=q1", QR)
    time.sleep(0.2)
    assert emu.state["queued_resources"][f"{P[4:]}/queuedResources/q1"]["state"]["state"] == (
        "WAITING_FOR_RESOURCES"
    )
    qr = wait_for(
        lambda: (
            (q := call(emu, "GET", f"{P}/queuedResources/q1")[1])["state"]["state"] == "FAILED"
            and q
        )
    )
    assert qr["state"]["failedData"]["error"]["message"]
    assert emu.state["nodes"] == {}


def test_state_endpoint_and_request_log(emu):
    call(emu, "GET", f"{P}/nodes")
    status, state = call(emu, "GET", "/_emulator/state")
    assert status == 200 and set(state) >= {"nodes", "queued_resources", "operations"}
    assert [(r["method"], r["path"]) for r in state["requests"]] == [("GET", f"{P}/nodes")]
    status, planted = call(
        emu, "POST", "/_emulator/nodes", {"name": "x", "zone": "us-central2-b", "labels": {}}
    )
    assert status == 200 and emu.node("x")["state"] == "READY"
    assert emu.gcloud_env("/tmp/unused-cfg")["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == emu.url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runs_as_a_module():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "accelmatrix_testkit.tpu_emulator", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}/_emulator/state"

        def up():
            try:
                with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310
                    return json.loads(r.read())
            except OSError:
                return None

        state = wait_for(up, timeout=20)
        assert state["nodes"] == {}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0
