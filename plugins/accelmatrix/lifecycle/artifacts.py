"""Copying a cell's artifacts off its machine, once, by whichever step gets there first.

``run`` fetches them as soon as a workload's outcome is final, so that it can release the
machine at once (lifecycle.release); ``collect`` fetches them itself only when ``run`` did
not (an infrastructure failure, a cut-short cell, an earlier try). A marker in the cell's
artifacts dir (``fetched.json``) says they are here. Provisioning a machine for the cell
(a cleared cell, a machine replaced before a retry) removes the markers
(lifecycle.release.forget_earlier_machine), so a marker always speaks of the cell's
current machine, whatever resource record a later task was handed.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from accelmatrix.backends.registry import get_backend
from accelmatrix.lifecycle.common import RunRef, _read_json
from accelmatrix.spec.templating import render_tree

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step

FETCHED = "fetched.json"


def machine_key(resource: dict[str, Any]) -> dict[str, Any]:
    """What a marker records of the machine (its name is deterministic per cell)."""
    return {"name": resource.get("name"), "created_at": resource.get("created_at")}


def same_machine(marker: Any, resource: dict[str, Any]) -> bool:
    """Whether a marker speaks of ``resource``'s machine: by name, because a retry may
    replace the machine under the same name while collect and teardown still hold the first
    record; markers of an earlier machine are removed when the next one is provisioned."""
    return isinstance(marker, dict) and marker.get("name") == resource.get("name")


def fetch_artifacts(cell: dict[str, Any], resource: dict[str, Any], ref: RunRef) -> list[str]:
    """Copy the artifacts matching the workload's globs into ``<artifacts>/files``; return
    their relative paths and leave the marker saying they are here."""
    backend = get_backend(cell["machine_spec"])
    key = machine_key(resource)
    resource = backend.refresh(resource)  # a retried run may have replaced the machine
    art = ref.artifacts(cell["id"])
    files_dir = art / "files"
    globs = []
    for g in render_tree(cell["workload"]["artifacts"], backend.variables(resource)):
        # A param or axis value may have turned a safe glob into one that escapes the work
        # dir: the suite model only saw the template.
        if g.startswith("/") or ".." in re.split(r"[/\\]", g):
            log.warning("artifact glob %r escapes the work dir: not collected", g)
            continue
        globs.append(g)
    copied = backend.collect(resource, globs, files_dir)
    art.mkdir(parents=True, exist_ok=True)
    (art / FETCHED).write_text(json.dumps({**key, "files": copied}))
    log.info("collected %d artifact(s)", len(copied))
    for rel in copied[:50]:
        log.info("  %s", rel)
    return copied


def fetched_artifacts(
    cell: dict[str, Any], resource: dict[str, Any], ref: RunRef
) -> list[str] | None:
    """The files an earlier step already fetched from this very machine, or None."""
    marker = _read_json(ref.artifacts(cell["id"]) / FETCHED)
    if not same_machine(marker, resource):
        return None
    files = marker.get("files")
    return [str(f) for f in files] if isinstance(files, list) else None
