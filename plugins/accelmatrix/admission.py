"""Admission: a cell gets its machine only when Airflow can drive the cell's next steps.

Why. Between its workload and Airflow's bookkeeping a cell needs four task starts while it
holds its machine (setup, run, collect, teardown). Airflow gives free executor slots to
whatever is schedulable, and while cells hop between steps the free slots go to other
cells' ``provision``: at 64 cells every machine was created in the first seconds and then
sat idle, its cell queued behind dozens of others for a slot (26 s median held minus
workload at N=64 on two cores, BENCHMARKS.md). Priority weights (``weight_rule=upstream``)
order the queue but cannot stop machines being created early; only a limit on how many
cells wait *between steps* can.

The rule. A cell is *between steps* while it holds a machine (provisioned, not torn down)
and is not running its workload: its setup, run start, collect or teardown waits for an
executor slot. ``provision`` creates a machine only while fewer cells of its run than the
limit are between steps; otherwise it defers to ``ProvisionTrigger``, which admits it when
one leaves (and then provisions and ends the task itself, no second task start). A cell
whose workload is running does not count, so long workloads still run all at once: the
limit bounds Airflow's queue, not the matrix's parallelism (the machine's pool does that).
An admission is one transaction in the results store (count, then mark the cell
provisioning, under the run's lock), so provisions starting together on several workers
cannot all take the last place.

The limit defaults to Airflow's ``[core] parallelism``: more cells between steps than the
executor has slots only queue. ``ACCELMATRIX_CELLS_BETWEEN_STEPS`` overrides it (``0``: no
limit). It is counted per run: runs of several suites at once each get the limit. A cell
never waits longer than ``MAX_WAIT_SECONDS`` (a cell whose teardown never comes keeps
counting until the gate): then it is provisioned anyway, so the limit never stalls a run.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from accelmatrix.store_access import results_store

ENV_LIMIT = "ACCELMATRIX_CELLS_BETWEEN_STEPS"
# A waiting cell is provisioned anyway after this long: the limit must never stall a run.
MAX_WAIT_SECONDS = 600.0
# How often a waiting cell looks again, and how old a shared count may be (one query per
# run and interval in the triggerer, however many cells wait).
POLL_SECONDS = 0.5
# An admitted cell counts as between steps until its machine exists; if creating it takes
# longer (a TPU queued in the cloud), it stops counting after this long: it holds nothing.
CLAIM_SECONDS = 60.0


def limit() -> int:
    """Cells of one run allowed between steps at once; 0 means no limit."""
    raw = os.environ.get(ENV_LIMIT, "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise ValueError(f"{ENV_LIMIT}={raw!r}: expected a whole number >= 0") from None
    from airflow.configuration import conf  # Airflow's own setting, read where tasks run

    return max(1, conf.getint("core", "parallelism", fallback=32))


def try_admit(dag_id: str, run_id: str, cell_id: str, cap: int) -> bool:
    """Admit the cell now if fewer than ``cap`` cells of its run are between steps; an
    admitted cell counts from this moment (one transaction: concurrent provisions on
    several workers cannot all take the last place)."""
    if cap <= 0:
        return True
    return results_store().claim_admission(dag_id, run_id, cell_id, cap, CLAIM_SECONDS) is None


class Admissions:
    """The triggerer's admissions of waiting cells. While a run is full, its waiting cells
    share one look at the store per ``POLL_SECONDS`` (the count a refused claim returned)
    instead of each writing a claim every round."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._full_until: dict[tuple[str, str], float] = {}

    def try_admit(self, dag_id: str, run_id: str, cell_id: str, cap: int) -> bool:
        """Blocking (run it in a thread). True: the cell is admitted and counted."""
        key = (dag_id, run_id)
        with self._lock:
            if time.monotonic() < self._full_until.get(key, 0.0):
                return False
            if try_admit(dag_id, run_id, cell_id, cap):
                return True
            self._full_until[key] = time.monotonic() + POLL_SECONDS
            return False

    async def wait(self, dag_id: str, run_id: str, cell_id: str, cap: int, until: float) -> bool:
        """Wait until the cell is admitted (True) or ``until`` (epoch s) passes (False)."""
        while True:
            if await asyncio.to_thread(self.try_admit, dag_id, run_id, cell_id, cap):
                return True
            if time.time() >= until:
                return False
            await asyncio.sleep(POLL_SECONDS)


ADMISSIONS = Admissions()
