"""What the emulated API server and kubelet do beyond storing objects, the way real ones do.

Used by ``k8s_emulator`` (and ``jobset_controller``); each part is what a backend or kubectl
relies on and an object store alone would get wrong:

* **field selectors** (``fieldSelector``): the fields the real API indexes per kind (pods:
  ``metadata.name``, ``status.phase``, ``spec.nodeName``...; jobs: ``metadata.name``,
  ``status.successful``); any other field is ``400 field label not supported``, as there.
* **watches** (``?watch=true``): a chunked stream of ``{"type": ADDED|MODIFIED|DELETED,
  "object": ...}`` lines, synthetic ``ADDED`` for what exists first (no ``resourceVersion``
  or ``"0"``), then changes, until ``timeoutSeconds``. Not modelled: bookmarks and
  ``410 Gone``; a watch from a given ``resourceVersion`` sends the objects changed since as
  ``MODIFIED`` but cannot replay deletions.
* **PATCH**: JSON merge patch, strategic merge patch (lists of named items merge by
  ``name``) and JSON patch, on the fields the real API lets change (metadata labels and
  annotations; a Job's ``suspend``, ``parallelism``, ``activeDeadlineSeconds``,
  ``ttlSecondsAfterFinished``; a pod's images and ``activeDeadlineSeconds``); another
  change is ``422 field is immutable``; ``status`` in a patch of the main resource is
  ignored. An unsupported media type is ``415``; PUT and a PATCH elsewhere ``405`` with a
  ``Status`` body (never the stdlib's HTML ``501``).
* **validation** at create, answered ``422 Invalid`` with ``details.causes`` like the real
  API: a Job's ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished`` and ``backoffLimit``
  >= 0; a pod's ``activeDeadlineSeconds`` in 1..2147483647; env var names (the rule before
  Kubernetes 1.32's RelaxedEnvironmentVariableValidation: ``[-._a-zA-Z][-._a-zA-Z0-9]*``;
  ``relaxed=True``: printable ASCII without ``=``); an extended resource (``nvidia.com/gpu``,
  ``google.com/tpu``...) requested must have a limit, equal to the request.
* **container logs** as the kubelet keeps them: CRI lines (``<RFC3339Nano> stdout F
  text``) in a file that is rotated at ``max_bytes`` (kubelet ``containerLogMaxSize``,
  10 MiB by default): the current file is renamed and a new one started. ``pods/log`` reads
  the current file only (``tailLines``, ``limitBytes``, ``timestamps``, ``sinceSeconds``,
  ``sinceTime``; ``previous`` is a 400, containers never restart in place here), and
  ``follow=true`` streams across rotations (it finishes the old file, then continues with
  the new one) until the container has exited. The real kubelet checks sizes every 10 s;
  here a file rotates the moment it passes the limit, which is harsher on readers.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class Stream:
    """A streamed (chunked) response: the handler sends each chunk as it comes."""

    def __init__(self, chunks: Iterator[bytes], content_type: str = "application/json"):
        self.chunks, self.content_type = chunks, content_type


def _api_error(code: int, reason: str, message: str, details: dict | None = None) -> Exception:
    from .k8s_emulator import ApiError

    err = ApiError(code, reason, message)
    err.details = details  # type: ignore[attr-defined]
    return err


# -- field selectors ----------------------------------------------------------------------
COMMON_FIELDS = {"metadata.name", "metadata.namespace"}
FIELDS = {
    "Pod": COMMON_FIELDS
    | {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "Job": COMMON_FIELDS | {"status.successful"},
}


def parse_field_selector(text: str | None, kind: str) -> list[tuple[str, str, str]]:
    """``a=b,c!=d`` -> [(op, field, value)]; 400 for a field the real API does not index."""
    out: list[tuple[str, str, str]] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)", part)
        if not m:
            raise _api_error(400, "BadRequest", f'invalid selector: "{text}"')
        key, op, value = m.group(1), m.group(2), m.group(3)
        if key not in FIELDS.get(kind, COMMON_FIELDS):
            raise _api_error(400, "BadRequest", f'field label not supported: "{key}"')
        out.append(("!=" if op == "!=" else "=", key, value))
    return out


# Selector names that differ from the object's path (the real Job's selector is named so).
FIELD_PATHS = {"status.successful": "status.succeeded"}


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in FIELD_PATHS.get(path, path).split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if cur is None:
        return "0" if path == "status.successful" else ""
    return str(cur)


def fields_match(selector: list[tuple[str, str, str]], obj: dict[str, Any]) -> bool:
    for op, key, value in selector:
        have = field_value(obj, key)
        if (op == "=") != (have == value):
            return False
    return True


# -- watches --------------------------------------------------------------------------------
def watching(q: dict[str, str]) -> bool:
    return (q.get("watch") or "").lower() in ("true", "1")


def watch_stream(
    listing: Callable[[], list[dict[str, Any]]],
    q: dict[str, str],
    stopped: Callable[[], bool],
    tick: float = 0.1,
) -> Stream:
    """Watch events for what ``listing`` returns (already filtered by the request's
    selectors), as newline-delimited JSON."""
    timeout = float(q.get("timeoutSeconds") or 1800)
    since = q.get("resourceVersion") or "0"

    def event(kind: str, obj: dict[str, Any]) -> bytes:
        return (json.dumps({"type": kind, "object": obj}) + "\n").encode()

    def rv(obj: dict[str, Any]) -> int:
        try:
            return int(obj["metadata"].get("resourceVersion") or 0)
        except (TypeError, ValueError):
            return 0

    def chunks() -> Iterator[bytes]:
        seen: dict[str, tuple[str, dict[str, Any]]] = {}
        for obj in listing():
            uid = obj["metadata"].get("uid") or obj["metadata"]["name"]
            seen[uid] = (json.dumps(obj, sort_keys=True), obj)
            if since == "0":
                yield event("ADDED", obj)
            elif rv(obj) > int(since):
                yield event("MODIFIED", obj)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stopped():
            time.sleep(tick)
            now: dict[str, tuple[str, dict[str, Any]]] = {}
            for obj in listing():
                uid = obj["metadata"].get("uid") or obj["metadata"]["name"]
                now[uid] = (json.dumps(obj, sort_keys=True), obj)
                if uid not in seen:
                    yield event("ADDED", obj)
                elif seen[uid][0] != now[uid][0]:
                    yield event("MODIFIED", obj)
            for uid, (_, obj) in seen.items():
                if uid not in now:
                    yield event("DELETED", obj)
            seen = now

    return Stream(chunks())


# -- PATCH ----------------------------------------------------------------------------------
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Spec fields a patch may change, per kind (the real API's update validation).
MUTABLE_SPEC = {
    "Job": {"suspend", "parallelism", "activeDeadlineSeconds", "ttlSecondsAfterFinished"},
    "JobSet": {"suspend"},
    "Service": {"selector", "ports", "publishNotReadyAddresses"},
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge(target: Any, patch: Any) -> Any:
    """Merge patch, except that lists of objects with a ``name`` merge item by item (the
    patch strategy of containers, env, volumes, ports)."""
    if isinstance(patch, list) and isinstance(target, list):
        if all(isinstance(x, dict) and "name" in x for x in patch + target):
            out = [copy.deepcopy(x) for x in target]
            for item in patch:
                i = next((j for j, x in enumerate(out) if x["name"] == item["name"]), None)
                if i is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[i] = strategic_merge(out[i], item)
            return out
        return copy.deepcopy(patch)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):  # directives ($patch, $retainKeys...): not modelled
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise _api_error(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, test (what kubectl patch --type=json sends)."""
    doc = copy.deepcopy(target)
    if not isinstance(ops, list):
        raise _api_error(400, "BadRequest", "a JSON patch is a list of operations")
    for op in ops:
        parts = _pointer(op.get("path", ""))
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op.get("op")
        try:
            if kind == "test":
                have = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if have != op.get("value"):
                    raise _api_error(422, "Invalid", f"test failed at {op['path']}")
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(op["value"])
                    elif kind == "add":
                        parent.insert(int(last), op["value"])
                    else:
                        parent[int(last)] = op["value"]
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = op["value"]
            else:
                raise _api_error(422, "Invalid", f"unsupported JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError):
            raise _api_error(
                422, "Invalid", f"the JSON patch cannot be applied at {op.get('path')}"
            ) from None
    return doc


def apply_patch(
    obj: dict[str, Any], content_type: str | None, raw: bytes, kind: str, group: str
) -> dict[str, Any]:
    """The object after the patch, or the error the real API gives; the caller stores it."""
    ctype = (content_type or "").split(";")[0].strip()
    try:
        patch = json.loads(raw or b"null")
    except ValueError:
        raise _api_error(400, "BadRequest", "the patch is not JSON") from None
    if ctype == MERGE:
        new = merge_patch(obj, patch)
    elif ctype == STRATEGIC:
        new = strategic_merge(obj, patch)
    elif ctype == JSON_PATCH:
        new = json_patch(obj, patch)
    else:
        raise _api_error(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types "
            f"include: {JSON_PATCH}, {MERGE}, {STRATEGIC}",
        )
    name = obj["metadata"]["name"]
    where = f'{kind}{"." + group if group else ""} "{name}"'
    # What a patch of the main resource cannot change: identity and status.
    for key in ("name", "namespace", "uid", "creationTimestamp", "ownerReferences"):
        if key in obj["metadata"]:
            new["metadata"][key] = obj["metadata"][key]
    if "status" in obj:
        new["status"] = obj["status"]
    for k, v in obj.items():
        if k.startswith("_"):
            new[k] = v
    new["apiVersion"], new["kind"] = obj.get("apiVersion"), obj.get("kind")
    old_spec, new_spec = obj.get("spec") or {}, new.get("spec") or {}
    if kind == "Pod":
        changed = _pod_spec_changes(old_spec, new_spec)
        if changed:
            raise invalid(
                kind,
                group,
                name,
                [
                    (
                        "FieldValueForbidden",
                        "spec",
                        "Forbidden: pod updates may not change fields other than "
                        "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                        "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
                        f"existing tolerations) (changed: {', '.join(changed)})",
                    )
                ],
            )
    else:
        mutable = MUTABLE_SPEC.get(kind, set())
        for key in sorted(set(old_spec) | set(new_spec)):
            if key not in mutable and old_spec.get(key) != new_spec.get(key):
                raise invalid(
                    kind,
                    group,
                    name,
                    [
                        (
                            "FieldValueInvalid",
                            f"spec.{key}",
                            "Invalid value: ...: field is immutable",
                        )
                    ],
                )
    from .k8s_emulator import _validate_labels

    _validate_labels(new["metadata"].get("labels"), f"{where} metadata.labels")
    if new_spec != old_spec:
        new["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
    return new


def _pod_spec_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    def strip(spec: dict[str, Any]) -> dict[str, Any]:
        s = copy.deepcopy(spec)
        s.pop("activeDeadlineSeconds", None)
        s.pop("tolerations", None)
        for field in ("containers", "initContainers"):
            for c in s.get(field) or []:
                c.pop("image", None)
        return s

    a, b = strip(old), strip(new)
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    old_tol = old.get("tolerations") or []
    if any(t not in (new.get("tolerations") or []) for t in old_tol):
        changed.append("tolerations (removed)")
    return changed


# -- validation -----------------------------------------------------------------------------
MAX_INT32 = 2**31 - 1
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
ENV_NAME_MESSAGE = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', "
    "'-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or "
    "'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
)
RELAXED_ENV_MESSAGE = (
    "a valid environment variable name must consist only of printable ASCII characters "
    "other than '='"
)
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "storage"}


