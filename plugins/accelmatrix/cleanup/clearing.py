"""Clearing one cell re-provisions that cell's machine only.

Airflow 3.3.2 widens every clear of a mapped task to the setup and teardown tasks of the
task group, by task id and therefore for EVERY map index: clearing ``tpu.run`` of one
failed cell also clears ``tpu.provision`` and ``tpu.teardown`` of all other cells. Left
alone, one "re-run this cell" click would create (and then delete) a TPU slice for every
cell of the run.

The provision step therefore asks, when it runs again (try number > 1), whether its own
cell has anything left to do on a machine: a cleared cell has its setup, run or collect
step back in a not-yet-finished state; a cell that was only swept up by Airflow's widening
has all three finished. Such a cell's provision is skipped (with a log line saying why),
and its teardown, whose only setup was skipped, is skipped by Airflow's trigger rule.

A retry of a failed provision passes the same test naturally: its setup, run and collect
never ran, so they are still pending.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accelmatrix.airflow_state import FINISHED_TI_STATES, OwnerLookup, SdkOwnerLookup

log = logging.getLogger(__name__)

# The steps that use the cell's machine. Evaluation reads the results store only, so
# clearing `evaluate` alone re-evaluates without a machine.
MACHINE_STEPS = ("setup", "run", "collect")


def pending_machine_steps(states: Mapping[str, str | None], task_group: str) -> list[str]:
    """The machine steps of one cell that will still run (``states``: task_id -> state).

    A step missing from ``states`` counts as pending: better one machine too many than a
    cell whose run finds no machine.
    """
    pending = []
    for step in MACHINE_STEPS:
        state = states.get(f"{task_group}.{step}")
        if state not in FINISHED_TI_STATES:
            pending.append(step)
    return pending


@dataclass(frozen=True)
class ReprovisionDecision:
    """What a provision that runs again must do for its cell."""

    provision: bool  # create the machine (False: skip, nothing of this cell will run)
    setup_again: bool  # the cell's setup is not cleared but its run is: redo it here
    why: str


def decide(
    dag_id: str,
    run_id: str,
    task_group: str,
    map_index: int,
    lookup: OwnerLookup | None = None,
) -> ReprovisionDecision:
    """Decide from the cell's task states (see the module docstring).

    Clearing ``run`` with its downstream leaves ``setup`` (upstream of run) finished, but
    teardown deleted the machine it set up: the new machine must be set up again before
    the run, and provision does that itself (``setup_again``).
    """
    lookup = lookup or SdkOwnerLookup()
    try:
        states = lookup.cell_states(dag_id, run_id, task_group, map_index)
    except Exception as e:  # the execution API is down: provisioning is the safe choice
        log.warning("could not read this cell's task states (%s); provisioning anyway", e)
        return ReprovisionDecision(True, False, f"task states unavailable ({e})")
    pending = pending_machine_steps(states, task_group)
    if pending:
        return ReprovisionDecision(
            provision=True,
            setup_again="setup" not in pending,
            why=f"this cell's {', '.join(pending)} will run",
        )
    finished = ", ".join(f"{s}={states.get(f'{task_group}.{s}')}" for s in MACHINE_STEPS)
    return ReprovisionDecision(
        provision=False,
        setup_again=False,
        why=(
            "this cell was not cleared: its machine steps are finished "
            f"({finished}); Airflow re-queued provision only because clearing another cell "
            "of the group clears the setup tasks of every map index"
        ),
    )


def needs_check(context: Any) -> bool:
    """Only a provision that already ran once (retry or clear) can be a widened clear."""
    ti = context.get("ti")
    return int(getattr(ti, "try_number", 1) or 1) > 1 and getattr(ti, "map_index", -1) >= 0
