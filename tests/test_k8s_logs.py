"""The pod log spool (accelmatrix.backends.kubernetes.logs) against the emulator's kubelet logs:
a broken follow stream resumes without losing or repeating a line, and lines that rotated
away while nobody followed are marked, not silently dropped."""

from __future__ import annotations

import sys
import time

import pytest

from accelmatrix.backends.kubernetes import logs as k8s_logs
from accelmatrix_testkit.k8s_emulator import Cluster

NS = "default"


@pytest.fixture()
def cluster(tmp_path):
    with Cluster(tmp_path / "k8s", (NS,), log_max_bytes=4000) as c:
        yield c


def core(cluster, tmp_path):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(
        str(cluster.emulator.write_kubeconfig(tmp_path / "kc")), client_configuration=cfg
    )
    return client.CoreV1Api(client.ApiClient(cfg))


def start(cluster, api, name: str, lines: int, pause: float) -> str:
    from kubernetes import client

    code = (
        "import time\n"
        f"for i in range({lines}):\n"
        "    print(f'line {i:05d}', flush=True)\n"
        f"    time.sleep({pause})\n"
    )
    client.BatchV1Api(api.api_client).create_namespaced_job(
        NS,
        {
            "metadata": {"name": name},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "main", "image": "i", "command": [sys.executable, "-c", code]}
                        ],
                    }
                },
            },
        },
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with cluster.emulator.lock:
            pods = [n for (_, n, _) in cluster.emulator.container_logs if n.startswith(name)]
        if pods:
            return pods[0]
        time.sleep(0.05)
    raise AssertionError("no pod")


def opener(api, pod: str, break_after: int | None = None):
    """What the backend opens (follow, timestamps, sinceTime), optionally cut short."""

    def open_stream(since):
        query = [("container", "main"), ("follow", "true"), ("timestamps", "true")]
        if since:
            query.append(("sinceTime", since))
        resp = api.api_client.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            path_params={"namespace": NS, "name": pod},
            query_params=query,
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        if break_after is None:
            return resp
        return Broken(resp, break_after)

    return open_stream


class Broken:
    """A stream that breaks after some chunks (a dropped connection)."""

    def __init__(self, resp, chunks: int):
        self.resp, self.chunks = resp, chunks

    def stream(self, *a, **kw):
        for i, chunk in enumerate(self.resp.stream(*a, **kw)):
            if i >= self.chunks:
                raise ConnectionResetError("connection dropped")
            yield chunk

    def release_conn(self):
        self.resp.release_conn()


def numbers(path) -> list[int]:
    return [int(line.split()[1]) for line in path.read_text().splitlines()]


def test_a_broken_follow_resumes_without_a_gap_or_a_repeat(cluster, tmp_path):
    api = core(cluster, tmp_path)
    cluster.kubelet.log_max_bytes = 10**6  # no rotation: a resume alone
    pod = start(cluster, api, "resume", lines=200, pause=0.01)
    spool = k8s_logs.Spool(tmp_path / "art" / "pods" / f"{pod}.log")
    with pytest.raises(ConnectionResetError):
        spool.follow(opener(api, pod, break_after=3))
    got = numbers(spool.path)
    assert 0 < len(got) < 200 and got == list(range(len(got)))
    assert spool.state()["size"] == spool.path.stat().st_size
    log = cluster.emulator.container_logs[(NS, pod, "main")]
    while not log.done:
        time.sleep(0.05)
    # The resumed follow asks from the last whole second it has and drops what it has by
    # the lines' nanosecond timestamps: every line, once.
    assert spool.follow(opener(api, pod)) is True
    assert numbers(spool.path) == list(range(200))
    assert spool.state()["size"] == spool.path.stat().st_size


def test_lines_rotated_away_while_nobody_followed_are_marked(cluster, tmp_path):
    api = core(cluster, tmp_path)
    pod = start(cluster, api, "gap", lines=300, pause=0.005)
    spool = k8s_logs.Spool(tmp_path / "art" / "pods" / f"{pod}.log")
    with pytest.raises(ConnectionResetError):
        spool.follow(opener(api, pod, break_after=1))
    first = numbers(spool.path)
    log = cluster.emulator.container_logs[(NS, pod, "main")]
    while not log.done:  # meanwhile the kubelet rotated the file many times
        time.sleep(0.05)
    assert log.rotations >= 2
    assert spool.follow(opener(api, pod)) is True
    lines = spool.path.read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith("[accelmatrix: log"))
    assert marker == len(first)  # right after what was seen, before what came after
    after = [int(x.split()[1]) for x in lines[marker + 1 :]]
    assert after[-1] == 299 and after == list(range(after[0], 300)) and after[0] > first[-1] + 1