def _extended(resource: str) -> bool:
    return (
        resource not in STANDARD_RESOURCES
        and not resource.startswith("hugepages-")
        and not resource.startswith("requests.")
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> Exception:
    """422 Invalid with the real API's message and ``details.causes``."""
    msgs = [f"{f}: {m}" for _, f, m in causes]
    text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    full_kind = f"{kind}.{group}" if group else kind
    return _api_error(
        422,
        "Invalid",
        f'{full_kind} "{name}" is invalid: {text}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes],
        },
    )


def pod_spec_causes(spec: dict[str, Any], path: str, relaxed_env: bool = False) -> list[tuple]:
    causes: list[tuple[str, str, str]] = []
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and not (1 <= int(deadline) <= MAX_INT32):
        causes.append(
            (
                "FieldValueInvalid",
                f"{path}.activeDeadlineSeconds",
                f"Invalid value: {deadline}: must be between 1 and {MAX_INT32}, inclusive",
            )
        )
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            where = f"{path}.{field}[{i}]"
            for j, e in enumerate(c.get("env") or []):
                name = str(e.get("name") or "")
                ok = (
                    bool(name) and "=" not in name and all(32 <= ord(ch) < 127 for ch in name)
                    if relaxed_env
                    else bool(ENV_NAME.match(name))
                )
                if not ok:
                    msg = RELAXED_ENV_MESSAGE if relaxed_env else ENV_NAME_MESSAGE
                    causes.append(
                        (
                            "FieldValueInvalid",
                            f"{where}.env[{j}].name",
                            f'Invalid value: "{name}": {msg}',
                        )
                    )
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            for r, value in requests.items():
                if not _extended(r):
                    continue
                if r not in limits:
                    causes.append(
                        (
                            "FieldValueRequired",
                            f"{where}.resources.limits",
                            "Required value: Limit must be set for non overcommitable resources",
                        )
                    )
                elif str(limits[r]) != str(value):
                    causes.append(
                        (
                            "FieldValueInvalid",
                            f"{where}.resources.requests[{r}]",
                            f'Invalid value: "{value}": must be equal to {r} limit of {limits[r]}',
                        )
                    )
    return causes


