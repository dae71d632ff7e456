"""What a JobSet and its pods mean for a cell: running, passed, a test failure or not ours.

Pure functions over the API's objects (the JobSet and Workload dicts, the client's pod
models): the backend fetches, this module judges, so every rule is readable in one place
and the log of the failing pod is read only when a verdict needs it (``tail``).

The rules, in the order they apply:

1. ``Completed`` -> the leader's exit code (0).
2. ``Failed`` -> the *first* pod (current restart attempt, earliest ``finishedAt``) whose
   container exited non-zero without a ``DisruptionTarget`` names a test failure, with its
   last log lines; ``ReachedMaxRestarts`` or only disrupted pods -> infrastructure.
3. Suspended -> Kueue's word: evicted/preempted -> infrastructure; not admitted past the
   admission timeout -> infrastructure (capacity); otherwise a wait.
4. Running -> any pod of the current attempt with an infrastructure problem
   (``k8s_pods.pod_problem``) other than a disruption (the controller restarts those) ends
   it; no pod at all past the scheduling timeout ends it; otherwise still running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelmatrix.backends.base import JobStatus
from accelmatrix.backends.kubernetes import pods as k8s_pods
from accelmatrix.backends.kubernetes.jobset_manifest import (
    COMPLETION_INDEX,
    CONTAINER,
    JOB_INDEX_LABEL,
    RESTART_LABEL,
)
from accelmatrix.contracts.machine_records import K8sHandle


def index(pod: Any) -> tuple[int, int]:
    """(job index, completion index) of a JobSet pod: (0, 0) is the leader."""
    labels = pod.metadata.labels or {}
    try:
        return int(labels.get(JOB_INDEX_LABEL, 0)), int(labels.get(COMPLETION_INDEX, 0))
    except ValueError:
        return 0, 0


def attempt(labels: dict[str, str] | None) -> int:
    """The restart attempt a pod belongs to (the JobSet controller labels it)."""
    try:
        return int((labels or {}).get(RESTART_LABEL, 0))
    except ValueError:
        return 0


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions of a custom object that are True, by type."""
    conds = (obj.get("status") or {}).get("conditions") or []
    return {c.get("type"): c for c in conds if c.get("status") == "True"}


def sort_pods(pods: list[Any]) -> list[Any]:
    return sorted(
        pods,
        key=lambda p: (
            attempt(p.metadata.labels),
            index(p),
            k8s_pods.epoch(p.metadata.creation_timestamp) or 0,
        ),
    )


def leader(pods: list[Any], of_attempt: int | None = None) -> Any:
    """The leader pod (of ``of_attempt`` if it has one), newest first; None if none yet."""
    leaders = [p for p in pods if index(p) == (0, 0)]
    if of_attempt is not None:
        leaders = [p for p in leaders if attempt(p.metadata.labels) == of_attempt] or leaders
    return leaders[-1] if leaders else None


def kueue_state(workloads: list[dict[str, Any]]) -> tuple[str, str]:
    """('evicted' | 'pending' | 'admitted', message) from Kueue's Workloads of a JobSet."""
    for wl in workloads:
        conds = conditions(wl)
        if "Evicted" in conds or "Preempted" in conds:
            c = conds.get("Evicted") or conds["Preempted"]
            return "evicted", f"{c.get('reason')}: {c.get('message', '')}"
    for wl in workloads:
        if "Admitted" in conditions(wl):
            return "admitted", ""
        pending = next(
            (
                c
                for c in (wl.get("status") or {}).get("conditions") or []
                if c.get("type") == "QuotaReserved"
            ),
            None,
        )
        if pending:
            return "pending", f"{pending.get('reason')}: {pending.get('message', '')}"
    return "pending", "no Workload yet"


def infra(detail: str) -> JobStatus:
    return JobStatus(done=True, exit_code=None, detail=detail, infrastructure_failure=True)


