"""A Cloud TPU v2 API emulator on loopback, for driving the real ``gcloud`` CLI in tests.

It serves the part of ``tpu.googleapis.com/v2`` that ``gcloud compute tpus tpu-vm`` and
``gcloud compute tpus queued-resources`` use: nodes, queued resources and long-running
operations, with Google's JSON shapes and error envelopes. Everything is kept in memory and
advances with wall-clock time (checked on every request), so a test sees the same
CREATING -> READY, WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE and DELETING sequences a
real project shows, only in fractions of a second.

In-process::

    with TpuEmulator(op_delay=0.2) as emu:
        env = emu.gcloud_env(tmp_path)          # env for subprocess.run(["gcloud", ...])
        emu.set_faults(quota_exceeded=True)     # or POST /_emulator/faults {...}
        emu.state["nodes"]                      # snapshot for assertions
        emu.requests("POST", "/nodes")          # what gcloud sent

Standalone: ``python -m accelmatrix_testkit.tpu_emulator --port 8471``.

Control endpoints (not part of the Google API): ``GET /_emulator/state``,
``GET|POST /_emulator/faults``, ``POST /_emulator/reset``, ``POST /_emulator/preempt``
``{"name": ..., "zone": ...}``, ``POST /_emulator/nodes`` (plant a node directly).

Modelling choices worth knowing:

* Workers per slice (``networkEndpoints``): for ``v2``/``v3``/``v4``/``v5p`` the suffix counts
  TensorCores and a host has 8 of them, so ``v4-8`` is one host and ``v4-16`` two; for
  ``v5litepod``/``v5e``/``v6e`` the suffix counts chips, up to 8 chips are one host and larger
  slices have 4 chips per host (``v6e-16`` -> 4 workers). Every worker reports
  ``ipAddress`` = ``worker_ip`` (127.0.0.1) so a test can reach "the TPU VM" on loopback.
* Stockout: a node create operation finishes with ``RESOURCE_EXHAUSTED`` (code 8) and the
  node is removed (``stockout_leaves_node=True`` keeps it in state ``TERMINATED``, as a
  half-created resource a caller has to clean up); a queued resource stays
  ``WAITING_FOR_RESOURCES`` and turns ``FAILED`` when its valid-until time passes.
* Half-created node (``fail_create_nodes``: a list of node ids): the node is created, then
  its create operation ends with ``INTERNAL`` (code 13) and the node stays ``TERMINATED``,
  a resource the caller has to delete (targeted, so one cell of a run can be hit).
* Quota: create requests fail at once with HTTP 429 ``RESOURCE_EXHAUSTED`` and a
  ``google.rpc.QuotaFailure`` detail, before anything is created.
* ``filter``/``pageSize``/``pageToken`` on list calls are honoured when sent (gcloud filters
  nodes client side; see tests/test_tpu_emulator.py).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

API_VERSIONS = ("v2", "v2alpha1")
NODE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NODE_ID = 63
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
TYPE_PREFIX = "type.googleapis.com/google.cloud.tpu.v2."

# Node states a caller can see (google.cloud.tpu.v2.Node.State).
CREATING, READY, DELETING, PREEMPTED, TERMINATED = (
    "CREATING",
    "READY",
    "DELETING",
    "PREEMPTED",
    "TERMINATED",
)
# Queued resource states (google.cloud.tpu.v2.QueuedResourceState.State).
QR_WAITING, QR_PROVISIONING, QR_ACTIVE = "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"
QR_FAILED, QR_SUSPENDED, QR_DELETING = "FAILED", "SUSPENDED", "DELETING"
QR_STATE_DATA = {
    QR_WAITING: "waitingForResourcesData",
    QR_PROVISIONING: "provisioningData",
    QR_ACTIVE: "activeData",
    QR_FAILED: "failedData",
    QR_SUSPENDED: "suspendedData",
    QR_DELETING: "deletingData",
}

FAULT_DEFAULTS: dict[str, Any] = {
    "quota_exceeded": False,  # create node/queued resource -> HTTP 429 RESOURCE_EXHAUSTED
    "stockout": False,  # node create op fails (code 8); queued resources never get capacity
    "stockout_leaves_node": False,  # after a failed create the node stays, TERMINATED
    "delete_delay": None,  # seconds a delete takes (slow delete); None -> op_delay
    "create_hangs": False,  # node create operations never finish (node stays CREATING)
    # Node ids whose create fails half way: the node exists, then its create operation ends
    # with INTERNAL (code 13) and the node stays TERMINATED for the caller to delete.
    "fail_create_nodes": [],
}

CREATE_FAILED_MESSAGE = (
    "Internal error encountered while creating node {node}: the host failed its health "
    "check during boot [EID: 0x{eid}]"
)

STOCKOUT_MESSAGE = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where '
    "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
    "[EID: 0x{eid}]"
)


class ApiError(Exception):
    """Becomes a Google API error envelope ``{"error": {code, message, status, details}}``."""

    def __init__(
        self, http: int, status: str, message: str, details: list[dict] | None = None
    ) -> None:
        super().__init__(message)
        self.http, self.status, self.message, self.details = http, status, message, details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.http, "message": self.message, "status": self.status}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def _not_found(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"Resource '{what}' was not found")


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _parse_duration(text: str) -> float:
    """Protobuf Duration JSON (``"600s"``, ``"1.5s"``)."""
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)s", text.strip())
    if not m:
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid duration: {text!r}")
    return float(m.group(1))


def workers_for(accelerator_type: str) -> int:
    """Hosts (TPU VM workers) of a slice; see the module docstring for the rule."""
    m = re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", accelerator_type or "")
    if not m:
        return 1
    family, size = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v5e", "v6e"):
        return 1 if size <= 8 else size // 4
    return max(1, size // 8)


def _validate_labels(labels: Any) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict) or len(labels) > 64:
        raise ApiError(400, "INVALID_ARGUMENT", "labels must be a map of at most 64 entries")
    for k, v in labels.items():
        if not LABEL_KEY_RE.match(str(k)):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid label key: {k!r}")
        if not isinstance(v, str) or not LABEL_VALUE_RE.match(v):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid label value for {k!r}: {v!r}")


def _validate_node_id(node_id: str | None) -> str:
    if not node_id:
        raise ApiError(400, "INVALID_ARGUMENT", "nodeId is required")
    if len(node_id) > MAX_NODE_ID or not NODE_ID_RE.match(node_id):
        raise ApiError(
            400,
            "INVALID_ARGUMENT",
            f"Invalid node id {node_id!r}: must match [a-z]([-a-z0-9]*[a-z0-9])? and be at "
            f"most {MAX_NODE_ID} characters",
        )
    return node_id


def _matches_filter(obj: dict[str, Any], expr: str) -> bool:
    """A tiny subset of AIP-160: space/AND separated ``a.b=value`` / ``a.b:value`` terms."""
    for term in re.split(r"\s+(?:AND\s+)?", expr.strip()):
        if not term:
            continue
        m = re.fullmatch(r"([\w.-]+)\s*(=|:)\s*\"?([^\"]*)\"?", term)
        if not m:
            raise ApiError(400, "INVALID_ARGUMENT", f"Unsupported filter term {term!r}")
        cur: Any = obj
        for part in m.group(1).split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None or (m.group(3) != "*" and str(cur) != m.group(3)):
            return False
    return True


class TpuEmulator:
    """The emulator; a context manager that serves on 127.0.0.1 while entered.

    ``op_delay``: seconds a create operation takes (0 -> operations come back done, so gcloud
    does not poll). ``qr_wait``/``qr_provision``: seconds a queued resource spends in
    WAITING_FOR_RESOURCES and PROVISIONING when capacity exists. ``page_size``: the server's
    maximum page size on list calls.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        op_delay: float = 0.5,
        qr_wait: float = 0.5,
        qr_provision: float = 0.5,
        page_size: int = 100,
        worker_ip: str = "127.0.0.1",
        endpoint_port: int = 8470,
        authorized_keys: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host, self._port = host, port
        # The guest agent's part: the public keys in the ``ssh-keys`` metadata of every READY
        # node are appended to this file (an sshd's AuthorizedKeysFile), and taken out again
        # when the node goes away, so "SSH to the TPU VM" reaches the loopback sshd exactly
        # when a real VM would accept the key.
        self.authorized_keys = Path(authorized_keys) if authorized_keys else None
        self._base_keys = (
            self.authorized_keys.read_text()
            if self.authorized_keys and self.authorized_keys.exists()
            else ""
        )
        self._written_keys: str | None = None
        self.op_delay, self.qr_wait, self.qr_provision = op_delay, qr_wait, qr_provision
        self.page_size = page_size
        self.worker_ip, self.endpoint_port = worker_ip, endpoint_port
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self.down = False  # take_down(): requests on open connections are dropped unanswered
        self.reset()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> TpuEmulator:
        if self._server is not None:
            return self
        server = ThreadingHTTPServer((self.host, self._port), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def take_down(self) -> None:
        """The API becomes unreachable, state kept: the listening socket closes (connections
        are refused) and a request on a connection still open is dropped unanswered. Time
        (operations, preemptions) goes on meanwhile, as it does in the cloud."""
        if self._server is None:
            return
        self._port = self.port  # bring_up() serves on the same address
        self.down = True
        self.stop()

    def bring_up(self) -> None:
        """The API is back on the address it had before ``take_down()``."""
        self.down = False
        self.start()

    def __enter__(self) -> TpuEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("emulator not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The base URL gcloud needs (``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU``), with a slash."""
        return f"http://{self.host}:{self.port}/"

    def gcloud_env(self, config_dir: str | os.PathLike[str], project: str = "p") -> dict[str, str]:
        """Environment variables making the real gcloud talk only to this emulator.

        ``config_dir`` becomes ``CLOUDSDK_CONFIG`` (created, plus a token file in it). Merge
        the result over ``os.environ`` for ``subprocess``.
        """
        cfg = Path(config_dir)
        cfg.mkdir(parents=True, exist_ok=True)
        token = cfg / "emulator-access-token"
        token.write_text("emulator-token\n")
        return {
            "CLOUDSDK_CONFIG": str(cfg),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.url,
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
            "CLOUDSDK_CORE_PROJECT": project,
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            # Without these gcloud resolves metadata.google.internal (GCE detection, both
            # for credentials and for the metrics "environment" tag) before every command.
            "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
            "CLOUDSDK_METRICS_ENVIRONMENT": "accelmatrix-tests",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_FILE_LOGGING": "true",
        }

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every resource, operation, logged request and fault."""
        with self._lock:
            self._nodes: dict[str, dict[str, Any]] = {}
            self._node_meta: dict[str, dict[str, Any]] = {}
            self._qrs: dict[str, dict[str, Any]] = {}
            self._qr_meta: dict[str, dict[str, Any]] = {}
            self._ops: dict[str, dict[str, Any]] = {}
            self._op_meta: dict[str, dict[str, Any]] = {}
            self._log: list[dict[str, Any]] = []
            self.faults: dict[str, Any] = dict(FAULT_DEFAULTS)

    @property
    def state(self) -> dict[str, Any]:
        """A deep copy of everything, after advancing time: nodes, queued resources, ops, log."""
        with self._lock:
            self._tick()
            return json.loads(
                json.dumps(
                    {
                        "nodes": self._nodes,
                        "queued_resources": self._qrs,
                        "operations": self._ops,
                        "requests": self._log,
                        "faults": self.faults,
                    }
                )
            )

    def requests(self, method: str | None = None, contains: str = "") -> list[dict[str, Any]]:
        """Logged API requests (control endpoints excluded), optionally filtered."""
        with self._lock:
            return [
                json.loads(json.dumps(r))
                for r in self._log
                if (method is None or r["method"] == method) and contains in r["path"]
            ]

    def node(self, name: str, zone: str | None = None) -> dict[str, Any] | None:
        """The node called ``name`` (short id) in any (or the given) zone, or None."""
        with self._lock:
            self._tick()
            for full, node in self._nodes.items():
                _, _, z, _, short = full.split("/")[1:6]
                if short == name and (zone is None or zone == z):
                    return json.loads(json.dumps(node))
        return None

    # -- faults ------------------------------------------------------------------------------
    def set_faults(self, **faults: Any) -> dict[str, Any]:
        unknown = set(faults) - set(FAULT_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)} (known: {sorted(FAULT_DEFAULTS)})")
        with self._lock:
            self.faults.update(faults)
            return dict(self.faults)

    def clear_faults(self) -> None:
        with self._lock:
            self.faults = dict(FAULT_DEFAULTS)

    def quota_exceeded(self, on: bool = True) -> None:
        self.set_faults(quota_exceeded=on)

    def stockout(self, on: bool = True, *, leaves_node: bool = False) -> None:
        self.set_faults(stockout=on, stockout_leaves_node=leaves_node)

    def slow_delete(self, seconds: float | None) -> None:
        self.set_faults(delete_delay=seconds)

    def preempt(self, name: str, zone: str | None = None) -> None:
        """Preempt a running node: state PREEMPTED; its queued resource becomes SUSPENDED."""
        with self._lock:
            self._tick()
            full = self._find_node(name, zone)
            node = self._nodes[full]
            node["state"] = PREEMPTED
            node["health"] = "UNHEALTHY_MAINTENANCE"
            qr = node.get("queuedResource")
            if qr and qr in self._qrs:
                self._set_qr_state(qr, QR_SUSPENDED)
            self._sync_ssh_keys()

    def plant_node(
        self,
        name: str,
        zone: str,
        *,
        project: str = "p",
        labels: dict[str, str] | None = None,
        accelerator_type: str = "v4-8",
        runtime_version: str = "tpu-ubuntu2204-base",
        state: str = READY,
    ) -> dict[str, Any]:
        """Put a node in place without an API call (e.g. one someone else created)."""
        with self._lock:
            full = f"projects/{project}/locations/{zone}/nodes/{name}"
            body = {
                "acceleratorType": accelerator_type,
                "runtimeVersion": runtime_version,
                "labels": dict(labels or {}),
            }
            node = self._new_node(full, body)
            node["state"] = state
            self._nodes[full] = node
            self._node_meta[full] = {}
            return json.loads(json.dumps(node))

    def _find_node(self, name: str, zone: str | None) -> str:
        for full in self._nodes:
            parts = full.split("/")
            if parts[-1] == name and (zone is None or parts[3] == zone):
                return full
        raise KeyError(f"no node {name!r}")

    # -- time --------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.time()
        for op_name, meta in list(self._op_meta.items()):
            op = self._ops[op_name]
            if not op["done"] and meta["done_at"] is not None and now >= meta["done_at"]:
                meta["finish"](op)
                op["done"] = True
                op["metadata"]["endTime"] = _rfc3339(now)
        for qr_name, meta in list(self._qr_meta.items()):
            qr = self._qrs.get(qr_name)
            if qr is None:
                continue
            state = qr["state"]["state"]
            if state == QR_WAITING:
                valid_until = meta.get("valid_until")
                if valid_until is not None and now >= valid_until:
                    self._set_qr_state(
                        qr_name,
                        QR_FAILED,
                        {
                            "error": {
                                "code": 4,
                                "message": "The queued resource could not be provisioned "
                                "before its valid-until time: "
                                + STOCKOUT_MESSAGE.format(
                                    zone=qr_name.split("/")[3], eid=secrets.token_hex(8)
                                ),
                            }
                        },
                    )
                elif not self.faults["stockout"] and now >= meta["waiting_until"]:
                    meta["provisioned_at"] = now + self.qr_provision
                    self._set_qr_state(qr_name, QR_PROVISIONING)
            elif state == QR_PROVISIONING and now >= meta["provisioned_at"]:
                for spec in qr["tpu"]["nodeSpec"]:
                    full = f"{spec['parent']}/nodes/{spec['nodeId']}"
                    node = self._new_node(full, spec.get("node", {}))
                    node["state"] = READY
                    node["queuedResource"] = qr_name
                    self._nodes[full] = node
                    self._node_meta[full] = {}
                self._set_qr_state(qr_name, QR_ACTIVE)
        self._sync_ssh_keys()

    def _sync_ssh_keys(self) -> None:
        """Make the authorized_keys file hold the base keys plus the READY nodes' keys."""
        if self.authorized_keys is None:
            return
        keys = []
        for node in self._nodes.values():
            if node.get("state") != READY:
                continue
            for line in str((node.get("metadata") or {}).get("ssh-keys", "")).splitlines():
                user, sep, key = line.partition(":")
                if sep and user.strip() and key.strip():
                    keys.append(key.strip())
        text = self._base_keys.rstrip("\n") + "\n" + "".join(k + "\n" for k in keys)
        if text != self._written_keys:
            tmp = self.authorized_keys.with_name(self.authorized_keys.name + ".tmp")
            tmp.write_text(text)
            tmp.chmod(0o600)
            os.replace(tmp, self.authorized_keys)
            self._written_keys = text

    def _set_qr_state(self, qr_name: str, state: str, data: dict | None = None) -> None:
        self._qrs[qr_name]["state"] = {
            "state": state,
            "stateInitiator": "SERVICE",
            QR_STATE_DATA[state]: data or {},
        }

    # -- resources ---------------------------------------------------------------------------
    def _new_node(self, full: str, body: dict[str, Any]) -> dict[str, Any]:
        zone = full.split("/")[3]
        accel = body.get("acceleratorType") or (body.get("acceleratorConfig") or {}).get("type")
        project, region = full.split("/")[1], zone.rsplit("-", 1)[0]
        net = dict(body.get("networkConfig") or {})
        network = net.get("network") or "default"
        subnetwork = net.get("subnetwork") or network.rsplit("/", 1)[-1]
        # The API answers with full resource names for what gcloud sends as short names.
        if "/" not in network:
            net["network"] = f"projects/{project}/global/networks/{network}"
        if "/" not in subnetwork:
            net["subnetwork"] = f"projects/{project}/regions/{region}/subnetworks/{subnetwork}"
        external = net.get("enableExternalIps", True)
        endpoints = []
        for _ in range(workers_for(accel or "")):
            ep: dict[str, Any] = {"ipAddress": self.worker_ip, "port": self.endpoint_port}
            if external:
                ep["accessConfig"] = {"externalIp": self.worker_ip}
            endpoints.append(ep)
        node = {
            **json.loads(json.dumps(body)),
            "name": full,
            "acceleratorType": accel or "v2-8",
            "state": CREATING,
            "health": "HEALTHY",
            "createTime": _rfc3339(time.time()),
            "networkConfig": net,
            "networkEndpoints": endpoints,
            "id": str(1000000000000000000 + next(self._ids)),
            "apiVersion": "V2",
            "cidrBlock": body.get("cidrBlock") or "10.128.0.0/20",
            "serviceAccount": body.get("serviceAccount")
            or {"email": "default", "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
        }
        node.setdefault("schedulingConfig", {})
        node.setdefault("labels", {})
        node["metadata"] = dict(body.get("metadata") or {})
        return node

    def _new_op(
        self, parent: str, verb: str, target: str, delay: float | None, finish: Any
    ) -> dict[str, Any]:
        name = f"{parent}/operations/operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        op = {
            "name": name,
            "metadata": {
                "@type": TYPE_PREFIX + "OperationMetadata",
                "createTime": _rfc3339(time.time()),
                "target": target,
                "verb": verb,
                "cancelRequested": False,
                "apiVersion": "v2",
            },
            "done": False,
        }
        self._ops[name] = op
        self._op_meta[name] = {
            "done_at": None if delay is None else time.time() + delay,
            "finish": finish,
        }
        self._tick()  # a zero delay completes at once (gcloud then skips polling)
        return op

    def _quota_error(self, zone: str, accel: str) -> ApiError:
        family = (accel or "tpu").split("-")[0].upper()
        metric = f"tpu.googleapis.com/{family.lower()}_cores"
        msg = (
            f"Quota limit '{family}PerProjectPerZoneForTPUAPI' has been exceeded. "
            f"Limit: 0 in zone {zone}."
        )
        return ApiError(
            429,
            "RESOURCE_EXHAUSTED",
            msg,
            [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"subject": f"project:{zone}", "description": msg}],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "googleapis.com",
                    "metadata": {"quota_metric": metric, "service": "tpu.googleapis.com"},
                },
            ],
        )

    # -- API ---------------------------------------------------------------------------------
    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        authorization: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Route one request; returns (HTTP status, JSON body). Thread safe.

        ``authorization`` (the request's header) is logged with it: tests read which
        credentials each call carried."""
        with self._lock:
            if path.startswith("/_emulator/"):
                return self._control(method, path, body)
            self._log.append(
                {
                    "method": method,
                    "path": path,
                    "query": query,
                    "body": body,
                    "time": time.time(),
                    "authorization": authorization,
                }
            )
            try:
                self._tick()
                return 200, self._api(method, path, query, body)
            except ApiError as e:
                return e.http, e.body()

    def _api(self, method: str, path: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        m = re.fullmatch(
            r"/(v2|v2alpha1)/(projects/[^/]+/locations/[^/]+)"
            r"(?:/(nodes|queuedResources|operations)(?:/([^/:]+))?)?",
            path,
        )
        if not m:
            raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found.")
        parent, coll, rid = m.group(2), m.group(3), m.group(4)
        if coll is None:
            if method == "GET":
                return {"name": parent, "locationId": parent.split("/")[-1]}
            raise ApiError(405, "UNIMPLEMENTED", f"{method} {path} is not supported")
        full = f"{parent}/{coll}/{rid}" if rid else None
        route = (coll, method, rid is not None)
        if route == ("nodes", "POST", False):
            return self._create_node(parent, query.get("nodeId"), body or {})
        if route == ("nodes", "GET", True):
            if full not in self._nodes:
                raise _not_found(full)
            return self._nodes[full]
        if route == ("nodes", "GET", False):
            return self._list(self._nodes, parent + "/nodes/", "nodes", query)
        if route == ("nodes", "DELETE", True):
            return self._delete_node(parent, full)
        if route == ("queuedResources", "POST", False):
            return self._create_qr(parent, query.get("queuedResourceId"), body or {})
        if route == ("queuedResources", "GET", True):
            if full not in self._qrs:
                raise _not_found(full)
            return self._qrs[full]
        if route == ("queuedResources", "GET", False):
            return self._list(self._qrs, parent + "/queuedResources/", "queuedResources", query)
        if route == ("queuedResources", "DELETE", True):
            return self._delete_qr(parent, full, query.get("force", "").lower() == "true")
        if route == ("operations", "GET", True):
            if full not in self._ops:
                raise _not_found(full)
            return self._ops[full]
        if route == ("operations", "GET", False):
            return self._list(self._ops, parent + "/operations/", "operations", query)
        raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found.")

    def _list(
        self, table: dict[str, dict], prefix: str, key: str, query: dict[str, str]
    ) -> dict[str, Any]:
        items = [v for k, v in sorted(table.items()) if k.startswith(prefix)]
        if query.get("filter"):
            items = [v for v in items if _matches_filter(v, query["filter"])]
        size = min(int(query.get("pageSize") or self.page_size), self.page_size)
        start = int(query.get("pageToken") or 0)
        page = items[start : start + size]
        out: dict[str, Any] = {key: page}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    def _create_node(self, parent: str, node_id: str | None, body: dict) -> dict[str, Any]:
        node_id = _validate_node_id(node_id)
        if not body.get("runtimeVersion"):
            raise ApiError(400, "INVALID_ARGUMENT", "runtimeVersion is required")
        _validate_labels(body.get("labels"))
        full = f"{parent}/nodes/{node_id}"
        zone = parent.split("/")[-1]
        if self.faults["quota_exceeded"]:
            raise self._quota_error(zone, body.get("acceleratorType", ""))
        if full in self._nodes:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{full}' already exists")
        node = self._new_node(full, body)
        self._nodes[full] = node
        self._node_meta[full] = {}
        stockout = bool(self.faults["stockout"])
        leaves = bool(self.faults["stockout_leaves_node"])
        broken = node_id in (self.faults["fail_create_nodes"] or [])

        def finish(op: dict[str, Any]) -> None:
            current = self._nodes.get(full)
            if broken:
                op["error"] = {
                    "code": 13,
                    "message": CREATE_FAILED_MESSAGE.format(node=node_id, eid=secrets.token_hex(8)),
                }
                if current is not None:
                    current["state"] = TERMINATED
                    current["health"] = "UNHEALTHY_TENSORFLOW"
                return
            if stockout:
                op["error"] = {
                    "code": 8,
                    "message": STOCKOUT_MESSAGE.format(zone=zone, eid=secrets.token_hex(8)),
                }
                if current is not None:
                    if leaves:
                        current["state"] = TERMINATED
                    else:
                        self._nodes.pop(full, None)
                return
            if current is not None and current["state"] == CREATING:
                current["state"] = READY
            op["response"] = {"@type": TYPE_PREFIX + "Node", **(current or node)}

        delay = None if self.faults["create_hangs"] else self.op_delay
        return self._new_op(parent, "create", full, delay, finish)

    def _delete_node(self, parent: str, full: str) -> dict[str, Any]:
        node = self._nodes.get(full)
        if node is None:
            raise _not_found(full)
        node["state"] = DELETING

        def finish(op: dict[str, Any]) -> None:
            self._nodes.pop(full, None)
            self._node_meta.pop(full, None)
            op["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}

        return self._new_op(parent, "delete", full, self._delete_delay(), finish)

    def _delete_delay(self) -> float:
        d = self.faults["delete_delay"]
        return self.op_delay if d is None else float(d)

    def _create_qr(self, parent: str, qr_id: str | None, body: dict) -> dict[str, Any]:
        qr_id = _validate_node_id(qr_id)
        full = f"{parent}/queuedResources/{qr_id}"
        specs = ((body.get("tpu") or {}).get("nodeSpec")) or []
        if not specs:
            raise ApiError(400, "INVALID_ARGUMENT", "tpu.nodeSpec is required")
        for spec in specs:
            _validate_node_id(spec.get("nodeId"))
            node = spec.get("node") or {}
            if not node.get("runtimeVersion"):
                raise ApiError(400, "INVALID_ARGUMENT", "runtimeVersion is required")
            _validate_labels(node.get("labels"))
        if self.faults["quota_exceeded"]:
            raise self._quota_error(parent.split("/")[-1], specs[0]["node"].get("acceleratorType"))
        if full in self._qrs:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{full}' already exists")
        for spec in specs:
            node_full = f"{spec['parent']}/nodes/{spec['nodeId']}"
            if node_full in self._nodes:
                raise ApiError(409, "ALREADY_EXISTS", f"Resource '{node_full}' already exists")
        now = time.time()
        policy = body.get("queueingPolicy") or {}
        valid_until = None
        if policy.get("validUntilDuration"):
            valid_until = now + _parse_duration(policy["validUntilDuration"])
        elif policy.get("validUntilTime"):
            valid_until = _parse_rfc3339(policy["validUntilTime"])
        elif (policy.get("validInterval") or {}).get("endTime"):
            valid_until = _parse_rfc3339(policy["validInterval"]["endTime"])
        qr = {**json.loads(json.dumps(body)), "name": full, "createTime": _rfc3339(now)}
        self._qrs[full] = qr
        self._qr_meta[full] = {"valid_until": valid_until, "waiting_until": now + self.qr_wait}
        self._set_qr_state(full, QR_WAITING)

        def finish(op: dict[str, Any]) -> None:
            op["response"] = {"@type": TYPE_PREFIX + "QueuedResource", **self._qrs.get(full, qr)}

        # Accepting the request is quick; getting capacity is what takes time.
        return self._new_op(parent, "create", full, 0.0, finish)

    def _delete_qr(self, parent: str, full: str, force: bool) -> dict[str, Any]:
        qr = self._qrs.get(full)
        if qr is None:
            raise _not_found(full)
        nodes = [n for n, v in self._nodes.items() if v.get("queuedResource") == full]
        if nodes and not force:
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"Queued resource {full} has nodes {nodes}; delete them first or use force",
            )
        for n in nodes:
            self._nodes[n]["state"] = DELETING
        self._set_qr_state(full, QR_DELETING)

        def finish(op: dict[str, Any]) -> None:
            for n in nodes:
                self._nodes.pop(n, None)
                self._node_meta.pop(n, None)
            self._qrs.pop(full, None)
            self._qr_meta.pop(full, None)
            op["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}

        return self._new_op(parent, "delete", full, self._delete_delay(), finish)

    # -- control endpoints -------------------------------------------------------------------
    def _control(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        body = body or {}
        try:
            if path == "/_emulator/state" and method == "GET":
                return 200, self.state
            if path == "/_emulator/faults" and method == "GET":
                return 200, dict(self.faults)
            if path == "/_emulator/faults" and method == "POST":
                return 200, self.set_faults(**body)
            if path == "/_emulator/reset" and method == "POST":
                self.reset()
                return 200, {}
            if path == "/_emulator/preempt" and method == "POST":
                self.preempt(body["name"], body.get("zone"))
                return 200, {}
            if path == "/_emulator/nodes" and method == "POST":
                return 200, self.plant_node(**body)
        except (KeyError, TypeError, ValueError) as e:
            return 400, ApiError(400, "INVALID_ARGUMENT", str(e)).body()
        return 404, ApiError(404, "NOT_FOUND", f"No emulator endpoint {method} {path}").body()


# OAuth 2.0 token endpoint of the emulator: a service account key whose ``token_uri`` is
# ``<emulator url>token`` gets its access tokens here, so gcloud's real service-account
# flow (activate-service-account, then a signed JWT exchanged for a token) runs offline.
TOKEN_PATH = "/token"


def access_token_for(client_email: str) -> str:
    """The access token the emulator issues to a service account: names it, so a test can
    tell from a logged Authorization header whose credentials a call used."""
    return f"emulator-token-for-{client_email}"


def token_grant(raw: bytes) -> tuple[int, dict[str, Any]]:
    """Answer a JWT-bearer grant (RFC 7523) with a token for the assertion's issuer.

    The signature is not checked: the emulator proves which key gcloud used, not that the
    key is genuine.
    """
    form = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
    try:
        payload = form["assertion"].split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        issuer = str(claims["iss"])
    except (KeyError, IndexError, ValueError) as e:
        return 400, {"error": "invalid_grant", "error_description": f"bad assertion: {e}"}
    return 200, {
        "access_token": access_token_for(issuer),
        "expires_in": 3600,
        "token_type": "Bearer",
    }


def _make_handler(emu: TpuEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: gcloud reuses its connection

        def _serve(self) -> None:
            if emu.down:  # an outage: the connection drops, no answer
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if split.path == TOKEN_PATH:
                self._send(*token_grant(raw))
                return
            body: Any = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, ApiError(400, "INVALID_ARGUMENT", "body is not JSON").body())
                    return
            status, out = emu.handle(
                self.command,
                unquote(split.path),
                query,
                body,
                authorization=self.headers.get("Authorization"),
            )
            self._send(status, out)

        def _send(self, status: int, out: dict[str, Any]) -> None:
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8471)
    p.add_argument("--op-delay", type=float, default=0.5)
    p.add_argument("--qr-wait", type=float, default=0.5)
    p.add_argument("--qr-provision", type=float, default=0.5)
    args = p.parse_args(argv)
    emu = TpuEmulator(
        args.host,
        args.port,
        op_delay=args.op_delay,
        qr_wait=args.qr_wait,
        qr_provision=args.qr_provision,
    )
    # SIGTERM ends the process like Ctrl-C does: the with-block closes the socket.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with emu:
        print(f"Cloud TPU v2 emulator on {emu.url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