def job_causes(body: dict[str, Any], relaxed_env: bool = False) -> list[tuple]:
    spec = body.get("spec") or {}
    causes: list[tuple[str, str, str]] = []
    for field in ("activeDeadlineSeconds", "ttlSecondsAfterFinished", "backoffLimit"):
        value = spec.get(field)
        if value is not None and int(value) < 0:
            causes.append(
                (
                    "FieldValueInvalid",
                    f"spec.{field}",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                )
            )
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    return causes + pod_spec_causes(pod_spec, "spec.template.spec", relaxed_env)


# -- container logs -------------------------------------------------------------------------
def rfc3339nano(ns: int | None = None) -> str:
    ns = time.time_ns() if ns is None else ns
    secs, frac = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def parse_time(text: str) -> int:
    """RFC 3339 (seconds or fractions) -> ns since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise _api_error(400, "BadRequest", f'parsing time "{text}" as RFC3339 failed')
    base = datetime.strptime(
        m.group(1) + (m.group(3) if m.group(3) != "Z" else "+00:00"), "%Y-%m-%dT%H:%M:%S%z"
    )
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


class ContainerLog:
    """The kubelet's log file of one container: CRI lines, rotated at ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int = 10 * 1024 * 1024):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.rotations = 0
        self.done = False
        self._out = open(self.path, "wb")  # noqa: SIM115 (kept open while the container runs)
        self._size = 0

    def write(self, data: bytes, partial: bool = False, stream: str = "stdout") -> None:
        record = b"%s %s %s %s\n" % (
            rfc3339nano().encode(),
            stream.encode(),
            b"P" if partial else b"F",
            data,
        )
        self._out.write(record)
        self._out.flush()
        self._size += len(record)
        if self.max_bytes and self._size >= self.max_bytes:
            self._out.close()
            os.replace(self.path, self.path.with_name(f"{self.path.name}.{time.time_ns()}"))
            self._out = open(self.path, "wb")  # noqa: SIM115
            self._size = 0
            self.rotations += 1

    def pump(self, pipe: Any) -> None:
        """Copy a process's output into the log until it closes (the runtime's job)."""
        try:
            while True:
                line = pipe.readline(16384)
                if not line:
                    break
                partial = not line.endswith(b"\n")
                self.write(line if partial else line[:-1], partial)
        finally:
            self._out.close()
            self.done = True


