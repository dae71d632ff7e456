"""The emulators' outage switch (take_down/bring_up), which the fault matrix's "cloud API
unreachable" row uses: while down, new connections are refused and a request on a
connection opened before is dropped unanswered; afterwards the same address serves the
same state."""

from __future__ import annotations

import http.client
import json

import pytest

from accelmatrix_testkit.k8s_emulator import KubernetesEmulator
from accelmatrix_testkit.tpu_emulator import TpuEmulator

NODES = "/v2/projects/p/locations/us-central2-b/nodes"


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict]:
    conn.request("GET", path, headers={"Authorization": "Bearer t"})
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")


@pytest.mark.parametrize("kind", ["tpu", "k8s"])
def test_take_down_refuses_and_drops_then_bring_up_keeps_address_and_state(kind):
    if kind == "tpu":
        emu, path = TpuEmulator(op_delay=0), NODES
    else:
        emu, path = KubernetesEmulator(), "/api/v1/namespaces/default/pods"
    with emu:
        url = emu.url
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert _get(kept, path)[0] == 200
        if kind == "tpu":
            emu.plant_node("n1", zone="us-central2-b")
        emu.take_down()
        with pytest.raises((http.client.HTTPException, OSError)):
            _get(kept, path)  # the open keep-alive connection: no answer
        fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises(ConnectionRefusedError):
            _get(fresh, path)
        emu.bring_up()
        assert emu.url == url
        status, body = _get(http.client.HTTPConnection("127.0.0.1", port, timeout=5), path)
        assert status == 200
        if kind == "tpu":
            assert [n["name"].rsplit("/", 1)[-1] for n in body.get("nodes", [])] == ["n1"]
