"""What a k8s-job cell leaves for evaluation: ``output.log`` and ``status.json``.

Evaluation reads the same two files for every machine kind (a local cell's runner writes
them). A Job's are made from its pods: each pod's log spool shown as ``output.log`` (index 0)
or ``output-<i>.log``, and the index-0 pod's container state as ``status.json``. The poll
that sees the Job end writes them at once, because evaluation may run before teardown when
the run failed; collect, cancel and teardown write them again if nobody did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelmatrix.backends.kubernetes.job_manifest import CONTAINER
from accelmatrix.backends.kubernetes.job_pods import epoch, index, terminated
from accelmatrix.backends.kubernetes.pod_logs import PodLogs


def snapshot(logs: PodLogs, pods: list[Any], art: Path) -> None:
    """Write output.log and status.json (what evaluation reads) from the pods' state."""
    if not pods:
        return
    art.mkdir(parents=True, exist_ok=True)
    pods = sorted(pods, key=index)
    pod0 = pods[0]
    for pod in pods:
        i = index(pod)
        target = art / ("output.log" if i == 0 else f"output-{i}.log")
        logs.spooled(pod, art, target)
    term = terminated(pod0)
    running = next(
        (
            cs.state.running
            for cs in pod0.status.container_statuses or []
            if cs.name == CONTAINER and cs.state and cs.state.running
        ),
        None,
    )
    status = {
        "exit_code": term.exit_code if term else None,
        "started_at": epoch(term.started_at if term else running and running.started_at),
        "ended_at": epoch(term.finished_at) if term else None,
        "pid": None,
        "pod": pod0.metadata.name,
        "node": pod0.spec.node_name,
        "reason": (term.reason if term else None) or pod0.status.reason,
    }
    tmp = art / ".status.json.part"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, art / "status.json")


def saved_exit(art: Path) -> bool:
    """Whether ``status.json`` already holds an exit code (teardown need not save logs)."""
    try:
        return json.loads((art / "status.json").read_text()).get("exit_code") is not None
    except (OSError, ValueError):
        return False
