"""The typed exceptions of the Cloud TPU hook, and how a failed gcloud run becomes one.

gcloud reports a failure as an ``ERROR: (gcloud.<command>) ...`` line on stderr, with either
``STATUS: message`` or a long-running operation's JSON error (a gRPC code). ``parse_gcloud_error``
maps it to ``TpuNotFound``, ``TpuAlreadyExists``, ``TpuStockout``... so that backends branch on
types, never on text; capacity and timeout errors are also ``InfrastructureError``. Separate
from ``accelmatrix.hooks.tpu`` (which runs gcloud) because it is pure parsing with its own
tests, and callers that only catch these errors need not read the runner.
"""

from __future__ import annotations

import json
import re

from accelmatrix.errors import BackendError, InfrastructureError

GRPC_STATUS = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


# -- errors ------------------------------------------------------------------------------------
class TpuError(BackendError):
    """A gcloud call failed. ``status`` is the Google status name when gcloud reported one."""

    def __init__(
        self,
        message: str,
        *,
        status: str = "",
        command: str = "",
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.command = message, status, command
        self.returncode, self.stderr = returncode, stderr


class TpuNotFound(TpuError):
    pass


class TpuAlreadyExists(TpuError):
    pass


class TpuPermissionDenied(TpuError):
    pass


class TpuInvalidArgument(TpuError):
    pass


class TpuCapacityError(TpuError, InfrastructureError):
    """No TPU for us right now (quota or stockout)."""


class TpuQuotaExceeded(TpuCapacityError):
    pass


class TpuStockout(TpuCapacityError):
    pass


class TpuTimeout(TpuError, InfrastructureError):
    pass


class TpuUnreachable(TpuError, InfrastructureError):
    """The Cloud TPU API could not be reached (gcloud's own retries, about 30 s, ran out)
    or answered UNAVAILABLE: the same call may succeed later."""


# How gcloud reports a request that never got an answer: it "crashes" with the HTTP
# library's exception name (requests and urllib3 both use these).
_UNREACHABLE = re.compile(
    r"gcloud crashed \((ConnectionError|ConnectTimeout|ReadTimeout|Timeout|SSLError|"
    r"ProxyError|ChunkedEncodingError|MaxRetryError|NewConnectionError|ProtocolError)\)"
)
_ERROR_LINE = re.compile(r"^ERROR: \((gcloud[^)]*)\) ?(.*)$", re.MULTILINE)


def parse_gcloud_error(stderr: str, returncode: int | None = None) -> TpuError:
    """The typed exception for a failed gcloud run, from its stderr.

    gcloud reports HTTP errors as ``STATUS: message`` (plus details as YAML) and failed
    long-running operations as the operation's JSON error ``{"code": 8, "message": ...}``.
    """
    crashed = _UNREACHABLE.search(stderr)
    if crashed:
        line = stderr[crashed.start() :].strip().splitlines()[0]
        return TpuUnreachable(
            f"UNAVAILABLE: {line}",
            status="UNAVAILABLE",
            returncode=returncode,
            stderr=stderr,
        )
    m = _ERROR_LINE.search(stderr)
    command = m.group(1) if m else ""
    rest = stderr[m.start(2) :].strip() if m else stderr.strip()
    status, message = "", rest
    if rest.startswith("{"):
        try:
            obj, _ = json.JSONDecoder().raw_decode(rest)
            code = obj.get("code")
            status = GRPC_STATUS.get(code, "") if isinstance(code, int) else str(code or "")
            message = str(obj.get("message", rest))
        except ValueError:
            pass
    else:
        sm = re.match(r"^([A-Z][A-Z_]+): (.*)", rest, re.DOTALL)
        if sm:
            status, message = sm.group(1), sm.group(2)
    # gcloud appends a hint about the access token file after NOT_FOUND etc.; keep line 1.
    message = message.strip().splitlines()[0] if message.strip() else "gcloud failed"
    message = re.sub(r"\s*This command is authenticated with .*$", "", message)
    text = f"{status}: {message}" if status else message
    lowered = rest.lower()
    cls: type[TpuError] = TpuError
    if status == "NOT_FOUND" or (not status and "not found" in lowered):
        cls = TpuNotFound
    elif status == "ALREADY_EXISTS" or (not status and "already exists" in lowered):
        cls = TpuAlreadyExists
    elif status == "RESOURCE_EXHAUSTED" or "no more capacity" in lowered:
        cls = TpuQuotaExceeded if "quota" in lowered else TpuStockout
    elif "quota" in lowered and "exceeded" in lowered:
        cls = TpuQuotaExceeded
    elif status in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
        cls = TpuPermissionDenied
    elif status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        cls = TpuInvalidArgument
    elif status == "UNAVAILABLE":
        cls = TpuUnreachable
    return cls(text, status=status, command=command, returncode=returncode, stderr=stderr)
