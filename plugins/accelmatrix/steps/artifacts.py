"""Copying a cell's artifacts off its machine, once, by whichever step gets there first.

``run`` fetches them as soon as a workload's outcome is final, so that it can release the
machine at once (steps/release.py); ``collect`` fetches them itself only when ``run`` did
not (an infrastructure failure, a cut-short cell, an earlier try). A marker in the cell's
artifacts dir (``fetched.json``) says they are here. Provisioning a machine for the cell
(a cleared cell, a machine replaced before a retry) removes the markers
(release.forget_earlier_machine), so a marker always speaks of the cell's
current machine, whatever resource record a later task was handed.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from accelmatrix.backends.machine_kinds import get_backend
from accelmatrix.contracts.machine_records import MachineResource
from accelmatrix.errors import InfrastructureError
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.templating import render_tree
from accelmatrix.steps.common import RunRef, _read_json

log = logging.getLogger("accelmatrix.lifecycle")  # one logger for every step

FETCHED = "fetched.json"


class ArtifactsDiskFull(InfrastructureError):
    """The filesystem of the cell's artifacts dir filled up while the artifacts were copied
    there: the machine and the workload are fine, this host's disk is not."""


def _out_of_space(e: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error behind ``e`` (a backend may wrap it), or None."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _disk_full(art: Path, files_dir: Path, error: OSError) -> ArtifactsDiskFull:
    """The partial copy goes (it is incomplete, and the metrics and markers that come next
    need room); the message names the directory, what the copy had used and what is free."""
    partial = sum(p.stat().st_size for p in files_dir.rglob("*") if p.is_file())
    shutil.rmtree(files_dir, ignore_errors=True)
    try:
        usage = shutil.disk_usage(art)
        room = f"{usage.free} of {usage.total} bytes free there"
    except OSError:
        room = "its free space unknown"
    return ArtifactsDiskFull(
        f"artifacts disk full: no space left in {art} (copying the artifacts needed more "
        f"than the {partial} bytes it had written; {room}): {error.strerror or error}"
    )


def machine_key(resource: MachineResource) -> dict[str, str | float | None]:
    """What a marker records of the machine (its name is deterministic per cell)."""
    return {"name": resource.name, "created_at": resource.created_at}


def same_machine(marker: Any, resource: MachineResource) -> bool:
    """Whether a marker speaks of ``resource``'s machine: by name, because a retry may
    replace the machine under the same name while collect and teardown still hold the first
    record; markers of an earlier machine are removed when the next one is provisioned."""
    return isinstance(marker, dict) and marker.get("name") == resource.name


def fetch_artifacts(cell: CellSpec, resource: MachineResource, ref: RunRef) -> list[str]:
    """Copy the artifacts matching the workload's globs into ``<artifacts>/files``; return
    their relative paths and leave the marker saying they are here."""
    backend = get_backend(cell.machine_spec)
    key = machine_key(resource)
    resource = backend.refresh(resource)  # a retried run may have replaced the machine
    art = ref.artifacts(cell.id)
    files_dir = art / "files"
    globs = []
    for g in render_tree(cell.workload.artifacts, backend.variables(resource)):
        # A param or axis value may have turned a safe glob into one that escapes the work
        # dir: the suite model only saw the template.
        if g.startswith("/") or ".." in re.split(r"[/\\]", g):
            log.warning("artifact glob %r escapes the work dir: not collected", g)
            continue
        globs.append(g)
    try:
        copied = backend.collect(resource, globs, files_dir)
    except Exception as e:
        full = _out_of_space(e)
        if full is None:
            raise
        raise _disk_full(art, files_dir, full) from e
    art.mkdir(parents=True, exist_ok=True)
    (art / FETCHED).write_text(json.dumps({**key, "files": copied}))
    log.info("collected %d artifact(s)", len(copied))
    for rel in copied[:50]:
        log.info("  %s", rel)
    return copied


def fetched_artifacts(cell: CellSpec, resource: MachineResource, ref: RunRef) -> list[str] | None:
    """The files an earlier step already fetched from this very machine, or None."""
    marker = _read_json(ref.artifacts(cell.id) / FETCHED)
    if not same_machine(marker, resource):
        return None
    files = marker.get("files")
    return [str(f) for f in files] if isinstance(files, list) else None
