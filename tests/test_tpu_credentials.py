"""Two TPU cells with different GCP connections, their gcloud calls in threads of ONE
process (as a triggerer runs them), against the Cloud TPU emulator.

The real production path: each hook reads its Airflow connection (a service-account key
file and a project) through the google provider, runs the real ``gcloud auth
activate-service-account`` into its own configuration, and gcloud exchanges a JWT signed
with that key for an access token at the emulator's token endpoint (the key's
``token_uri``). The emulator logs the Authorization header of every API call, so the test
sees whose credentials and which project each call carried. The process's own environment
is set to a third identity that no call may use, and must be unchanged afterwards.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from accelmatrix.hooks.gcloud_env import CREDENTIAL_ENV
from accelmatrix.hooks.tpu import TpuVmHook
from accelmatrix_testkit.tpu_emulator import TOKEN_PATH, TpuEmulator, access_token_for

ZONE = "us-central2-b"
pytestmark = pytest.mark.usefixtures("needs_gcloud")  # the real gcloud (needs.py)


@pytest.fixture(scope="module")
def emu():
    with TpuEmulator(op_delay=0.0, qr_wait=0.3, qr_provision=0.3) as e:
        yield e


def _service_account_key(path: Path, email: str, project: str, token_uri: str) -> Path:
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "k-" + project,
                "private_key": pem.decode(),
                "client_email": email,
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return path


def test_concurrent_cells_each_use_their_own_connection(emu, tmp_path, monkeypatch):
    emu.reset()
    routing = {
        k: v
        for k, v in emu.gcloud_env(tmp_path / "unused-config").items()
        if k not in CREDENTIAL_ENV
    }
    for k, v in routing.items():  # where "Google" is: the emulator, for every child
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ACCELMATRIX_GCLOUD_AUTH", raising=False)
    # A third identity in the process environment: a call that used it would show it.
    (tmp_path / "process-token").write_text("process-wide-token\n")
    monkeypatch.setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", str(tmp_path / "process-token"))
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "process-project")
    token_uri = emu.url.rstrip("/") + TOKEN_PATH
    cells = {
        "a": ("sa-a@proj-a.iam.gserviceaccount.com", "proj-a"),
        "b": ("sa-b@proj-b.iam.gserviceaccount.com", "proj-b"),
    }
    for cell, (email, project) in cells.items():
        key = _service_account_key(tmp_path / f"{cell}.json", email, project, token_uri)
        conn = {
            "conn_type": "google_cloud_platform",
            "extra": {"key_path": str(key), "project": project},
        }
        monkeypatch.setenv(f"AIRFLOW_CONN_TPU_{cell.upper()}", json.dumps(conn))
    environ_before = dict(os.environ)

    barrier = threading.Barrier(len(cells))
    hooks: dict[str, TpuVmHook] = {}
    errors: dict[str, BaseException] = {}

    def cell_work(cell: str) -> None:
        try:
            hook = hooks[cell] = TpuVmHook(f"tpu_{cell}", timeout=120)
            barrier.wait(timeout=60)
            hook.create_node(f"node-{cell}", ZONE, "v4-8", "tpu-ubuntu2204-base")
            assert hook.get_node(f"node-{cell}", ZONE)["state"] == "READY"
            hook.list_nodes(ZONE)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors[cell] = e

    threads = [threading.Thread(target=cell_work, args=(c,)) for c in cells]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == {}
    try:
        assert dict(os.environ) == environ_before  # nothing patched the process environment

        windows = {}
        for cell, (email, project) in cells.items():
            calls = emu.requests(contains=f"/projects/{project}/")
            assert len(calls) >= 3, calls  # create (+ operation polls), get, list
            assert {c["authorization"] for c in calls} == {f"Bearer {access_token_for(email)}"}
            windows[cell] = (calls[0]["time"], calls[-1]["time"])
            # Authorized once for all its calls, not once per call.
            assert hooks[cell].authentications == 1 and len(hooks[cell].calls) >= 3
        all_calls = emu.requests()
        assert not [c for c in all_calls if "process" in (c["authorization"] or "")]
        assert not [c for c in all_calls if "process-project" in c["path"]]
        assert {n for n in emu.state["nodes"]} == {
            f"projects/proj-{c}/locations/{ZONE}/nodes/node-{c}" for c in cells
        }
        # The two cells' API calls overlapped in time: they really ran side by side.
        (a0, a1), (b0, b1) = windows["a"], windows["b"]
        assert a0 < b1 and b0 < a1
    finally:
        for hook in hooks.values():
            hook.close()
