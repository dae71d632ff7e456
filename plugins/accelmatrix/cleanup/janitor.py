"""The janitor: find accelerators a dead run left behind and release them.

A worker killed mid-cell, a scheduler restarted at the wrong moment or a teardown that ran
out of retries can leave a TPU VM, a Kubernetes Job or a work dir running and costing money.
Every resource accelmatrix creates carries the labels ``managed-by=accelmatrix``, ``dag``,
``run``, ``cell`` and ``ttl`` (a Unix time), plus ``task-group`` and ``map-index`` naming
the mapped task instances that own it. The janitor, for every distinct machine of every
suite:

1. lists the backend's managed resources and drops anything without
   ``managed-by=accelmatrix`` (it never touches a resource it did not create);
2. keeps every resource whose TTL has not passed;
3. past its TTL, asks Airflow about the owner: a run that is gone or finished, or a cell
   whose task instances are all finished, means nobody will tear it down: it is reaped.
   A cell of a run still running with a task not finished is kept until ``grace_seconds``
   past its TTL (a legitimately long cell must set a longer TTL, not lose its machine);
4. records every reap (and, in a dry run, every would-be reap) with the reason in the
   results store's ``reaped`` table.

Labels on Google and Kubernetes resources are lowercased and truncated, so the exact ids
come from each backend's ``detail["identity"]`` (node metadata, Job annotations, the
record file); without it the owner cannot be looked up reliably and only the grace applies.

Airflow is reached through an :class:`OwnerLookup`: the Task SDK's API client inside the
janitor task (:class:`SdkOwnerLookup`), the metadata DB for the CLI (:class:`DbOwnerLookup`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.airflow_state import (
    FINISHED_RUN_STATES,
    FINISHED_TI_STATES,
    OWNER_GROUP_LABEL,
    OWNER_INDEX_LABEL,
    DbOwnerLookup,
    OwnerLookup,
    SdkOwnerLookup,
)
from accelmatrix.backends.base import MANAGED_BY, Backend, ManagedResource
from accelmatrix.backends.machine_kinds import KINDS, get_backend, machine_of
from accelmatrix.results import results_store
from accelmatrix.spec.loader import load_suites, suite_files

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 6 * 3600
# What Airflow says about a resource's owner, and the labels naming it, live in
# accelmatrix.airflow_state (lifecycle, stopped and clearing ask it too); kept importable here.
__all__ = [
    "FINISHED_RUN_STATES",
    "FINISHED_TI_STATES",
    "OWNER_GROUP_LABEL",
    "OWNER_INDEX_LABEL",
    "DbOwnerLookup",
    "OwnerLookup",
    "SdkOwnerLookup",
    "reap_run",
    "run",
    "sweep",
]


@dataclass
class Decision:
    """What the janitor made of one resource."""

    resource: ManagedResource
    reap: bool
    reason: str
    identity: dict[str, str] | None = None
    error: str | None = None
    done: bool = False  # teardown ran (False in a dry run)


@dataclass
class Report:
    decisions: list[Decision] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)  # machine key -> error
    ignored_unmanaged: int = 0

    @property
    def reaped(self) -> list[Decision]:
        return [d for d in self.decisions if d.reap]

    @property
    def failed(self) -> list[Decision]:
        return [d for d in self.decisions if d.error]

    def table(self) -> str:
        lines = [f"{'action':<10} {'backend':<8} {'name':<60} reason"]
        for d in self.decisions:
            action = ("REAPED" if d.done else "WOULD-REAP") if d.reap else "keep"
            if d.error:
                action = "ERROR"
            lines.append(
                f"{action:<10} {d.resource.backend:<8} {d.resource.name[:60]:<60} {d.reason}"
                + (f" [error: {d.error}]" if d.error else "")
            )
        for key, err in self.unreachable.items():
            lines.append(f"{'UNLISTED':<10} {key}: {err}")
        lines.append(
            f"{self.ignored_unmanaged} resource(s) without managed-by={MANAGED_BY} ignored"
        )
        return "\n".join(lines)


# -- machines ---------------------------------------------------------------------------------
def backend_for(spec: dict[str, Any]) -> Backend:
    """The backend of a machine spec as the janitor holds it (its JSON form)."""
    return get_backend(machine_of(spec))


def machine_key(spec: dict[str, Any]) -> str:
    """What makes two machine specs list the same resources (a zone, a namespace, a host):
    each backend's ``janitor_key`` in the registry."""
    kind = spec.get("backend")
    if kind not in KINDS:
        return str(kind)
    return KINDS[kind].janitor_key(spec)