def judge(
    js: dict[str, Any],
    pods: list[Any],
    *,
    now: float,
    handle: K8sHandle,
    kueue: Callable[[], tuple[str, str]],
    tail: Callable[[str], list[str]],
) -> JobStatus:
    """The verdict on one JobSet (see the module docstring for the rules)."""
    name = handle.job_name
    conds = conditions(js)
    current_attempt = int((js.get("status") or {}).get("restarts") or 0)
    current = [p for p in pods if attempt(p.metadata.labels) == current_attempt]
    created = k8s_pods.epoch(js["metadata"].get("creationTimestamp")) or now
    if "Completed" in conds:
        lead = leader(pods, current_attempt)
        term = k8s_pods.terminated(lead, CONTAINER) if lead else None
        code = term.exit_code if term else 0
        return JobStatus(done=True, exit_code=code, detail=f"JobSet {name} completed")
    if "Failed" in conds:
        return _failed(name, conds["Failed"], pods, current_attempt, tail)
    if (js.get("spec") or {}).get("suspend"):
        state, message = kueue()
        if state == "evicted":
            return infra(f"JobSet {name} was evicted by Kueue ({message})")
        limit = handle.admission_timeout
        if limit is not None and now - created > limit:
            return infra(
                f"JobSet {name} was not admitted by Kueue (LocalQueue "
                f"{handle.queue}) within {limit:.0f} s: {message}"
            )
        return JobStatus(done=False, detail=f"waiting for Kueue admission: {message}", queued=True)
    for pod in current:
        problem = k8s_pods.pod_problem(
            pod,
            now=now,
            scheduling_timeout=float(handle.scheduling_timeout),
            creating_timeout=float(handle.creating_timeout or 600),
        )
        # A disrupted pod is not the end: the controller restarts the group, or fails it
        # when out of restarts (rule 2).
        if problem and not k8s_pods.disruption(pod):
            return infra(problem)
    if not current:
        if now - created > float(handle.scheduling_timeout):
            return infra(
                f"JobSet {name} created no pod in {now - created:.0f} s (is the JobSet "
                "controller running? quota, admission webhook?)"
            )
        return JobStatus(done=False, detail="waiting for pods")
    phases = ",".join(sorted({p.status.phase for p in current}))
    extra = f" (restart {current_attempt})" if current_attempt else ""
    status = JobStatus(done=False, detail=f"{len(current)} pod(s) {phases}{extra}")
    if handle.queue:  # the workload's clock starts when its first pod runs
        starts = [s for p in pods if (s := k8s_pods.running_since(p, CONTAINER)) is not None]
        status.started_at = min(starts) if starts else None
    return status


def _failed(
    name: str,
    cond: dict[str, Any],
    pods: list[Any],
    current_attempt: int,
    tail: Callable[[str], list[str]],
) -> JobStatus:
    failures = []
    for pod in pods:
        term = k8s_pods.terminated(pod, CONTAINER)
        if term is None or term.exit_code == 0:
            continue
        finished = k8s_pods.epoch(term.finished_at) or 0
        failures.append((finished, attempt(pod.metadata.labels), index(pod), pod, term))
    failures.sort(key=lambda f: (-f[1], f[0], f[2]))  # current attempt, earliest first
    first = next((f for f in failures if not k8s_pods.disruption(f[3])), None)
    if cond.get("reason") == "ReachedMaxRestarts" or first is None:
        disrupted = next((k8s_pods.disruption(p) for p in pods if k8s_pods.disruption(p)), None)
        exits = (
            f"; pod {first[3].metadata.name} exited with {first[4].exit_code} (a code listed "
            "in restart_on_exit_codes)"
            if first
            else ""
        )
        return infra(
            f"JobSet {name} failed ({cond.get('reason')}: {cond.get('message', '')}) after "
            f"{current_attempt} restart(s)"
            + (f"; last disruption: {disrupted}" if disrupted else "")
            + exits
        )
    _, _, (job_i, pod_i), pod, term = first
    lines = tail(pod.metadata.name)
    detail = (
        f"pod {pod.metadata.name} (job {job_i}, rank {pod_i}) exited with {term.exit_code} "
        f"({term.reason}) first; JobSet {name} failed ({cond.get('reason')})"
    )
    if lines:
        detail += "; last lines:\n" + "\n".join(lines)
    return JobStatus(done=True, exit_code=term.exit_code, detail=detail)
