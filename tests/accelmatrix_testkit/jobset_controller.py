"""JobSet and a small Kueue for the Kubernetes API emulator (``k8s_emulator``).

Plugged into a running ``KubernetesEmulator`` + ``FakeKubelet`` (``Cluster`` does it), this
serves ``jobset.x-k8s.io/v1alpha2`` JobSets (create with validation, get, list with label
selectors, delete with cascade) and ``kueue.x-k8s.io/v1beta1`` Workloads (get/list), and
plays both controllers:

* **JobSet controller**: one child Job per replicated job and replica, named
  ``<jobset>-<replicated job>-<index>`` and labelled/annotated like the real controller
  (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``, ``job-index``,
  ``restart-attempt``...), with ``subdomain`` set so the Job controller gives each pod the
  hostname ``<job>-<completion index>``; the headless Service (``network``); the failure
  policy (rules by Job failure reason, ``FailJobSet``/``RestartJobSet``/
  ``RestartJobSetAndIgnoreMaxRestarts``, ``maxRestarts``; a failed JobSet deletes its
  still-active Jobs); the success policy (``All``/``Any`` of target replicated jobs);
  ``ttlSecondsAfterFinished``; ``suspend`` (a suspended JobSet has no Jobs).
  Validation as the JobSet webhook does it: a pod hostname derived from the JobSet must fit
  63 characters (422 otherwise).
* **Kueue**: a JobSet labelled ``kueue.x-k8s.io/queue-name`` is suspended on creation (the
  Kueue webhook does that) and gets a Workload labelled ``kueue.x-k8s.io/job-uid``. The
  ``kueue_mode`` knob decides: ``admit`` (admitted at the next tick), ``hold`` (stays
  pending with an "insufficient quota" message). ``evict(ns, name)`` preempts an admitted
  one: Workload ``Evicted`` (reason ``Preempted``), JobSet suspended, its pods stopped.
* **Pod network**: pods share the host's loopback, so the kubelet's environment rewriter
  maps what DNS would resolve: ``<hostname>.<subdomain>[.<ns>[.svc[.cluster.local]]]`` of a
  JobSet whose headless Service exists becomes ``127.0.0.1``, and each port a container
  declares (``ports[].containerPort``) becomes a free loopback port per JobSet, wherever
  it appears as ``host:port`` or as the value of a ``*_PORT`` variable. Two JobSets with the
  same ``MASTER_PORT`` therefore do not collide, as they would not on separate pod IPs.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import threading
import time
import uuid
from typing import Any

from accelmatrix_testkit.k8s_emulator import (
    DNS_LABEL,
    ApiError,
    KubernetesEmulator,
    now_iso,
    parse_selector,
    selector_matches,
)

from .k8s_semantics import (  # relative: the test kit moves as one package
    apply_patch,
    fields_match,
    parse_field_selector,
    watch_stream,
    watching,
)

GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
KUEUE = "kueue.x-k8s.io/v1beta1"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RJOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART = "jobset.sigs.k8s.io/restart-attempt"
QUEUE = "kueue.x-k8s.io/queue-name"
JOB_UID = "kueue.x-k8s.io/job-uid"
INSUFFICIENT = (
    "couldn't assign flavors to pod set {rjob}: insufficient unused quota for "
    "nvidia.com/gpu in flavor default-flavor, {n} more needed"
)
_JOBSETS = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/([^/]+)/jobsets(?:/([^/]+))?$")
_WORKLOADS = re.compile(
    r"^/apis/kueue\.x-k8s\.io/v1beta1/namespaces/([^/]+)/workloads(?:/([^/]+))?$"
)


def _cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_iso(),
    }


def _set_cond(obj: dict[str, Any], cond: dict[str, Any]) -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c["type"] == cond["type"]:
            if c["status"] != cond["status"] or c.get("reason") != cond.get("reason"):
                conds[i] = cond
            return
    conds.append(cond)


def _true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


class JobSetController:
    """The JobSet API + controller and a minimal Kueue, on top of a KubernetesEmulator."""

    def __init__(self, emu: KubernetesEmulator, kueue_mode: str = "admit"):
        self.emu = emu
        self.kueue_mode = kueue_mode
        self.jobsets: dict[tuple[str, str], dict[str, Any]] = {}
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.ports: dict[tuple[str, int], int] = {}
        self._ports_lock = threading.Lock()
        emu.routes.append(self.route)
        emu.controllers.append(self.reconcile)
        emu.env_rewriters.append(self.rewrite_env)

    # -- API -------------------------------------------------------------------------------
    def route(self, method: str, path: str, q: dict[str, str], body: Any) -> Any:
        if path == "/apis" and method == "GET":
            return None  # the built-in discovery answers; see _discovery below
        if m := _JOBSETS.match(path):
            ns, name = m.groups()
            verb = {
                "GET": "get" if name else "list",
                "POST": "create",
                "DELETE": "delete",
                "PATCH": "patch",
            }
            self.emu.check_access(verb.get(method, method.lower()), "jobsets", ns, name)
            if name is None and method == "GET":
                return 200, self._list("JobSetList", self.jobsets, ns, q)
            if name is None and method == "POST":
                return 201, self.emu.public(self.create(ns, body()))
            if name is not None and method == "GET":
                with self.emu.lock:
                    js = self.jobsets.get((ns, name))
                    if js is None:
                        raise ApiError(
                            404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found'
                        )
                    return 200, self.emu.public(js)
            if name is not None and method == "DELETE":
                return 200, self.emu.public(self.delete(ns, name))
            if name is not None and method == "PATCH":
                with self.emu.lock:
                    js = self.jobsets.get((ns, name))
                    if js is None:
                        raise ApiError(
                            404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found'
                        )
                    new = apply_patch(js, body.content_type, body.raw(), "JobSet", GROUP)
                    new["metadata"]["resourceVersion"] = self.emu.next_rv()
                    self.jobsets[(ns, name)] = new
                    return 200, self.emu.public(new)
        if m := _WORKLOADS.match(path):
            ns, name = m.groups()
            self.emu.check_access("list" if name is None else "get", "workloads", ns, name)
            if name is None and method == "GET":
                return 200, self._list("WorkloadList", self.workloads, ns, q, KUEUE)
            if name is not None and method == "GET":
                with self.emu.lock:
                    wl = self.workloads.get((ns, name))
                if wl is None:
                    raise ApiError(404, "NotFound", f'workloads.kueue.x-k8s.io "{name}" not found')
                return 200, wl
        return None

    def _list(
        self,
        kind: str,
        store: dict[tuple[str, str], dict[str, Any]],
        ns: str,
        q: dict[str, str],
        api: str = f"{GROUP}/{VERSION}",
    ) -> dict[str, Any]:
        selector = parse_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), kind.removesuffix("List"))

        def pick() -> list[dict[str, Any]]:
            with self.emu.lock:
                return [
                    json.loads(json.dumps(self.emu.public(o)))
                    for (ons, _), o in sorted(store.items())
                    if ons == ns
                    and selector_matches(selector, o["metadata"].get("labels") or {})
                    and fields_match(fields, o)
                ]

        if watching(q):
            return watch_stream(pick, q, lambda: self.emu.stopping)
        return {"apiVersion": api, "kind": kind, "metadata": {}, "items": pick()}

    def create(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        if ns not in self.emu.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if not DNS_LABEL.match(name) or len(name) > 63:
            raise ApiError(
                422, "Invalid", f'JobSet.jobset.x-k8s.io "{name}" is invalid: metadata.name'
            )
        spec = body.get("spec") or {}
        rjobs = spec.get("replicatedJobs") or []
        if not rjobs:
            raise ApiError(422, "Invalid", "spec.replicatedJobs: Required value")
        for rj in rjobs:
            job_spec = (rj.get("template") or {}).get("spec") or {}
            replicas = int(rj.get("replicas", 1))
            pods = int(job_spec.get("parallelism", 1))
            host = f"{name}-{rj.get('name')}-{replicas - 1}-{pods - 1}"
            if len(host) > 63:
                raise ApiError(
                    422,
                    "Invalid",
                    f'JobSet.jobset.x-k8s.io "{name}" is invalid: spec.replicatedJobs'
                    f'[{rj.get("name")}]: Invalid value: "{host}": pod hostname must be no '
                    "more than 63 characters (JobSet name + replicated job name + indexes)",
                )
        with self.emu.lock:
            if (ns, name) in self.jobsets:
                raise ApiError(
                    409, "AlreadyExists", f'jobsets.jobset.x-k8s.io "{name}" already exists'
                )
            js = json.loads(json.dumps(body))
            js["apiVersion"], js["kind"] = f"{GROUP}/{VERSION}", "JobSet"
            js["metadata"].update(
                name=name,
                namespace=ns,
                uid=str(uuid.uuid4()),
                resourceVersion=self.emu.next_rv(),
                creationTimestamp=now_iso(),
            )
            js["metadata"].setdefault("labels", {})
            if js["metadata"]["labels"].get(QUEUE):
                js["spec"]["suspend"] = True  # Kueue's webhook
                self._workload(js)
            js["status"] = {"restarts": 0, "restartsCountTowardsMax": 0, "conditions": []}
            js["_created"] = time.time()
            self.jobsets[(ns, name)] = js
            return js

    def delete(self, ns: str, name: str) -> dict[str, Any]:
        with self.emu.lock:
            js = self.jobsets.pop((ns, name), None)
            if js is None:
                raise ApiError(404, "NotFound", f'jobsets.jobset.x-k8s.io "{name}" not found')
            for job in self._children(js):
                self.emu.delete_job(ns, job["metadata"]["name"], "Background")
            self.emu.delete_owned(ns, js["metadata"]["uid"])
            for key, wl in list(self.workloads.items()):
                if wl["metadata"]["labels"].get(JOB_UID) == js["metadata"]["uid"]:
                    del self.workloads[key]
            return js

    # -- Kueue -----------------------------------------------------------------------------
    def _workload(self, js: dict[str, Any]) -> None:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        wname = f"jobset-{name}"[:57] + "-" + secrets.token_hex(3)[:5]
        count = sum(
            int(rj.get("replicas", 1)) * int(rj["template"]["spec"].get("parallelism", 1))
            for rj in js["spec"]["replicatedJobs"]
        )
        rjob = js["spec"]["replicatedJobs"][0]["name"]
        self.workloads[(ns, wname)] = {
            "apiVersion": KUEUE,
            "kind": "Workload",
            "metadata": {
                "name": wname,
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "labels": {JOB_UID: js["metadata"]["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "JobSet",
                        "name": name,
                        "uid": js["metadata"]["uid"],
                    }
                ],
                "creationTimestamp": now_iso(),
            },
            "spec": {"queueName": js["metadata"]["labels"][QUEUE]},
            "status": {
                "conditions": [
                    _cond(
                        "QuotaReserved", "False", "Pending", INSUFFICIENT.format(rjob=rjob, n=count)
                    )
                ]
            },
        }

    def _workload_of(self, js: dict[str, Any]) -> dict[str, Any] | None:
        uid = js["metadata"]["uid"]
        return next(
            (w for w in self.workloads.values() if w["metadata"]["labels"].get(JOB_UID) == uid),
            None,
        )

    def evict(self, ns: str, name: str, reason: str = "Preempted") -> None:
        """Kueue preempts an admitted JobSet: Workload Evicted, JobSet suspended, pods stopped."""
        with self.emu.lock:
            js = self.jobsets[(ns, name)]
            wl = self._workload_of(js)
            if wl is not None:
                message = "Preempted to accommodate a workload (UID: 7a3c) due to prioritization in the ClusterQueue"
                _set_cond(wl, _cond("Evicted", "True", reason, message))
                _set_cond(
                    wl,
                    _cond("Admitted", "False", "NoReservation", "The workload has no reservation"),
                )
                _set_cond(wl, _cond("QuotaReserved", "False", "Pending", message))
                wl["_evicted"] = True
            js["spec"]["suspend"] = True

    def _admit(self, js: dict[str, Any]) -> None:
        wl = self._workload_of(js)
        if wl is None or wl.get("_evicted") or self.kueue_mode != "admit":
            return
        _set_cond(
            wl,
            _cond(
                "QuotaReserved",
                "True",
                "QuotaReserved",
                "Quota reserved in ClusterQueue cluster-queue",
            ),
        )
        _set_cond(wl, _cond("Admitted", "True", "Admitted", "The workload is admitted"))
        js["spec"]["suspend"] = False
        js["_resumed"] = time.time()

    # -- controller --------------------------------------------------------------------------
    def _children(self, js: dict[str, Any]) -> list[dict[str, Any]]:
        ns, uid = js["metadata"]["namespace"], js["metadata"]["uid"]
        return [
            j
            for (jns, _), j in self.emu.jobs.items()
            if jns == ns
            and any(r.get("uid") == uid for r in j["metadata"].get("ownerReferences") or [])
        ]

    def reconcile(self) -> None:
        with self.emu.lock:
            for key in list(self.jobsets):
                js = self.jobsets.get(key)
                if js is not None:
                    self._reconcile(js)

    def _reconcile(self, js: dict[str, Any]) -> None:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        spec, status = js["spec"], js["status"]
        if _true(js, "Completed") or _true(js, "Failed"):
            for job in self._children(js):
                if not any(
                    c["type"] in ("Complete", "Failed")
                    for c in job["status"].get("conditions") or []
                ):
                    self.emu.delete_job(ns, job["metadata"]["name"], "Background")
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() - js["_finished"] >= ttl:
                self.delete(ns, name)
            return
        if spec.get("suspend") and js["metadata"]["labels"].get(QUEUE):
            self._admit(js)
        if spec.get("suspend"):
            for job in self._children(js):
                self.emu.delete_job(ns, job["metadata"]["name"], "Background")
            _set_cond(js, _cond("Suspended", "True", "SuspendedJobs", "jobset is suspended"))
            return
        if _true(js, "Suspended"):
            _set_cond(js, _cond("Suspended", "False", "ResumeJobs", "jobset is resumed"))
        network = spec.get("network") or {}
        subdomain = network.get("subdomain") or name
        if network.get("enableDNSHostnames") and (ns, subdomain) not in self.emu.services:
            self.emu.create_service(
                ns,
                {
                    "metadata": {
                        "name": subdomain,
                        "labels": {JOBSET_NAME: name},
                        "ownerReferences": [self._owner(js)],
                    },
                    "spec": {
                        "clusterIP": "None",
                        "selector": {JOBSET_NAME: name},
                        "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses")),
                    },
                },
            )
        attempt = int(status.get("restarts") or 0)
        children = {j["metadata"]["name"]: j for j in self._children(js)}
        stale = [
            j for j in children.values() if int(j["metadata"]["labels"].get(RESTART, 0)) != attempt
        ]
        if stale:  # a restart in progress: old Jobs go first
            for j in stale:
                self.emu.delete_job(ns, j["metadata"]["name"], "Background")
            return
        rj_status = []
        failed_job = None
        done_by_rjob: dict[str, tuple[int, int]] = {}
        for rj in spec["replicatedJobs"]:
            replicas = int(rj.get("replicas", 1))
            ok = failed = active = 0
            for i in range(replicas):
                jname = f"{name}-{rj['name']}-{i}"
                job = children.get(jname)
                if job is None:
                    self._create_job(
                        js, rj, i, subdomain if network.get("enableDNSHostnames") else None, attempt
                    )
                    active += 1
                    continue
                conds = {c["type"]: c for c in job["status"].get("conditions") or []}
                if "Complete" in conds:
                    ok += 1
                elif "Failed" in conds:
                    failed += 1
                    if failed_job is None:
                        failed_job = (rj["name"], job, conds["Failed"])
                else:
                    active += 1
            done_by_rjob[rj["name"]] = (ok, replicas)
            rj_status.append(
                {
                    "name": rj["name"],
                    "ready": 0,
                    "succeeded": ok,
                    "failed": failed,
                    "active": active,
                    "suspended": 0,
                }
            )
        status["replicatedJobsStatus"] = rj_status
        if failed_job is not None:
            self._on_failure(js, *failed_job)
            return
        policy = spec.get("successPolicy") or {}
        targets = policy.get("targetReplicatedJobs") or list(done_by_rjob)
        finished = [done_by_rjob[t][0] >= done_by_rjob[t][1] for t in targets if t in done_by_rjob]
        if finished and (any(finished) if policy.get("operator") == "Any" else all(finished)):
            _set_cond(
                js, _cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully")
            )
            status["terminalState"] = "Completed"
            js["_finished"] = time.time()
        js["metadata"]["resourceVersion"] = self.emu.next_rv()

    def _on_failure(
        self, js: dict[str, Any], rjob: str, job: dict[str, Any], cond: dict[str, Any]
    ) -> None:
        policy = js["spec"].get("failurePolicy") or {}
        action, rule_name = "RestartJobSet", None
        for rule in policy.get("rules") or []:
            reasons = rule.get("onJobFailureReasons") or []
            targets = rule.get("targetReplicatedJobs") or []
            if (not reasons or cond.get("reason") in reasons) and (not targets or rjob in targets):
                action, rule_name = rule["action"], rule.get("name")
                break
        status = js["status"]
        jname = job["metadata"]["name"]
        if action == "FailJobSet":
            self._fail(
                js,
                "FailJobSetFailurePolicyRule",
                f"jobset failed due to job {jname} failing; failure policy rule {rule_name!r}: {cond.get('message', '')}",
            )
            return
        counts = action != "RestartJobSetAndIgnoreMaxRestarts"
        if counts and int(status.get("restartsCountTowardsMax") or 0) >= int(
            policy.get("maxRestarts", 0)
        ):
            self._fail(
                js,
                "ReachedMaxRestarts",
                f"jobset failed due to reaching max number of restarts; last failure: job {jname} ({cond.get('reason')})",
            )
            return
        status["restarts"] = int(status.get("restarts") or 0) + 1
        if counts:
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1

    def _fail(self, js: dict[str, Any], reason: str, message: str) -> None:
        _set_cond(js, _cond("Failed", "True", reason, message))
        js["status"]["terminalState"] = "Failed"
        js["_finished"] = time.time()

    @staticmethod
    def _owner(js: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "JobSet",
            "name": js["metadata"]["name"],
            "uid": js["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _create_job(
        self,
        js: dict[str, Any],
        rj: dict[str, Any],
        index: int,
        subdomain: str | None,
        attempt: int,
    ) -> None:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        jname = f"{name}-{rj['name']}-{index}"
        template = json.loads(json.dumps(rj["template"]))
        ours = {
            JOBSET_NAME: name,
            RJOB_NAME: rj["name"],
            RJOB_REPLICAS: str(rj.get("replicas", 1)),
            JOB_INDEX: str(index),
            JOB_KEY: uuid.uuid5(uuid.NAMESPACE_DNS, f"{ns}/{jname}").hex,
            RESTART: str(attempt),
        }
        meta = template.setdefault("metadata", {})
        meta["name"] = jname
        meta.setdefault("labels", {}).update(ours)
        meta.setdefault("annotations", {}).update(ours)
        meta["ownerReferences"] = [self._owner(js)]
        pod_meta = template["spec"]["template"].setdefault("metadata", {})
        pod_meta.setdefault("labels", {}).update(ours)
        pod_meta.setdefault("annotations", {}).update(ours)
        if subdomain:
            template["spec"]["template"]["spec"]["subdomain"] = subdomain
        self.emu.create_job(ns, {"apiVersion": "batch/v1", "kind": "Job", **template})

    # -- pod network -------------------------------------------------------------------------
    def _port(self, js_uid: str, port: int) -> int:
        with self._ports_lock:
            if (js_uid, port) not in self.ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    self.ports[(js_uid, port)] = s.getsockname()[1]
            return self.ports[(js_uid, port)]

    def rewrite_env(
        self, pod: dict[str, Any], container: dict[str, Any], env: dict[str, str]
    ) -> dict[str, str]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        name = labels.get(JOBSET_NAME)
        ns = (pod.get("metadata") or {}).get("namespace")
        if not name:
            return env
        with self.emu.lock:
            js = self.jobsets.get((ns, name))
            if js is None:
                return env
            subdomain = (js["spec"].get("network") or {}).get("subdomain") or name
            svc = self.emu.services.get((ns, subdomain))
        if svc is None or svc["spec"].get("clusterIP") != "None":
            return env  # no headless Service: the names would not resolve
        uid = js["metadata"]["uid"]
        declared = {
            int(p["containerPort"])
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if p.get("containerPort")
        }
        host = re.compile(
            rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.{re.escape(subdomain)}"
            rf"(\.{re.escape(ns)}(\.svc(\.cluster\.local)?)?)?(:(?P<port>[0-9]+))?$"
        )
        out = dict(env)
        for key, value in env.items():
            if m := host.match(value):
                port = m.group("port")
                if port is not None and int(port) in declared:
                    port = str(self._port(uid, int(port)))
                out[key] = "127.0.0.1" + (f":{port}" if port else "")
            elif key.endswith("_PORT") and value.isdigit() and int(value) in declared:
                out[key] = str(self._port(uid, int(value)))
        out.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the emulated pod network is loopback
        return out
