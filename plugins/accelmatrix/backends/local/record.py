"""A local cell's machine on disk: its work dir and the resource record inside it.

The record (``resource.json``) carries the labels a cloud resource would, so the janitor
treats a local cell like any other; it also holds what a later task must stop (a setup
command's group, the services), because the task that started them may have died. Writes
are atomic (a reader never sees half a record). The work dir's empty parents are removed
with it, and created again if a finishing cell of the same run removed them meanwhile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.backends.runner import status as runner_status
from accelmatrix.contracts.machine_records import CellIdentity

RECORD = "resource.json"


def read_json(path: Path) -> dict[str, Any] | None:
    """A record or the runner's status; None if missing or unreadable."""
    try:
        return runner_status.parse(path.read_bytes())
    except OSError:
        return None


def update_record(path: Path, **fields: Any) -> None:
    """Add fields to the resource record, atomically."""
    data = read_json(path) or {}
    data.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def exact_identity(labels: dict[str, Any]) -> CellIdentity | None:
    """(dag, run, cell) from labels that hold them verbatim (local and SSH records)."""
    dag, run, cell = labels.get("dag"), labels.get("run"), labels.get("cell")
    if not all(isinstance(v, str) and v for v in (dag, run, cell)):
        return None
    return CellIdentity(dag_id=dag, run_id=run, cell_id=cell)


def remove_empty_parents(work_dir: Path) -> None:
    """Remove the cell's run and dag folders under the work root once they are empty, so a
    finished run leaves no `work/<dag>/<run>/` behind. Never the work root itself; a folder
    another cell still uses is not empty and stays (rmdir refuses)."""
    root = settings.work_root().resolve()
    for parent in (work_dir.parent, work_dir.parent.parent):
        try:
            if parent.resolve() == root or not parent.resolve().is_relative_to(root):
                return
            parent.rmdir()
        except OSError:
            return


def make_work_dir(work_dir: Path) -> None:
    """mkdir -p, once more if a finishing cell of the same run removed the (then empty) run
    folder between the two mkdirs (remove_empty_parents)."""
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError:
        work_dir.mkdir(parents=True, exist_ok=True)
