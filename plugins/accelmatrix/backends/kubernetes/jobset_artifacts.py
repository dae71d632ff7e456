"""What a JobSet cell leaves in its artifacts dir: every pod's log, status.json, timing.

``JobSetArtifacts.snapshot`` saves every pod's log spool, the leader's as ``output.log`` (or,
if the leader is gone, the lowest-ranked pod's), a
``status.json`` with every pod's state (pods a restart deleted keep their last record, and a
verdict poll reached is kept), and the group's timing (all pods running, rendezvous spread)
as runner metrics. It is the group's record on disk, apart from creating, judging and
deleting the JobSet; it reads the pods through ``JobSetReader`` and the logs through
``PodLogs``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelmatrix.backends.base import JobStatus
from accelmatrix.backends.kubernetes import jobset_verdict as verdict
from accelmatrix.backends.kubernetes import pods as k8s_pods
from accelmatrix.backends.kubernetes.job_api import JobApi
from accelmatrix.backends.kubernetes.jobset_manifest import CONTAINER
from accelmatrix.backends.kubernetes.jobset_reader import JobSetReader
from accelmatrix.backends.kubernetes.pod_logs import PodLogs
from accelmatrix.hooks.k8s import KubeClients
from accelmatrix.metrics.resource_samples import FILE as RUNNER_FILE


class JobSetArtifacts:
    """The artifacts of JobSets in one namespace."""

    def __init__(self, clients: KubeClients, ns: str):
        self.api = JobApi(clients, ns)
        self.reader = JobSetReader(clients, ns)
        self.logs = PodLogs(clients, ns)

    def snapshot(
        self,
        name: str,
        artifacts_dir: str,
        js: dict[str, Any] | None = None,
        outcome: JobStatus | None = None,
    ) -> None:
        """Every pod's log, the leader's as output.log, status.json and the group timing.

        ``js``: the JobSet if the caller has it (else read here); ``outcome``: the verdict
        of a poll that saw the group end (kept in status.json for collect and teardown).
        """
        if js is None:
            js = self.api.read_jobset(name)
        pods = self.reader.pods(name)
        art = Path(artifacts_dir)
        if not pods:
            if outcome is not None and outcome.done:  # e.g. evicted: its pods are gone
                art.mkdir(parents=True, exist_ok=True)
                record = {"exit_code": None, "reason": outcome.detail, "verdict": True}
                record.update(jobset=name, pods=[], started_at=None, ended_at=None, pid=None)
                _write(art / "status.json", json.dumps(record).encode())
            return
        (art / "pods").mkdir(parents=True, exist_ok=True)
        attempt = int(((js or {}).get("status") or {}).get("restarts") or 0)
        # output.log, which collect reads the workload's metrics from, is the leader's log.
        # A group whose leader is gone already (the failure policy deleted the still-active
        # peers of the pod that failed first, before any poll saw them) shows the log of
        # the lowest-ranked pod left, of the current attempt first.
        shown = verdict.leader(pods, attempt) or min(
            pods, key=lambda p: (verdict.attempt(p.metadata.labels) != attempt, verdict.index(p))
        )
        infos = []
        for pod in pods:  # pods/<pod>.log is the pod's log spool (k8s_logs)
            self.logs.spooled(pod, art, art / "output.log" if pod is shown else None)
            term = k8s_pods.terminated(pod, CONTAINER)
            job_i, pod_i = verdict.index(pod)
            infos.append(
                {
                    "name": pod.metadata.name,
                    "job_index": job_i,
                    "rank": pod_i,
                    "attempt": verdict.attempt(pod.metadata.labels),
                    "phase": pod.status.phase,
                    "node": pod.spec.node_name,
                    "created_at": k8s_pods.epoch(pod.metadata.creation_timestamp),
                    "started_at": k8s_pods.running_since(pod, CONTAINER),
                    "ended_at": k8s_pods.epoch(term.finished_at) if term else None,
                    "exit_code": term.exit_code if term else None,
                    "reason": (term.reason if term else None) or pod.status.reason,
                    "disruption": k8s_pods.disruption(pod),
                }
            )
        try:  # pods deleted since the last snapshot (a restart) keep their last record
            prior = json.loads((art / "status.json").read_text())
        except (OSError, ValueError):
            prior = {}
        if prior.get("jobset") == name:
            seen = {i["name"] for i in infos}
            infos = [i for i in prior.get("pods") or [] if i.get("name") not in seen] + infos
            infos.sort(key=lambda i: (i.get("attempt", 0), i.get("job_index", 0), i.get("rank", 0)))
        lead = next((i for i in infos if i["name"] == shown.metadata.name), infos[0])
        exit_code, reason = lead["exit_code"], lead["reason"]
        judged = outcome is not None and outcome.done
        if judged:
            exit_code = None if outcome.infrastructure_failure else outcome.exit_code
            reason = outcome.detail
        else:  # collect/teardown after poll judged the group: keep its verdict
            if prior.get("verdict") and prior.get("jobset") == name:
                exit_code, reason, judged = prior.get("exit_code"), prior.get("reason"), True
        started = js and k8s_pods.epoch(js["metadata"].get("creationTimestamp"))
        status = {
            "exit_code": exit_code,
            "started_at": lead["started_at"],
            "ended_at": lead["ended_at"],
            "pid": None,
            "pod": lead["name"],
            "node": lead["node"],
            "reason": reason,
            "verdict": judged,
            "jobset": name,
            "restarts": attempt,
            "pods": infos,
        }
        _write(art / "status.json", json.dumps(status).encode())
        current = [i for i in infos if i["attempt"] == attempt]
        starts = [i["started_at"] for i in current if i["started_at"] is not None]
        timing: dict[str, Any] = {"final": True}
        if starts and len(starts) == len(current):
            origin = min(
                [i["created_at"] for i in current if i["created_at"]] + [started or min(starts)]
            )
            timing["all_pods_running_s"] = max(starts) - origin
            timing["rendezvous_s"] = max(starts) - min(starts)
        _write(art / RUNNER_FILE, (json.dumps(timing) + "\n").encode())


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
