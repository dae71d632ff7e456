"""DagShape: what the DAG of a suite is built from, cached so task processes skip the spec.

Every task start of a matrix run parses the DAG file to find its own operator. Validating
the suite YAML there means importing every pydantic model of the spec (~0.1 s of CPU per
task here, the largest part of what an accelmatrix task cost beyond a plain Airflow task:
6 task starts per cell). The DAG itself needs only a few facts of the suite: its schedule,
params, machines and pools, timeouts. The dag-processor, which validates the suite anyway,
writes those facts to ``$ACCELMATRIX_HOME/cache/dag-shapes-v*/`` keyed by the file's content
hash and a fingerprint of the code that validates and shapes it (the spec package with its
plan, the backends' machine models and registry, this module). Validation is a pure function
of those two (it reads no other file), so a later parse of the same file by the same code
reads the entry back and never imports the spec: every task process, and the dag-processor when it re-parses for task callbacks (Airflow
sends one for every task a trigger ends). A missing entry (another host, a changed file or
code, an invalid suite, which is never cached) means validating the file: never wrong, only
slower.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.spec.loader import load_suite, suite_id
from accelmatrix.spec.plan import expand

log = logging.getLogger(__name__)

# Bump when the fields below or their derivation change: old cache entries are ignored.
SHAPE_VERSION = 3
# The trigger form lists at most this many cell ids in the `cells` param's description.
LISTED_CELLS = 64


@dataclass(frozen=True)
class CellGroup:
    """One mapped task group: the cells of one machine kind, with that machine's pool."""

    machine: str
    pool: str


@dataclass(frozen=True)
class DagShape:
    dag_id: str
    description: str
    schedule: str | None
    max_active_runs: int
    owners: list[str]
    tags: list[str]
    retries: int
    retry_delay_seconds: int
    # name -> {"default": ..., "description": ..., "schema": {type, enum, minimum, ...}}
    params: dict[str, dict[str, Any]]
    groups: list[CellGroup]
    setup_timeout: int
    run_timeout: int
    preflight: bool
    # The ids of the cells a run with default params plans (for the trigger form).
    cell_ids: list[str] = field(default_factory=list)
    # Which ready task gets a free executor slot (the suite's `slot_order`).
    slot_order: str = "machine_time"

    @classmethod
    def from_suite(cls, suite: Any, dag_id: str) -> DagShape:
        """The shape of a validated ``accelmatrix.spec.suite.Suite``."""
        if "machine" in suite.axes:
            machines = suite.axis_labels("machine")
        else:
            machines = [suite.machine or next(iter(suite.machines))]
        params = {
            name: {"default": p.default, "description": p.description, "schema": p.json_schema()}
            for name, p in suite.params.items()
        }
        return cls(
            dag_id=dag_id,
            description=suite.description or "",
            schedule=suite.schedule,
            max_active_runs=suite.max_active_runs,
            owners=list(suite.owners),
            tags=list(suite.tags),
            retries=suite.retries,
            retry_delay_seconds=suite.retry_delay_seconds,
            params=params,
            groups=[CellGroup(m, suite.pool_for(m)) for m in machines],
            setup_timeout=suite.workload.setup_timeout,
            run_timeout=suite.workload.timeout,
            preflight=bool(suite.preflight),
            cell_ids=_default_cell_ids(suite, dag_id),
            slot_order=suite.slot_order,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DagShape:
        data = json.loads(text)
        data["groups"] = [CellGroup(**g) for g in data["groups"]]
        return cls(**data)


def _default_cell_ids(suite: Any, dag_id: str) -> list[str]:
    """Cell ids of a run with the suite's default params; [] when that cannot be planned."""

    try:
        return [c.id for c in expand(suite, dag_id, params={}).cells]
    except Exception:  # noqa: BLE001 - only a hint for the trigger form; the run re-plans
        return []


def load_shape(path: Path, *, use_cache: bool = True) -> DagShape:
    """The shape of the suite file at ``path``; raises SuiteError when it is invalid.

    ``use_cache``: read a cached shape if one matches the file's content and the code;
    otherwise (or with False) validate the file and refresh the cache.
    """
    key = hashlib.sha256(path.read_bytes() + _code_fingerprint().encode()).hexdigest()[:24]
    entry = _cache_dir() / f"{path.stem}-{key}.json"
    if use_cache:
        try:
            return DagShape.from_json(entry.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            pass  # fall back to validating the file

    shape = DagShape.from_suite(load_suite(path), suite_id(path))
    _write(entry, shape)
    return shape


@functools.cache
def _code_fingerprint() -> str:
    """Size and mtime of every source file that decides a shape (a stat per file)."""
    pkg = Path(__file__).parent
    files = [
        *sorted((pkg / "spec").glob("*.py")),
        *sorted((pkg / "backends" / "machines").glob("*.py")),
        pkg / "backends" / "machine_kinds.py",
        # The metric-source models are part of a suite's validation too.
        pkg / "metrics" / "source_models.py",
        pkg / "metrics" / "sources.py",
        Path(__file__),
    ]
    parts = []
    for f in files:
        st = f.stat()
        parts.append(f"{f.relative_to(pkg)}:{st.st_size}:{st.st_mtime_ns}")
    return ";".join(parts)


def _cache_dir() -> Path:
    return settings.home() / "cache" / f"dag-shapes-v{SHAPE_VERSION}"


def _write(entry: Path, shape: DagShape) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(shape.to_json())
        os.replace(tmp, entry)
    except OSError as e:  # a read-only home costs speed, not correctness
        log.debug("dag shape of %s not cached: %s", entry.name, e)
