"""Reading pods: infrastructure problems, exit states and start times (shared by k8s backends).

Both Kubernetes backends judge pods the same way, so the rules live here once: a pod that
cannot be scheduled, pull its image, start its container or leave ContainerCreating within a
limit failed the *infrastructure* (retry, don't blame the test); a pod the cluster stopped
(eviction, preemption: the ``DisruptionTarget`` condition) did too, whatever exit code its
SIGTERM or SIGKILL produced (143/137). Only a container exiting on its own is the workload's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
DISRUPTION = "DisruptionTarget"


def epoch(ts: Any) -> float | None:
    """Seconds since the epoch of a Kubernetes timestamp (datetime or RFC 3339 text)."""
    if ts is None:
        return None
    if isinstance(ts, datetime):
        return ts.timestamp()
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def terminated(pod: Any, container: str) -> Any:
    """The container's terminated state (regular or init container), or None."""
    for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
        if cs.name == container and cs.state and cs.state.terminated:
            return cs.state.terminated
    return None


def running_since(pod: Any, container: str) -> float | None:
    """When the container started (running now or since terminated), epoch seconds."""
    for cs in pod.status.container_statuses or []:
        if cs.name != container or not cs.state:
            continue
        if cs.state.running:
            return epoch(cs.state.running.started_at)
        if cs.state.terminated:
            return epoch(cs.state.terminated.started_at)
    return None


def disruption(pod: Any) -> str | None:
    """Why the cluster stopped this pod (eviction, preemption, node drain), or None."""
    if pod.status.reason == "Evicted":
        return f"evicted: {pod.status.message or ''}".rstrip(": ")
    for c in pod.status.conditions or []:
        if c.type == DISRUPTION and c.status == "True":
            return f"{c.reason or 'disrupted'}: {c.message or ''}".rstrip(": ")
    return None


def pod_problem(
    pod: Any,
    *,
    now: float,
    scheduling_timeout: float,
    creating_timeout: float | None = None,
) -> str | None:
    """An infrastructure failure of one pod that is not over yet, or None."""
    name = pod.metadata.name
    why = disruption(pod)
    if why:
        return f"pod {name} was stopped by the cluster ({why})"
    statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
    for cs in statuses:
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason in IMAGE_ERRORS:
            return (
                f"cannot pull image {cs.image!r} for pod {name} "
                f"({waiting.reason}): {waiting.message or ''}".rstrip(": ")
            )
        if waiting and waiting.reason in CONFIG_ERRORS:
            return (
                f"pod {name} container {cs.name} cannot start ({waiting.reason}): "
                f"{waiting.message or ''}"
            )
    if pod.status.phase != "Pending":
        return None
    conds = {c.type: c for c in pod.status.conditions or []}
    sched = conds.get("PodScheduled")
    if sched is None or sched.status != "True":
        age = now - (epoch(pod.metadata.creation_timestamp) or now)
        if age > scheduling_timeout:
            why = f"{sched.reason}: {sched.message}" if sched else "not scheduled yet"
            return (
                f"pod {name} unschedulable for {age:.0f} s (scheduling timeout "
                f"{scheduling_timeout:.0f} s): {why}"
            )
        return None
    if creating_timeout is None:
        return None
    since = epoch(sched.last_transition_time) or epoch(pod.metadata.creation_timestamp) or now
    stuck = [
        cs.name
        for cs in statuses
        if cs.state and cs.state.waiting and cs.state.waiting.reason == "ContainerCreating"
    ]
    if stuck and now - since > creating_timeout:
        return (
            f"pod {name} stuck in ContainerCreating for {now - since:.0f} s (limit "
            f"{creating_timeout:.0f} s; a volume that does not attach, a missing secret?)"
        )
    return None