def machines_from_suites(suites_dir: Path | str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Distinct machine specs of every valid suite, by :func:`machine_key`; and the broken
    suite files (whose machines cannot be known, so their resources wait for their TTL
    to be judged when the file is fixed or by another suite sharing the machine)."""

    good, bad = load_suites(suite_files(suites_dir))
    machines: dict[str, dict[str, Any]] = {}
    for suite in good.values():
        for m in suite.machines.values():
            spec = m.model_dump(mode="json")
            machines.setdefault(machine_key(spec), spec)
    return machines, sorted(bad)


# -- judging ----------------------------------------------------------------------------------
def is_managed(res: ManagedResource) -> bool:
    return (res.labels or {}).get("managed-by") == MANAGED_BY


def _identity(res: ManagedResource) -> tuple[dict[str, str] | None, bool]:
    """(dag_id, run_id, cell_id) of a resource and whether they are exact."""
    ident = res.detail.identity
    if ident is not None:
        return ident.model_dump(), True
    labels = res.labels or {}
    if labels.get("dag") and labels.get("run"):
        lossy = {
            "dag_id": labels["dag"],
            "run_id": labels["run"],
            "cell_id": labels.get("cell", ""),
        }
        return lossy, False
    return None, False


def judge(
    res: ManagedResource, lookup: OwnerLookup, *, now: float, grace_seconds: float
) -> Decision:
    """Reap or keep one managed resource, with the reason a person can check."""
    labels = res.labels or {}
    ident, exact = _identity(res)
    try:
        ttl = float(labels["ttl"])
    except (KeyError, TypeError, ValueError):
        return Decision(res, False, f"kept: no valid ttl label ({labels.get('ttl')!r})", ident)
    if now < ttl:
        return Decision(res, False, f"kept: within its TTL ({ttl - now:.0f} s left)", ident)
    late = now - ttl
    past_grace = late >= grace_seconds
    over = f"past its TTL by {late:.0f} s"
    if ident is None:
        if past_grace:
            return Decision(res, True, f"{over} (grace {grace_seconds:.0f} s); owner unknown")
        return Decision(res, False, f"kept: {over} but its owner is unknown; waiting for grace")
    dag_id, run_id = ident["dag_id"], ident["run_id"]
    state = lookup.run_state(dag_id, run_id)
    if state is None:
        if exact or past_grace:
            return Decision(res, True, f"{over}; DAG run {dag_id}/{run_id} does not exist", ident)
        return Decision(
            res, False, f"kept: {over}; no run matches its lossy labels; waiting for grace", ident
        )
    if state in FINISHED_RUN_STATES:
        return Decision(res, True, f"{over}; DAG run {dag_id}/{run_id} is {state}", ident)
    group, index = labels.get(OWNER_GROUP_LABEL), labels.get(OWNER_INDEX_LABEL)
    owner: dict[str, str | None] = {}
    if group and index is not None and str(index).isdigit():
        owner = lookup.cell_states(dag_id, run_id, group, int(index))
    active = {t: s for t, s in owner.items() if s not in FINISHED_TI_STATES}
    if owner and not active:
        teardown = owner.get(f"{group}.teardown")
        return Decision(
            res,
            True,
            f"{over}; run {run_id} is {state} but every task of the cell is finished "
            f"(teardown: {teardown})",
            ident,
        )
    if past_grace:
        return Decision(
            res,
            True,
            f"{over} (grace {grace_seconds:.0f} s) while its run {run_id} is still {state}",
            ident,
        )
    why = ", ".join(f"{t}={s}" for t, s in sorted(active.items())) or "owner tasks unknown"
    return Decision(res, False, f"kept: {over} but run {run_id} is {state} ({why})", ident)


# -- the sweep --------------------------------------------------------------------------------
def sweep(
    machines: dict[str, dict[str, Any]],
    lookup: OwnerLookup,
    *,
    dry_run: bool,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    store: Any = None,
    now: float | None = None,
    say: Callable[[str], None] = log.info,
    backend_factory: Callable[[dict[str, Any]], Any] = backend_for,
) -> Report:
    """List, judge and (unless ``dry_run``) tear down; every reap goes into ``store``."""
    report = Report()
    now = time.time() if now is None else now
    seen: set[tuple[str, str]] = set()
    for key, spec in sorted(machines.items()):
        try:
            backend = backend_factory(spec)
            resources = backend.list_managed()
        except Exception as e:  # one unreachable cluster must not stop the others
            report.unreachable[key] = f"{type(e).__name__}: {e}"
            say(f"machine {key}: cannot list resources: {e}")
            continue
        say(f"machine {key}: {len(resources)} resource(s) listed")
        for res in resources:
            if not is_managed(res):
                report.ignored_unmanaged += 1
                continue
            if (res.backend, res.name) in seen:
                continue
            seen.add((res.backend, res.name))
            d = judge(res, lookup, now=now, grace_seconds=grace_seconds)
            report.decisions.append(d)
            if d.reap:
                _reap(backend, d, dry_run=dry_run, store=store, say=say)
    return report


def reap_run(
    dag_id: str,
    run_id: str,
    machine_specs: Iterable[dict[str, Any]],
    *,
    reason: str = "its run is over",
    say: Callable[[str], None] = log.info,
    store: Any = None,
    backend_factory: Callable[[dict[str, Any]], Any] = backend_for,
) -> Report:
    """Tear down now, whatever their TTL, the managed resources of one run that is over.

    For a run stopped from outside or deleted (see stopped.py): its teardowns did not all
    run, or could not, and nobody else will. Only resources whose exact identity names this
    run are touched; every reap is recorded like the sweep's.
    """
    if store is None:
        store = results_store()
    machines = {machine_key(spec): spec for spec in machine_specs}
    report = Report()
    for key, spec in sorted(machines.items()):
        try:
            backend = backend_factory(spec)
            resources = backend.list_managed()
        except Exception as e:  # noqa: BLE001 - reported; the other machines still go
            report.unreachable[key] = f"{type(e).__name__}: {e}"
            say(f"machine {key}: cannot list resources: {e}")
            continue
        for res in resources:
            ident, exact = _identity(res)
            if not (is_managed(res) and exact and ident):
                continue
            if (ident["dag_id"], ident["run_id"]) != (dag_id, run_id):
                continue
            d = Decision(res, True, f"{reason} (cell {ident['cell_id']})", ident)
            report.decisions.append(d)
            _reap(backend, d, dry_run=False, store=store, say=say)
    return report


def _reap(backend: Any, d: Decision, *, dry_run: bool, store: Any, say: Callable) -> None:
    res = d.resource
    if not is_managed(res):  # belt and braces: judge never gets one, but never delete it
        raise AssertionError(f"refusing to reap unmanaged {res.name}")
    if not dry_run:
        record = res.detail.resource
        try:
            if record is None:
                raise RuntimeError("the backend gave no teardown record for it")
            backend.teardown(record)
            d.done = True
        except Exception as e:
            d.error = f"{type(e).__name__}: {e}"
    verb = "would reap" if dry_run else ("reaped" if d.done else "FAILED to reap")
    say(f"{verb} {res.backend} {res.name}: {d.reason}" + (f" ({d.error})" if d.error else ""))
    if store is not None:
        ident = d.identity or {}
        children = res.detail.children
        store.record_reaped(
            backend=res.backend,
            name=res.name,
            labels=res.labels,
            # A group resource (a JobSet) names every object it held, exactly.
            reason=d.reason + (f"; objects: {', '.join(children)}" if children else ""),
            dry_run=dry_run,
            dag_id=ident.get("dag_id"),
            run_id=ident.get("run_id"),
            cell_id=ident.get("cell_id"),
            error=d.error,
        )


def run(
    *,
    dry_run: bool,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    lookup: OwnerLookup | None = None,
    suites_dir: Path | str | None = None,
    extra_machines: Iterable[dict[str, Any]] = (),
    say: Callable[[str], None] = log.info,
) -> Report:
    """One janitor pass over every machine of every suite (what the janitor DAG runs)."""
    # SQLAlchemy loads with the store: kept out of DAG parse time (the janitor DAG's file).
    from accelmatrix.results.store import ResultsStore

    machines, broken = machines_from_suites(suites_dir or settings.suites_dir())
    for spec in extra_machines:
        machines.setdefault(machine_key(spec), spec)
    # Local work dirs are always looked at: they cost nothing to list.
    machines.setdefault("local", {"backend": "local"})
    for path in broken:
        say(f"suite {path} is invalid: its machines are not swept")
    say(f"janitor: {len(machines)} machine(s), dry_run={dry_run}, grace={grace_seconds:.0f} s")
    report = sweep(
        machines,
        lookup or DbOwnerLookup(),
        dry_run=dry_run,
        grace_seconds=grace_seconds,
        store=ResultsStore.from_settings(),
        say=say,
    )
    for line in report.table().splitlines():
        say(line)
    return report