def _records(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """CRI lines -> [(ts ns, ts text, text as the container wrote it)]."""
    out = []
    for line in data.splitlines():
        parts = line.split(b" ", 3)
        if len(parts) < 4:
            continue
        ts, _stream, tag, text = parts
        try:
            ns = parse_time(ts.decode())
        except Exception:  # noqa: BLE001 - a torn line: skip it
            continue
        out.append((ns, ts, text + (b"" if tag == b"P" else b"\n")))
    return out


def _options(q: dict[str, str]) -> tuple[int | None, bool]:
    since: int | None = None
    if q.get("sinceSeconds"):
        since = time.time_ns() - int(q["sinceSeconds"]) * 1_000_000_000
    if q.get("sinceTime"):
        since = parse_time(q["sinceTime"])
    return since, (q.get("timestamps") or "").lower() in ("true", "1")


def read_log(log: ContainerLog, q: dict[str, str]) -> bytes:
    """``GET pods/<pod>/log`` without follow: the current file only, as the kubelet serves."""
    since, stamps = _options(q)
    try:
        data = log.path.read_bytes()
    except FileNotFoundError:  # between a rotation's rename and the new file
        data = b""
    recs = [r for r in _records(data) if since is None or r[0] >= since]
    if q.get("tailLines"):
        recs = recs[-int(q["tailLines"]) :] if int(q["tailLines"]) else []
    out = b"".join((ts + b" " + text) if stamps else text for _, ts, text in recs)
    if q.get("limitBytes"):
        out = out[: int(q["limitBytes"])]
    return out


def follow_log(log: ContainerLog, q: dict[str, str], gone: Callable[[], bool]) -> Stream:
    """``follow=true``: what is there (after since/tail), then every new line, across
    rotations, until the container's output ended (or the pod left)."""
    since, stamps = _options(q)
    limit = int(q["limitBytes"]) if q.get("limitBytes") else None

    def fmt(recs: list[tuple[int, bytes, bytes]]) -> bytes:
        return b"".join(
            (ts + b" " + text) if stamps else text
            for ns, ts, text in recs
            if since is None or ns >= since
        )

    def chunks() -> Iterator[bytes]:
        sent = 0
        f = None
        while f is None:
            try:
                f = open(log.path, "rb")  # noqa: SIM115
            except FileNotFoundError:
                if log.done or gone():
                    return
                time.sleep(0.02)
        ino = os.fstat(f.fileno()).st_ino
        first = f.read()
        cut = first.rfind(b"\n") + 1
        buf = first[cut:]
        recs = _records(first[:cut])
        if q.get("tailLines"):
            recs = recs[-int(q["tailLines"]) :] if int(q["tailLines"]) else []
        try:
            while True:
                out = fmt(recs)
                recs = []
                if out:
                    if limit is not None:
                        out = out[: max(0, limit - sent)]
                    if out:
                        sent += len(out)
                        yield out
                    if limit is not None and sent >= limit:
                        return
                done = log.done  # before the read: what follows is all there is
                chunk = f.read(1 << 20)
                if chunk:
                    buf += chunk
                    cut = buf.rfind(b"\n") + 1
                    recs, buf = _records(buf[:cut]), buf[cut:]
                    continue
                try:
                    now = os.stat(log.path).st_ino
                except FileNotFoundError:
                    now = ino  # mid-rotation: the new file comes in a moment
                if now != ino:  # rotated: drain the old file (closed by now), then switch
                    rest = buf + f.read()
                    f.close()
                    recs, buf = _records(rest), b""
                    f = open(log.path, "rb")  # noqa: SIM115
                    ino = os.fstat(f.fileno()).st_ino
                    continue
                if done or gone():
                    return
                time.sleep(0.02)
        finally:
            f.close()

    return Stream(chunks(), "text/plain")
