"""An API that cannot be reached, waited out for a while, then reported as infrastructure.

The triggerer polls every running cell about once a second; a control plane upgrade or a
network blip must not fail a cell, and an outage that lasts must not keep it waiting forever.
So a poll that cannot reach the API says "running" until the cell's first failed poll is
``UNREACHABLE_GRACE_SECONDS`` old, then ends it as an infrastructure failure (the run step
may retry it). Any poll that succeeds resets the clock. Errors the API *answered* with
(4xx other than 429) are not an outage and propagate: no retry fixes them.

The Job and JobSet backends poll through :func:`polled`; the clock is one per process and
cell key, shared by both (a key names a namespace and a Job or JobSet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from accelmatrix.backends.base import JobStatus

logger = logging.getLogger(__name__)

UNREACHABLE_GRACE_SECONDS = 120.0

_unreachable_since: dict[str, float] = {}
_state_lock = threading.Lock()


def infra(detail: str) -> JobStatus:
    """A verdict of the infrastructure: the cell ended, and not by the workload's exit."""
    return JobStatus(done=True, exit_code=None, detail=detail, infrastructure_failure=True)


def is_unreachable(e: BaseException) -> bool:
    """The API did not answer (a refused or dropped connection, a timeout) or answered that
    it cannot serve now (5xx, 429): the same call may succeed later. Any other answer
    (400-499) is final."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        return e.status is None or not (400 <= e.status < 500) or e.status == 429
    # urllib3's errors do not all derive from OSError.
    return isinstance(e, OSError | ConnectionError) or type(e).__module__.startswith("urllib3")


def polled(key: str, poll: Callable[[], JobStatus]) -> JobStatus:
    """``poll()``, with an unreachable API turned into "still running" for a grace period."""
    try:
        status = poll()
    except Exception as e:
        if is_unreachable(e):
            return _unreachable(key, e)
        raise
    with _state_lock:
        _unreachable_since.pop(key, None)
    return status


def _unreachable(key: str, e: BaseException) -> JobStatus:
    now = time.monotonic()
    with _state_lock:
        since = _unreachable_since.setdefault(key, now)
    if now - since >= UNREACHABLE_GRACE_SECONDS:
        with _state_lock:
            _unreachable_since.pop(key, None)
        return infra(f"Kubernetes API unreachable for {now - since:.0f} s: {e}")
    logger.warning("cannot reach the Kubernetes API for %s (will retry): %s", key, e)
    return JobStatus(done=False, detail=f"API unreachable: {e}")
