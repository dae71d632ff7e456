"""A Kubernetes API emulator on loopback plus a fake kubelet, for the ``k8s-job`` backend tests.

Why not kmock (``kmock.KubernetesEmulator``, PyPI)? Judged at 0.8: it stores arbitrary objects
over aiohttp (five new dependencies here) but has no label-selector filtering, no
``pods/log``, no delete propagation to a Job's pods and no notion of a Job's lifecycle; all
of that would be custom handlers on top of it. This module is a small, stateful emulator on
the stdlib (``ThreadingHTTPServer``) with the JSON shapes of the real API, so the backend
talks to it through the real ``kubernetes`` client (and ``kubectl`` works against it).

What it serves (the subset the backend and ``kubectl get`` use):

* ``batch/v1`` Jobs: create (defaults, validation -> 422 ``Invalid``, 409 ``AlreadyExists``),
  get, ``/status``, list (namespaced and all namespaces, ``labelSelector``), delete with
  ``propagationPolicy`` (``Background``/``Foreground`` delete the Job's pods; none or
  ``Orphan`` leave them running, as the real API does for Jobs).
* ``core/v1`` Pods: get, list, delete, deletecollection (``labelSelector``), ``/log``
  (``container``, ``limitBytes``, ``tailLines``, ``timestamps``, ``sinceSeconds``,
  ``sinceTime``, ``follow``; 400 while the container waits to start, as the real kubelet
  answers), ``/eviction``; namespaces: get; discovery and ``/version``.
* Field selectors, watches, PATCH and create-time validation as the real API server does
  them, and kubelet logs that rotate at 10 MiB: ``testing/k8s_semantics.py``.
* Status envelopes (``kind: Status``) for 404/409/422/400.

The fake kubelet (``FakeKubelet``) plays the Job controller and the node: for every Job it
creates the pods (one per completion index, labels ``job-name``, ``controller-uid``,
``batch.kubernetes.io/job-completion-index``, owner reference), "pulls" the image, runs the
init containers then the main container's ``command`` + ``args`` **as a local subprocess**
(argv, no shell) with the container's env, streams stdout/stderr into the pod log, and
reports pod phase (command and args get the kubelet's ``$(VAR)`` expansion first, ``$$``
being its escape), container states (``terminated.exitCode``, timestamps) and the Job's
status (``active``/``succeeded``/``failed``, ``Complete``/``Failed`` conditions). Volume
mounts are emulated the way a container runtime would: a ``persistentVolumeClaim`` whose
claim is in ``volumes`` is that local dir (plus ``subPath``), an ``emptyDir`` is a fresh temp
dir, and paths under a ``mountPath`` in the command, env and ``workingDir`` are rewritten
to the local dir. The image is not used to run anything.

Fault injection, by image name (prefix match, so a tag may follow):

* ``fault/unschedulable``: the pod stays Pending with ``PodScheduled=False``, reason
  ``Unschedulable``, message ``0/3 nodes are available: 3 Insufficient nvidia.com/gpu.``
* ``fault/bad-image``: scheduled, then the container waits with ``ErrImagePull`` and, after
  ``pull_backoff`` seconds, ``ImagePullBackOff``.
* ``fault/stuck-creating``: scheduled, then the container waits in ``ContainerCreating``
  for ever (a volume that never attaches).
* ``FakeKubelet.disrupt(namespace, pod)``: preemption/drain: ``DisruptionTarget`` condition,
  SIGTERM, SIGKILL after ``grace_seconds``; exit code 143 or 137, pod ``Failed``.
* ``KubernetesEmulator.forbidden``: (verb, resource) pairs answered 403 (a Role without them).
* ``FakeKubelet.evict(namespace, pod)`` (or ``POST .../pods/<name>/eviction``): the process is
  killed and the pod ends ``Failed`` with reason ``Evicted``.
* Deleting a running pod kills its process; the Job counts it as failed.

JobSets, Services and a small Kueue come from ``testing/jobset_controller.py`` (see there).

Not modelled: resourceVersion conflicts, PUT (405), multiple regular containers (only the
first runs), pod readiness, authentication (any bearer token is accepted).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .k8s_semantics import (  # relative: the test kit moves as one package
    ContainerLog,
    Stream,
    apply_patch,
    fields_match,
    follow_log,
    invalid,
    job_causes,
    parse_field_selector,
    read_log,
    watch_stream,
    watching,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
LABEL_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
UNSCHEDULABLE_MESSAGE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
BAD_IMAGE_PREFIX = "fault/bad-image"
UNSCHEDULABLE_PREFIX = "fault/unschedulable"
STUCK_PREFIX = "fault/stuck-creating"
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def disruption_condition(reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_iso(),
    }


def now_iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            **({"details": self.details} if getattr(self, "details", None) else {}),
            "code": self.code,
        }


def _validate_labels(labels: Any, where: str) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise ApiError(422, "Invalid", f"{where}: labels must be a map")
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            len(name) > 63
            or not LABEL_KEY_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not re.match(r"^[a-z0-9.-]+$", prefix)))
        ):
            raise ApiError(422, "Invalid", f"{where}: Invalid value: {key!r}: label key")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            raise ApiError(
                422,
                "Invalid",
                f"{where}: Invalid value: {value!r}: a valid label must be an empty string or "
                "consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character",
            )


def parse_selector(text: str | None) -> list[tuple[str, str, Any]]:
    """``a=b,c!=d,e,!f,g in (x,y)`` -> [(op, key, value)]."""
    out: list[tuple[str, str, Any]] = []
    if not text:
        return out
    for part in re.split(r",(?![^(]*\))", text):
        part = part.strip()
        if not part:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part):
            out.append((m.group(2), m.group(1), {v.strip() for v in m.group(3).split(",")}))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            out.append(("!=", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            out.append(("=", k.strip(), v.strip()))
        elif part.startswith("!"):
            out.append(("!", part[1:].strip(), None))
        else:
            out.append(("exists", part, None))
    return out


def selector_matches(selector: list[tuple[str, str, Any]], labels: dict[str, str]) -> bool:
    for op, key, value in selector:
        have = labels.get(key)
        if (
            (op == "=" and have != value)
            or (op == "!=" and have == value)
            or (op == "exists" and key not in labels)
            or (op == "!" and key in labels)
            or (op == "in" and have not in value)
            or (op == "notin" and have in value)
        ):
            return False
    return True


def pod_failure_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> tuple[str, str]:
    """The Job's ``podFailurePolicy`` applied to one failed pod: (action, message).

    Rules are tried in order and the first match wins, as in the Job controller; no match
    (or no policy) means ``Count``.
    """
    name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    conditions = {
        c["type"] for c in pod["status"].get("conditions") or [] if c.get("status") == "True"
    }
    for i, rule in enumerate((policy or {}).get("rules") or []):
        action = rule.get("action", "Count")
        for want in rule.get("onPodConditions") or []:
            if want.get("type") in conditions:
                return (
                    action,
                    f"Pod {name} has condition {want['type']} matching {action} rule at index {i}",
                )
        codes = rule.get("onExitCodes")
        if not codes:
            continue
        for cs in pod["status"].get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term is None or (codes.get("containerName") not in (None, cs["name"])):
                continue
            inside = term["exitCode"] in (codes.get("values") or [])
            if inside == (codes.get("operator") == "In"):
                return action, (
                    f"Container {cs['name']} for pod {name} failed with exit code "
                    f"{term['exitCode']} matching {action} rule at index {i}"
                )
    return "Count", ""


def expand_var_refs(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command/args: ``$$`` is a literal ``$``, a
    reference to an undefined variable stays as written (k8s.io/kubernetes expansion)."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def field_ref(pod: dict[str, Any], path: str) -> str | None:
    """The downward API: the value of ``fieldRef.fieldPath`` for a pod (the common paths)."""
    meta = pod.get("metadata") or {}
    if m := re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path):
        return (meta.get(m.group(1)) or {}).get(m.group(2))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
        "status.podIP": (pod.get("status") or {}).get("podIP"),
        "status.hostIP": (pod.get("status") or {}).get("hostIP"),
    }
    return simple.get(path)


class KubernetesEmulator:
    """The API server: in-memory objects behind real HTTP on 127.0.0.1."""

    def __init__(self, namespaces: tuple[str, ...] = ("default",)):
        self.lock = threading.RLock()
        self.namespaces = set(namespaces)
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        # Extensions (testing/jobset_controller.py): extra routes tried before the built-in
        # ones, controllers run by the kubelet loop, env rewriters applied before a container
        # starts (the emulated pod network).
        self.routes: list[Any] = []
        self.controllers: list[Any] = []
        self.env_rewriters: list[Any] = []
        # RBAC in its simplest form: (verb, resource) pairs the caller may not use, e.g.
        # ("get", "pods/log"); answered 403 Forbidden the way the real API server words it.
        self.forbidden: set[tuple[str, str]] = set()
        self.requests: list[tuple[str, str]] = []
        self._rv = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # Set by FakeKubelet: called (namespace, name, reason) when a pod leaves the API.
        self.on_pod_removed: Any = None
        self.on_evict: Any = None
        # (namespace, pod, container) -> its kubelet log (k8s_semantics.ContainerLog).
        self.container_logs: dict[tuple[str, str, str], ContainerLog] = {}
        # Env var names as Kubernetes < 1.32 validates them (True: 1.32's relaxed rule).
        self.relaxed_env_names = False
        self.stopping = False
        self.down = False  # take_down(): requests on open connections are dropped unanswered
        self._port = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> KubernetesEmulator:
        emulator = self

        class Handler(_Handler):
            emu = emulator

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping = True  # ends open watches and log follows
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def take_down(self) -> None:
        """The API server becomes unreachable, objects kept (the kubelet and controllers go
        on running pods): the listening socket closes, open watches and log follows end,
        and a request on a connection still open is dropped unanswered."""
        if self._server is None:
            return
        self._port = self._server.server_address[1]  # bring_up() serves on the same address
        self.down = True
        self.stop()

    def bring_up(self) -> None:
        """The API server is back on the address it had before ``take_down()``."""
        self.down = False
        self.stopping = False
        self.start()

    def __enter__(self) -> KubernetesEmulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "emulator not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "tester", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(json.dumps(self.kubeconfig(namespace)))
        return path

    def airflow_conn_env(self, conn_id: str, namespace: str | None = None) -> dict[str, str]:
        """``AIRFLOW_CONN_<ID>`` for a kubernetes connection whose extra holds the kubeconfig."""
        extra: dict[str, Any] = {"kube_config": self.kubeconfig(namespace or "default")}
        if namespace:
            extra["namespace"] = namespace
        value = json.dumps({"conn_type": "kubernetes", "extra": extra})
        return {f"AIRFLOW_CONN_{conn_id.upper()}": value}

    # -- object helpers -------------------------------------------------------------------
    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def job_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        ns = job["metadata"]["namespace"]
        return [
            p
            for (pns, _), p in self.pods.items()
            if pns == ns and p["metadata"]["labels"].get("controller-uid") == uid
        ]

    def create_job(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        if ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if meta.get("generateName") and not name:
            name = meta["generateName"] + secrets.token_hex(3)[:5]
        if not DNS_LABEL.match(name) or len(name) > 63:
            raise ApiError(
                422,
                "Invalid",
                f'Job.batch "{name}" is invalid: metadata.name: Invalid value: "{name}": must '
                "be no more than 63 characters and a lowercase RFC 1123 label",
            )
        _validate_labels(meta.get("labels"), "metadata.labels")
        if causes := job_causes(body, self.relaxed_env_names):
            raise invalid("Job", "batch", name, causes)
        spec = body.get("spec") or {}
        template = spec.get("template") or {}
        pod_spec = template.get("spec") or {}
        _validate_labels((template.get("metadata") or {}).get("labels"), "spec.template.labels")
        containers = pod_spec.get("containers") or []
        if not containers:
            raise ApiError(422, "Invalid", "spec.template.spec.containers: Required value")
        for c in containers + (pod_spec.get("initContainers") or []):
            if not c.get("name") or not DNS_LABEL.match(c["name"]):
                raise ApiError(422, "Invalid", f"container name {c.get('name')!r} is invalid")
            if not c.get("image"):
                raise ApiError(422, "Invalid", f"containers[{c['name']}].image: Required value")
        if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
            raise ApiError(
                422,
                "Invalid",
                "spec.template.spec.restartPolicy: Unsupported value: supported values: "
                '"OnFailure", "Never"',
            )
        if spec.get("completionMode") == "Indexed" and not spec.get("completions"):
            raise ApiError(422, "Invalid", "spec.completions: Required value for Indexed")
        with self.lock:
            if (ns, name) in self.jobs:
                raise ApiError(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            job = json.loads(json.dumps(body))
            uid = str(uuid.uuid4())
            job["apiVersion"], job["kind"] = "batch/v1", "Job"
            m = job.setdefault("metadata", {})
            m.update(
                name=name,
                namespace=ns,
                uid=uid,
                resourceVersion=self.next_rv(),
                creationTimestamp=now_iso(),
                generation=1,
            )
            m.setdefault("labels", {})
            s = job.setdefault("spec", {})
            s.setdefault("backoffLimit", 6)
            s.setdefault("completions", 1)
            s.setdefault("parallelism", 1)
            s.setdefault("completionMode", "NonIndexed")
            s["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tmeta = s["template"].setdefault("metadata", {})
            tlabels = tmeta.setdefault("labels", {})
            for key in JOB_NAME_LABELS:
                tlabels[key] = name
            for key in UID_LABELS:
                tlabels[key] = uid
            job["status"] = {"startTime": now_iso(), "active": 0}
            job["_created"] = time.time()
            job["_failed_indexes"] = []
            self.jobs[(ns, name)] = job
            return job

    def delete_job(self, ns: str, name: str, propagation: str | None) -> dict[str, Any]:
        with self.lock:
            job = self.jobs.pop((ns, name), None)
            if job is None:
                raise ApiError(404, "NotFound", f'jobs.batch "{name}" not found')
            if propagation in ("Background", "Foreground"):
                for pod in self.job_pods(job):
                    self.delete_pod(ns, pod["metadata"]["name"])
            else:  # orphaned pods lose their owner
                for pod in self.job_pods(job):
                    pod["metadata"]["ownerReferences"] = []
            return job

    def delete_pod(self, ns: str, name: str, reason: str = "deleted") -> dict[str, Any]:
        with self.lock:
            pod = self.pods.pop((ns, name), None)
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if self.on_pod_removed is not None:
            self.on_pod_removed(ns, name, reason)
        return pod

    def create_service(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        name = (body.get("metadata") or {}).get("name") or ""
        if not DNS_LABEL.match(name) or len(name) > 63:
            raise ApiError(422, "Invalid", f'Service "{name}" is invalid: metadata.name')
        with self.lock:
            if (ns, name) in self.services:
                raise ApiError(409, "AlreadyExists", f'services "{name}" already exists')
            svc = json.loads(json.dumps(body))
            svc["apiVersion"], svc["kind"] = "v1", "Service"
            svc["metadata"].update(
                namespace=ns,
                uid=str(uuid.uuid4()),
                resourceVersion=self.next_rv(),
                creationTimestamp=now_iso(),
            )
            svc.setdefault("spec", {}).setdefault("clusterIP", "10.0.0.1")
            self.services[(ns, name)] = svc
            return svc

    def delete_owned(self, ns: str, owner_uid: str) -> None:
        """Garbage collection of the Services an object owned (its delete cascades)."""
        with self.lock:
            for key, svc in list(self.services.items()):
                refs = svc["metadata"].get("ownerReferences") or []
                if key[0] == ns and any(r.get("uid") == owner_uid for r in refs):
                    del self.services[key]

    def check_access(self, verb: str, resource: str, ns: str, name: str | None) -> None:
        if (verb, resource) in self.forbidden:
            group = resource.split("/")[0]
            api_group = {"jobs": "batch", "jobsets": "jobset.x-k8s.io"}.get(group, "")
            what = f'{group} "{name}"' if name else group
            raise ApiError(
                403,
                "Forbidden",
                f'{what} is forbidden: User "system:serviceaccount:{ns}:accelmatrix" cannot '
                f'{verb} resource "{resource}" in API group "{api_group}" in the namespace '
                f'"{ns}"',
            )

    def public(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    def state(self) -> dict[str, Any]:
        with self.lock:
            return json.loads(
                json.dumps(
                    {
                        "jobs": {f"{ns}/{n}": self.public(j) for (ns, n), j in self.jobs.items()},
                        "pods": {f"{ns}/{n}": p for (ns, n), p in self.pods.items()},
                        "services": {f"{ns}/{n}": v for (ns, n), v in self.services.items()},
                    }
                )
            )


_DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": "batch",
                "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"},
            },
            {
                "name": "jobset.x-k8s.io",
                "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
                "preferredVersion": {
                    "groupVersion": "jobset.x-k8s.io/v1alpha2",
                    "version": "v1alpha2",
                },
            },
            {
                "name": "kueue.x-k8s.io",
                "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}],
                "preferredVersion": {
                    "groupVersion": "kueue.x-k8s.io/v1beta1",
                    "version": "v1beta1",
                },
            },
        ],
    },
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["delete", "deletecollection", "get", "list"],
                "shortNames": ["po"],
            },
            {
                "name": "pods/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            },
            {
                "name": "services",
                "singularName": "service",
                "namespaced": True,
                "kind": "Service",
                "verbs": ["create", "delete", "get", "list"],
                "shortNames": ["svc"],
            },
            {
                "name": "namespaces",
                "singularName": "namespace",
                "namespaced": False,
                "kind": "Namespace",
                "verbs": ["get"],
                "shortNames": ["ns"],
            },
        ],
    },
    "/apis/batch/v1": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "batch/v1",
        "resources": [
            {
                "name": "jobs",
                "singularName": "job",
                "namespaced": True,
                "kind": "Job",
                "verbs": ["create", "delete", "get", "list"],
                "categories": ["all"],
            },
            {
                "name": "jobs/status",
                "singularName": "",
                "namespaced": True,
                "kind": "Job",
                "verbs": ["get"],
            },
        ],
    },
    "/apis/jobset.x-k8s.io/v1alpha2": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "jobset.x-k8s.io/v1alpha2",
        "resources": [
            {
                "name": "jobsets",
                "singularName": "jobset",
                "namespaced": True,
                "kind": "JobSet",
                "verbs": ["create", "delete", "get", "list"],
            }
        ],
    },
    "/apis/kueue.x-k8s.io/v1beta1": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "kueue.x-k8s.io/v1beta1",
        "resources": [
            {
                "name": "workloads",
                "singularName": "workload",
                "namespaced": True,
                "kind": "Workload",
                "verbs": ["get", "list"],
            }
        ],
    },
    "/version": {"major": "1", "minor": "32", "gitVersion": "v1.32.0-accelmatrix-emulator"},
}

_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+)(?:/(status))?)?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(?:/(log|eviction|status))?)?$")
_NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
_SERVICES = re.compile(r"^/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?$")


class _Handler(BaseHTTPRequestHandler):
    emu: KubernetesEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):  # a client went away: not an error
            self.close_connection = True

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw(self) -> bytes:
        if not hasattr(self, "_raw_body"):
            length = int(self.headers.get("Content-Length") or 0)
            self._raw_body = self.rfile.read(length) if length else b""
        return self._raw_body

    def _body(self) -> dict[str, Any]:
        raw = self._raw()
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "request body is not JSON") from None
        return data if isinstance(data, dict) else {}

    def _dispatch(self, method: str) -> None:
        if self.emu.down:  # an outage: the connection drops, no answer
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.emu.requests.append((method, self.path))
        if hasattr(self, "_raw_body"):
            del self._raw_body  # keep-alive: the next request has its own body
        try:
            code, body = self._route(method, path, query)
        except ApiError as e:
            code, body = e.code, e.body()
        if isinstance(body, Stream):
            self._send_stream(code, body)
        elif isinstance(body, bytes):
            self._send(code, body, "text/plain")
        else:
            self._send(code, body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def _send_stream(self, code: int, stream: Stream) -> None:
        """A chunked response written as it is produced (watches, ``follow=true`` logs)."""
        self.send_response(code)
        self.send_header("Content-Type", stream.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in stream.chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True

    def _patch(self, store: dict, key: tuple[str, str], kind: str, group: str, what: str):
        with self.emu.lock:
            obj = store.get(key)
            if obj is None:
                raise ApiError(404, "NotFound", f'{what} "{key[1]}" not found')
            new = apply_patch(obj, self.headers.get("Content-Type"), self._raw(), kind, group)
            new["metadata"]["resourceVersion"] = self.emu.next_rv()
            store[key] = new
            return 200, self.emu.public(new)

    def _route(self, method: str, path: str, q: dict[str, str]) -> tuple[int, Any]:
        emu = self.emu

        def body() -> dict[str, Any]:
            return self._body()

        body.raw = self._raw  # type: ignore[attr-defined] # PATCH: the patch as sent
        body.content_type = self.headers.get("Content-Type")  # type: ignore[attr-defined]
        for route in emu.routes:
            answer = route(method, path, q, body)
            if answer is not None:
                return answer
        if method == "GET" and path in _DISCOVERY:
            return 200, _DISCOVERY[path]
        if m := _SERVICES.match(path):
            ns, name = m.groups()
            if name is None and method == "GET":
                return 200, self._list("ServiceList", "v1", emu.services, q, ns=ns)
            if name is not None and method == "PATCH":
                return self._patch(emu.services, (ns, name), "Service", "", "services")
            if name is None and method == "POST":
                return 201, emu.create_service(ns, self._body())
            if name is not None and method == "GET":
                with emu.lock:
                    svc = emu.services.get((ns, name))
                if svc is None:
                    raise ApiError(404, "NotFound", f'services "{name}" not found')
                return 200, svc
            if name is not None and method == "DELETE":
                with emu.lock:
                    svc = emu.services.pop((ns, name), None)
                if svc is None:
                    raise ApiError(404, "NotFound", f'services "{name}" not found')
                return 200, svc
        if method == "GET" and path == "/apis/batch/v1/jobs":
            return 200, self._list("JobList", "batch/v1", emu.jobs, q)
        if m := _NAMESPACE.match(path):
            if method == "GET" and m.group(1) in emu.namespaces:
                return 200, {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": m.group(1)},
                    "status": {"phase": "Active"},
                }
            raise ApiError(404, "NotFound", f'namespaces "{m.group(1)}" not found')
        if m := _JOBS.match(path):
            ns, name, _sub = m.groups()
            if name is None and method == "GET":
                return 200, self._list("JobList", "batch/v1", emu.jobs, q, ns=ns)
            if name is None and method == "POST":
                return 201, emu.public(emu.create_job(ns, self._body()))
            if name is not None and method == "GET":
                with emu.lock:
                    job = emu.jobs.get((ns, name))
                    if job is None:
                        raise ApiError(404, "NotFound", f'jobs.batch "{name}" not found')
                    return 200, emu.public(job)
            if name is not None and method == "PATCH" and _sub is None:
                emu.check_access("patch", "jobs", ns, name)
                return self._patch(emu.jobs, (ns, name), "Job", "batch", "jobs.batch")
            if name is not None and method == "DELETE":
                body = self._body()
                policy = q.get("propagationPolicy") or body.get("propagationPolicy")
                job = emu.delete_job(ns, name, policy)
                return 200, emu.public(job)
        if m := _PODS.match(path):
            ns, name, sub = m.groups()
            verb = {
                "GET": "get" if name else "list",
                "DELETE": "delete",
                "POST": "create",
                "PATCH": "patch",
                "PUT": "update",
            }[method]
            if name is None and method == "DELETE":
                verb = "deletecollection"
            emu.check_access(verb, f"pods/{sub}" if sub else "pods", ns, name)
            if name is None and method == "GET" and watching(q):
                return 200, self._list("PodList", "v1", emu.pods, q, ns=ns)
            if name is None and method in ("GET", "DELETE"):
                selector = parse_selector(q.get("labelSelector"))
                fields = parse_field_selector(q.get("fieldSelector"), "Pod")
                with emu.lock:
                    pods = [
                        p
                        for (pns, _), p in emu.pods.items()
                        if pns == ns
                        and selector_matches(selector, p["metadata"]["labels"])
                        and fields_match(fields, p)
                    ]
                if method == "DELETE":
                    for p in pods:
                        try:
                            emu.delete_pod(ns, p["metadata"]["name"])
                        except ApiError:
                            pass
                return 200, self._list("PodList", "v1", pods, {})
            if name is not None and sub is None and method == "GET":
                with emu.lock:
                    pod = emu.pods.get((ns, name))
                if pod is None:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found')
                return 200, pod
            if name is not None and sub is None and method == "DELETE":
                return 200, emu.delete_pod(ns, name)
            if name is not None and sub is None and method == "PATCH":
                return self._patch(emu.pods, (ns, name), "Pod", "", "pods")
            if sub == "log" and method == "GET":
                return 200, self._log(ns, name, q)
            if sub == "eviction" and method == "POST":
                if (ns, name) not in emu.pods:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found')
                if emu.on_evict is not None:
                    emu.on_evict(ns, name)
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if method in ("PUT", "PATCH"):
            raise ApiError(
                405,
                "MethodNotAllowed",
                f"the server does not allow this method on the requested resource ({method} {path})",
            )
        raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")

    def _list(
        self,
        kind: str,
        api: str,
        items: list[dict[str, Any]] | dict[tuple[str, str], dict[str, Any]],
        q: dict[str, str],
        ns: str | None = None,
    ):
        """A list (``labelSelector``, ``fieldSelector``, ``limit``), or with ``watch=true``
        its watch stream. ``items`` may be a store (watches re-read it)."""
        selector = parse_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), kind.removesuffix("List"))

        def pick() -> list[dict[str, Any]]:
            with self.emu.lock:
                objs = (
                    [o for (ons, _), o in items.items() if ns is None or ons == ns]
                    if isinstance(items, dict)
                    else items
                )
                return [
                    json.loads(json.dumps(self.emu.public(o)))
                    for o in objs
                    if selector_matches(selector, o["metadata"].get("labels") or {})
                    and fields_match(fields, o)
                ]

        if watching(q):
            return watch_stream(pick, q, lambda: self.emu.stopping)
        with self.emu.lock:
            chosen = pick()
            chosen.sort(key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
            limit = int(q.get("limit") or 0)
            return {
                "apiVersion": api,
                "kind": kind,
                "metadata": {"resourceVersion": str(self.emu._rv)},
                "items": chosen[:limit] if limit else chosen,
            }

    def _log(self, ns: str, name: str, q: dict[str, str]) -> bytes | Stream:
        with self.emu.lock:
            pod = self.emu.pods.get((ns, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            names = [c["name"] for c in pod["spec"]["containers"]]
            names += [c["name"] for c in pod["spec"].get("initContainers") or []]
            container = q.get("container") or pod["spec"]["containers"][0]["name"]
            if container not in names:
                raise ApiError(
                    400, "BadRequest", f"container {container} is not valid for pod {name}"
                )
            log = self.emu.container_logs.get((ns, name, container))
        if (q.get("previous") or "").lower() in ("true", "1"):  # containers never restart here
            raise ApiError(
                400,
                "BadRequest",
                f'previous terminated container "{container}" in pod "{name}" not found',
            )
        if log is None:
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        if (q.get("follow") or "").lower() in ("true", "1"):
            return follow_log(log, q, lambda: self.emu.stopping or (ns, name) not in self.emu.pods)
        return read_log(log, q)


class _Empty:
    """A pipe that has closed (a container that never started)."""

    def readline(self, _limit: int = -1) -> bytes:
        return b""


class FakeKubelet:
    """Plays the Job controller and one node: pods for Jobs, local processes for containers."""

    def __init__(
        self,
        emulator: KubernetesEmulator,
        root: Path,
        volumes: dict[str, Path] | None = None,
        tick: float = 0.05,
        pull_backoff: float = 0.5,
        grace_seconds: float = 3.0,
        log_max_bytes: int = 10 * 1024 * 1024,
    ):
        self.emu = emulator
        self.root = Path(root)
        self.volumes = {k: Path(v) for k, v in (volumes or {}).items()}
        self.tick = tick
        self.pull_backoff = pull_backoff
        self.grace_seconds = grace_seconds
        self.log_max_bytes = log_max_bytes  # the kubelet's containerLogMaxSize
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}
        self.removed: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        emulator.on_pod_removed = self._pod_removed
        emulator.on_evict = self.evict

    def start(self) -> FakeKubelet:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fake-kubelet")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for key in list(self.procs):
            self._kill(key)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------------
    def evict(
        self, ns: str, name: str, message: str = "The node was low on resource: memory."
    ) -> None:
        with self.emu.lock:
            pod = self.emu.pods.get((ns, name))
            if pod is None:
                return
            pod["_evicted"] = True
        self._kill((ns, name))
        with self.emu.lock:
            st = pod["status"]
            st.update(phase="Failed", reason="Evicted", message=message)
            st["conditions"] = [
                c for c in st.get("conditions") or [] if c["type"] != "DisruptionTarget"
            ] + [disruption_condition("EvictionByEvictionAPI", "Eviction API: evicting")]
            for cs in st.get("containerStatuses") or []:
                if "running" in cs.get("state", {}):
                    cs["state"] = {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "startedAt": cs["state"]["running"]["startedAt"],
                            "finishedAt": now_iso(),
                        }
                    }
            pod["metadata"]["resourceVersion"] = self.emu.next_rv()

    def disrupt(
        self,
        ns: str,
        name: str,
        reason: str = "PreemptionByScheduler",
        message: str = "Preempted in order to admit critical pod",
    ) -> None:
        """Stop a running pod the way the cluster does when it preempts or drains a node.

        The pod gets the ``DisruptionTarget`` condition first, then its container SIGTERM,
        and SIGKILL after ``grace_seconds``: it ends ``Failed`` with exit code 143 (it
        stopped on SIGTERM) or 137 (it had to be killed), like a real kubelet reports it.
        The pod stays in the API (its controller decides what to do).
        """
        with self.emu.lock:
            pod = self.emu.pods.get((ns, name))
            if pod is None:
                return
            st = pod["status"]
            st["conditions"] = [
                c for c in st.get("conditions") or [] if c["type"] != "DisruptionTarget"
            ] + [disruption_condition(reason, message)]
            pod["metadata"]["resourceVersion"] = self.emu.next_rv()
            proc = self.procs.get((ns, name))
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.grace_seconds)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    # -- controller loop ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as e:  # keep the fake cluster alive; tests see the symptom
                print(f"fake kubelet: {e!r}")
            self._stop.wait(self.tick)

    def _reconcile(self) -> None:
        for controller in list(self.emu.controllers):
            controller()
        with self.emu.lock:
            jobs = list(self.emu.jobs.values())
        for job in jobs:
            with self.emu.lock:
                if (job["metadata"]["namespace"], job["metadata"]["name"]) not in self.emu.jobs:
                    continue
                self._reconcile_job(job)

    def _reconcile_job(self, job: dict[str, Any]) -> None:
        spec, status = job["spec"], job["status"]
        ns = job["metadata"]["namespace"]
        conditions = status.setdefault("conditions", [])
        finished = any(c["type"] in ("Complete", "Failed") for c in conditions)
        if finished:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() - job.get("_finished", time.time()) >= ttl:
                self.emu.delete_job(ns, job["metadata"]["name"], "Background")
            return
        pods = self.emu.job_pods(job)
        indexed = spec.get("completionMode") == "Indexed"
        completions = int(spec.get("completions") or 1)
        by_index: dict[int, list[dict[str, Any]]] = {}
        for p in pods:
            by_index.setdefault(int(p["metadata"]["labels"].get(INDEX_LABEL, 0)), []).append(p)
        for p in pods:
            if p["status"]["phase"] == "Failed" and not p.get("_counted"):
                p["_counted"] = True
                action, message = pod_failure_action(spec.get("podFailurePolicy"), p)
                if action == "Ignore":
                    continue
                job["_failed_indexes"].append(p["metadata"]["name"])
                if action == "FailJob" and "_pfp" not in job:
                    job["_pfp"] = message
        failed = len(job["_failed_indexes"])
        succeeded = set()
        active = 0
        for i in range(completions if indexed else 1):
            mine = by_index.get(i, [])
            phases = [p["status"]["phase"] for p in mine]
            if "Succeeded" in phases:
                succeeded.add(i)
            elif any(ph in ("Pending", "Running") for ph in phases):
                active += 1
            elif failed <= int(spec.get("backoffLimit", 6)) and "_pfp" not in job:
                self._create_pod(job, i if indexed else None)
                active += 1
        status.update(active=active, succeeded=len(succeeded), failed=failed)
        if not indexed and succeeded:
            status["succeeded"] = completions
        deadline = spec.get("activeDeadlineSeconds")
        reason = None
        if "_pfp" in job:
            reason = ("PodFailurePolicy", job["_pfp"])
        elif failed > int(spec.get("backoffLimit", 6)):
            reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif deadline is not None and time.time() - job["_created"] > deadline:
            reason = ("DeadlineExceeded", "Job was active longer than specified deadline")
        if reason:
            for p in pods:
                if p["status"]["phase"] in ("Pending", "Running"):
                    self.emu.delete_pod(ns, p["metadata"]["name"], reason="job failed")
            conditions.append(self._condition("Failed", *reason))
            status["active"] = 0
            job["_finished"] = time.time()
        elif status["succeeded"] >= completions:
            conditions.append(self._condition("Complete", "CompletionsReached", ""))
            status["completionTime"] = now_iso()
            job["_finished"] = time.time()
        job["metadata"]["resourceVersion"] = self.emu.next_rv()

    @staticmethod
    def _condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": now_iso(),
            "lastTransitionTime": now_iso(),
        }

    def _create_pod(self, job: dict[str, Any], index: int | None) -> None:
        ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = json.loads(json.dumps(job["spec"]["template"]))
        suffix = secrets.token_hex(3)[:5]
        name = f"{job_name}-{index}-{suffix}" if index is not None else f"{job_name}-{suffix}"
        meta = template.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        if index is not None:
            labels[INDEX_LABEL] = str(index)
            annotations[INDEX_ANNOTATION] = str(index)
        spec = template["spec"]
        spec.setdefault("serviceAccountName", "default")
        if index is not None and spec.get("subdomain"):
            spec["hostname"] = f"{job_name}-{index}"  # what the Job controller sets
        if index is not None:
            for c in spec["containers"] + (spec.get("initContainers") or []):
                c.setdefault("env", []).append(
                    {"name": "JOB_COMPLETION_INDEX", "value": str(index)}
                )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "labels": labels,
                "annotations": annotations,
                "creationTimestamp": now_iso(),
                "resourceVersion": self.emu.next_rv(),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job_name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": []},
        }
        self.emu.pods[(ns, name)] = pod
        threading.Thread(target=self._run_pod, args=(ns, name), daemon=True).start()

    # -- the node ---------------------------------------------------------------------------
    def _alive(self, key: tuple[str, str]) -> dict[str, Any] | None:
        with self.emu.lock:
            pod = self.emu.pods.get(key)
            return None if pod is None or pod.get("_evicted") else pod

    def _update(self, key: tuple[str, str], **status: Any) -> bool:
        with self.emu.lock:
            pod = self.emu.pods.get(key)
            if pod is None or pod.get("_evicted"):
                return False
            pod["status"].update(status)
            pod["metadata"]["resourceVersion"] = self.emu.next_rv()
            return True

    def _run_pod(self, ns: str, name: str) -> None:
        key = (ns, name)
        pod = self._alive(key)
        if pod is None:
            return
        spec = pod["spec"]
        images = [c["image"] for c in spec["containers"] + (spec.get("initContainers") or [])]
        time.sleep(self.tick)
        if any(i.startswith(UNSCHEDULABLE_PREFIX) for i in images):
            self._update(
                key,
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE_MESSAGE,
                        "lastTransitionTime": now_iso(),
                    }
                ],
            )
            return
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}
        with self.emu.lock:
            spec["nodeName"] = "fake-node-1"
        pod_dir = self.root / "pods" / f"{ns}_{name}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(spec, pod_dir)
        inits = spec.get("initContainers") or []
        waiting = [self._waiting(c, "ContainerCreating") for c in spec["containers"]]
        self._update(
            key,
            conditions=[scheduled],
            hostIP="127.0.0.1",
            podIP="127.0.0.1",
            startTime=now_iso(),
            initContainerStatuses=[self._waiting(c, "PodInitializing") for c in inits] or None,
            containerStatuses=waiting,
        )
        if any(i.startswith(STUCK_PREFIX) for i in images):
            return  # a volume that never attaches: ContainerCreating for ever
        bad = next((i for i in images if i.startswith(BAD_IMAGE_PREFIX)), None)
        if bad:
            message = (
                f'failed to pull and unpack image "docker.io/{bad}:latest": failed to resolve '
                f'reference "docker.io/{bad}:latest": pull access denied, repository does not '
                "exist or may require authorization"
            )
            statuses = [self._waiting(c, "ErrImagePull", message) for c in spec["containers"]]
            self._update(key, containerStatuses=statuses)
            time.sleep(self.pull_backoff)
            statuses = [
                self._waiting(c, "ImagePullBackOff", f'Back-off pulling image "{bad}"')
                for c in spec["containers"]
            ]
            self._update(key, containerStatuses=statuses)
            return
        init_statuses: list[dict[str, Any]] = []
        for c in inits:
            state = self._run_container(key, c, mounts, pod_dir)
            if state is None:
                return
            init_statuses.append(self._status(c, {"terminated": state}))
            rest = [self._waiting(x, "PodInitializing") for x in inits[len(init_statuses) :]]
            self._update(key, initContainerStatuses=init_statuses + rest)
            if state["exitCode"] != 0:
                self._update(key, phase="Failed")
                return
        main = spec["containers"][0]
        self._update(key, phase="Running")
        state = self._run_container(key, main, mounts, pod_dir)
        if state is None:
            return
        statuses = [self._status(main, {"terminated": state})] + [
            self._status(c, {"terminated": {**state, "exitCode": 0}})
            for c in spec["containers"][1:]
        ]
        self._update(
            key,
            containerStatuses=statuses,
            phase="Succeeded" if state["exitCode"] == 0 else "Failed",
        )

    @staticmethod
    def _waiting(c: dict[str, Any], reason: str, message: str | None = None) -> dict[str, Any]:
        state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return FakeKubelet._status(c, state)

    @staticmethod
    def _status(c: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": "running" in state,
            "restartCount": 0,
            "started": "running" in state,
            "state": state,
        }

    def _volumes(self, spec: dict[str, Any], pod_dir: Path) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for v in spec.get("volumes") or []:
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                if claim not in self.volumes:
                    raise RuntimeError(f"no local dir for claim {claim!r}")
                out[v["name"]] = self.volumes[claim]
            else:  # emptyDir and anything else: a fresh dir per pod
                out[v["name"]] = pod_dir / "volumes" / v["name"]
                out[v["name"]].mkdir(parents=True, exist_ok=True)
        return out

    def _run_container(
        self, key: tuple[str, str], c: dict[str, Any], vols: dict[str, Path], pod_dir: Path
    ) -> dict[str, Any] | None:
        """Run one container to the end; its terminated state (None if the pod went away)."""
        mounts: list[tuple[str, Path]] = []
        for m in c.get("volumeMounts") or []:
            local = vols[m["name"]] / (m.get("subPath") or "")
            local.mkdir(parents=True, exist_ok=True)
            mounts.append((m["mountPath"].rstrip("/"), local))
        mounts.sort(key=lambda x: -len(x[0]))

        def translate(s: str) -> str:
            for mount, local in mounts:
                if s == mount or s.startswith(mount + "/"):
                    return str(local) + s[len(mount) :]
            return s

        raw_argv = (c.get("command") or []) + (c.get("args") or [])
        with self.emu.lock:
            pod = json.loads(json.dumps(self.emu.pods.get(key) or {}))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(pod_dir),
            "HOSTNAME": (pod.get("spec") or {}).get("hostname") or key[1],
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        }
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = translate(str(e["value"]))
            elif "fieldRef" in (e.get("valueFrom") or {}) and pod:
                value = field_ref(pod, e["valueFrom"]["fieldRef"].get("fieldPath", ""))
                if value is not None:
                    env[e["name"]] = value
        # The kubelet expands $(VAR) in command/args from the container's own env.
        declared = {e["name"]: env[e["name"]] for e in c.get("env") or [] if e["name"] in env}
        for rewrite in list(self.emu.env_rewriters):
            env = rewrite(pod, c, env)
        declared = {k: env.get(k, v) for k, v in declared.items()}
        argv = [translate(expand_var_refs(a, declared)) for a in raw_argv]
        cwd = translate(c.get("workingDir") or str(pod_dir))
        log = ContainerLog(pod_dir / f"{c['name']}.log", self.log_max_bytes)
        started = now_iso()
        with self.emu.lock:
            self.emu.container_logs[(key[0], key[1], c["name"])] = log
        # The container runtime copies the output into the kubelet's log file (pump).
        try:
            proc = subprocess.Popen(  # noqa: S603 (argv list, no shell)
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            log.write(f"exec failed: {e}".encode())
            log.pump(_Empty())
            return {
                "exitCode": 128,
                "reason": "StartError",
                "message": str(e),
                "startedAt": started,
                "finishedAt": now_iso(),
            }
        pump = threading.Thread(target=log.pump, args=(proc.stdout,), daemon=True)
        pump.start()
        with self.emu.lock:
            if key not in self.emu.pods:
                proc.kill()
                return None
            self.procs[key] = proc
            pod = self.emu.pods[key]
            field = (
                "initContainerStatuses"
                if any(x["name"] == c["name"] for x in pod["spec"].get("initContainers") or [])
                else "containerStatuses"
            )
            statuses = pod["status"].get(field) or []
            pod["status"][field] = [
                self._status(c, {"running": {"startedAt": started}})
                if s["name"] == c["name"]
                else s
                for s in statuses
            ]
        code = proc.wait()
        pump.join(timeout=10)  # the log is complete before the container is terminated
        if proc.stdout is not None:
            proc.stdout.close()
        with self.emu.lock:
            self.procs.pop(key, None)
        if self._alive(key) is None:
            return None
        return {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now_iso(),
        }

    def _kill(self, key: tuple[str, str]) -> None:
        proc = self.procs.get(key)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=3)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    def _pod_removed(self, ns: str, name: str, reason: str) -> None:
        self.removed.add((ns, name))
        self._kill((ns, name))
        # A pod deleted before it finished counts as a failure of its Job (controller view).
        with self.emu.lock:
            for job in self.emu.jobs.values():
                if job["metadata"]["namespace"] != ns:
                    continue
                if name.startswith(job["metadata"]["name"] + "-") and reason == "deleted":
                    if name not in job["_failed_indexes"]:
                        job["_failed_indexes"].append(name)


class Cluster:
    """Emulator + fake kubelet as one context manager (what the tests use)."""

    def __init__(
        self,
        root: Path,
        namespaces: tuple[str, ...] = ("default",),
        kueue_mode: str = "admit",
        **kubelet: Any,
    ):
        from accelmatrix_testkit.jobset_controller import JobSetController

        self.root = Path(root)
        self.emulator = KubernetesEmulator(namespaces)
        # JobSet + Kueue (testing/jobset_controller.py): `cluster.jobsets.kueue_mode`,
        # `cluster.jobsets.evict(ns, name)`.
        self.jobsets = JobSetController(self.emulator, kueue_mode=kueue_mode)
        self.kubelet_kwargs = kubelet
        self.kubelet: FakeKubelet | None = None

    def __enter__(self) -> Cluster:
        self.emulator.start()
        self.kubelet = FakeKubelet(self.emulator, self.root, **self.kubelet_kwargs).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        self.emulator.stop()


def _main() -> None:  # pragma: no cover - manual use
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", action="append", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="k8s-emulator-"))
    with Cluster(root, tuple(args.namespace or ["default"])) as cluster:
        print(f"serving on {cluster.emulator.url}; kubelet root {root}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    _main()
