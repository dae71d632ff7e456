"""The outcome table of the fault-injection suite (tests/test_fault_matrix.py).

Faults are rows, backends columns; each entry says what the cell ended as, whether Airflow
retried it, what was left behind and how many of the metric rows the workload printed the
results store lacks, e.g. ``run_failed, 0 leaked, 0 rows lost`` or ``LEAK: 1 node``.
An entry fails the suite when something leaked or is inconsistent, unless the (fault,
backend) pair is in ``KNOWN_LEAKS``: those are reported (marked ``known``), not failed. The
table is meant to be pasted into docs/reliability.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from accelmatrix.backends.machine_kinds import KINDS

# The suite's `machine` axis value -> the backend kind it runs on (the table's columns).
MACHINES = {
    "local": "local",
    "ssh": "ssh",
    "tpu": "tpu-vm",
    "k8s": "k8s-job",
    "jobset": "k8s-jobset",
}
# Backend kinds of the registry the matrix does not run, and why. A new kind in the registry
# must land in one of the two (tests/test_backend_registry.py checks it).
NOT_COVERED = {
    "gke-tpu": "not in the matrix (a k8s-jobset with TPU selectors): tests/test_gke_tpu.py",
}
BACKENDS = tuple(MACHINES.values())
assert set(BACKENDS) <= set(KINDS), f"not backend kinds: {set(BACKENDS) - set(KINDS)}"

# Row label -> the `fault` axis value that injects it (None: a run-level fault).
FAULTS: dict[str, str | None] = {
    "workload fails": "workload",
    "setup fails": "setup",
    "provision fails half way": "provision",
    "workload hits its timeout": "timeout",
    "setup task SIGKILLed mid-setup": "kill",
    # tpu-vm: the node is preempted; k8s-jobset: the leader pod's node (DisruptionTarget).
    "node preempted mid-run": "preempt",
    # The cell's artifacts dir is a 256 KiB tmpfs; the workload leaves a 1 MiB artifact.
    "artifacts disk full (256 KiB tmpfs) at collect": "diskfull",
    "scheduler stopped + restarted mid-run": None,
    "DAG run marked failed (REST) mid-run": None,
    "triggerer SIGKILLed while run is deferred, restarted 10 s later": None,
    "second triggerer takes over from a SIGKILLed one (HA)": None,
    "api-server restarted while tasks run": None,
    "results store (PostgreSQL) down 30 s during collect": None,
    "cloud API unreachable 60 s mid-run (TPU + Kubernetes emulators down)": None,
}
RUN_MARKED_FAILED = "DAG run marked failed (REST) mid-run"
TRIGGERER_KILLED = "triggerer SIGKILLed while run is deferred, restarted 10 s later"
TRIGGERER_TAKEOVER = "second triggerer takes over from a SIGKILLed one (HA)"
API_SERVER_RESTART = "api-server restarted while tasks run"
STORE_DOWN = "results store (PostgreSQL) down 30 s during collect"
CLOUD_API_DOWN = "cloud API unreachable 60 s mid-run (TPU + Kubernetes emulators down)"
# Row -> the backends it does not apply to, and why (the table says "n/a").
NOT_APPLICABLE: dict[str, tuple[tuple[str, ...], str]] = {
    CLOUD_API_DOWN: (("local", "ssh"), "no cloud API: the machine is this host / an SSH host"),
}

# Faults that end the cell before its workload starts: no metric row can be printed or
# stored, so "rows lost" would compare 0 with 0; the table says "rows n/a" instead.
NO_WORKLOAD: frozenset[str] = frozenset({"setup", "provision"})

# The phases of tests/test_fault_matrix.py, in the order they run; ACCELMATRIX_FAULT_PHASES
# names some of them (comma-separated), all when it is unset.
PHASES = (
    "per_cell",
    "marked_failed",
    "scheduler",
    "triggerer",
    "triggerer_ha",
    "api_server",
    "store",
    "cloud",
)


def phases_from(value: str | None) -> list[str]:
    """The phases ACCELMATRIX_FAULT_PHASES names (all of PHASES when unset). An empty list,
    or a name that is not a phase, is refused: a run that injects no fault is not green."""
    if value is None:
        return list(PHASES)
    phases = [p.strip() for p in value.split(",") if p.strip()]
    if not phases:
        raise ValueError(
            f"ACCELMATRIX_FAULT_PHASES is set but names no phase ({value!r}): name some of "
            f"{', '.join(PHASES)}, or unset it for all"
        )
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"ACCELMATRIX_FAULT_PHASES: {unknown} are not phases of {PHASES}")
    return phases


# Reported, never failed: (row, backend) pairs with a known, not yet fixed problem. Empty:
# the run-marked-failed cleanup (accelmatrix.cleanup.stopped) is merged.
KNOWN_LEAKS: frozenset[tuple[str, str]] = frozenset()


@dataclass
class Outcome:
    """What one fault did on one backend."""

    fault: str
    backend: str
    state: str = ""
    retried: list[str] = field(default_factory=list)  # the steps Airflow ran more than once
    leaks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    applicable: bool = True
    # False where the fault ends the cell before its workload starts (NO_WORKLOAD).
    workload_ran: bool = True
    # Metric rows: what the workload printed (its last attempt) and what the store holds.
    expected_rows: int | None = None
    stored_rows: int | None = None

    @property
    def rows_lost(self) -> int | None:
        """Rows the workload printed that the store lacks (None: not measured)."""
        if not self.workload_ran or self.expected_rows is None or self.stored_rows is None:
            return None
        return max(0, self.expected_rows - self.stored_rows)

    @property
    def rows_extra(self) -> int | None:
        """Rows the store holds beyond what the workload printed: a row stored twice."""
        if not self.workload_ran or self.expected_rows is None or self.stored_rows is None:
            return None
        return max(0, self.stored_rows - self.expected_rows)

    def row_problems(self) -> list[str]:
        """What is wrong with the cell's metric rows: lost, stored twice, or stored for a
        workload that never ran."""
        if not self.workload_ran:
            if self.stored_rows:
                return [f"{self.stored_rows} metric rows stored, but the workload never ran"]
            return []
        out = []
        if self.rows_lost:
            out.append(
                f"{self.rows_lost} of the {self.expected_rows} metric rows the workload printed "
                f"are not in the results store ({self.stored_rows} stored)"
            )
        if self.rows_extra:
            out.append(
                f"{self.stored_rows} metric rows stored for the {self.expected_rows} the "
                f"workload printed: {self.rows_extra} stored twice"
            )
        return out

    @property
    def known(self) -> bool:
        return (self.fault, self.backend) in KNOWN_LEAKS

    @property
    def bad(self) -> bool:
        return bool(self.leaks or self.problems)

    @property
    def failing(self) -> bool:
        """Fails the suite: something leaked or is inconsistent, and it is not a known case."""
        return self.bad and not self.known

    def text(self) -> str:
        if not self.applicable:
            return "n/a"
        parts = [self.state or "?"]
        if self.retried:
            parts.append(f"retried {'+'.join(self.retried)}")
        parts.append(f"LEAK: {', '.join(self.leaks)}" if self.leaks else "0 leaked")
        if not self.workload_ran:
            parts.append("rows n/a (no workload ran)")
        elif self.rows_lost:
            parts.append(f"ROWS LOST: {self.rows_lost} of {self.expected_rows}")
        elif self.rows_extra:
            parts.append(f"ROWS STORED TWICE: {self.rows_extra} of {self.stored_rows}")
        elif self.rows_lost is not None:
            parts.append("0 rows lost")
        if self.problems:
            parts.append(f"INCONSISTENT ({len(self.problems)})")
        if self.known and self.bad:
            parts.append("known")
        return ", ".join(parts)


def render_table(outcomes: list[Outcome]) -> str:
    """A Markdown table, faults x backends, in the order of FAULTS and BACKENDS."""
    by = {(o.fault, o.backend): o for o in outcomes}
    lines = [
        "| fault | " + " | ".join(BACKENDS) + " |",
        "|---|" + "---|" * len(BACKENDS),
    ]
    for fault in FAULTS:
        cells = [by[(fault, b)].text() if (fault, b) in by else "-" for b in BACKENDS]
        lines.append(f"| {fault} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(outcomes: list[Outcome]) -> str:
    """Every leak and inconsistency, one per line (printed under the table)."""
    out = []
    for o in outcomes:
        for leak in o.leaks:
            out.append(f"{o.fault} / {o.backend}: leaked {leak}" + (" (known)" if o.known else ""))
        for p in o.problems:
            out.append(f"{o.fault} / {o.backend}: {p}" + (" (known)" if o.known else ""))
    return "\n".join(out)


def write_table(text: str, *paths: Path | str | None) -> list[Path]:
    """Write the table to each path given (and to $ACCELMATRIX_FAULT_TABLE when set)."""
    targets = [Path(p) for p in paths if p]
    if os.environ.get("ACCELMATRIX_FAULT_TABLE"):
        targets.append(Path(os.environ["ACCELMATRIX_FAULT_TABLE"]))
    for t in targets:
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(text + "\n")
    return targets


def processes_running(script: Path | str, *also: Path | str) -> list[psutil.Process]:
    """Live processes whose command line runs ``script`` (the suite's setup/run commands)
    and holds every one of ``also`` in an argument too: a test's own signals dir, so a
    census counts only its own workloads, not those of a test running beside it (`make
    reliability` runs the matrix's two parts on two stacks at once)."""
    found = []
    needle = str(script)
    wanted = {str(a) for a in also}
    for p in psutil.process_iter(["cmdline"]):
        try:
            argv = p.info["cmdline"] or []
            if (
                any(needle in a for a in argv)
                and all(any(w in a for a in argv) for w in wanted)
                and p.status() != "zombie"
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def leftover_dirs(root: Path, *parts: str) -> list[Path]:
    """Cell work dirs still under ``root/<parts...>`` (each cell owns one directory)."""
    base = root.joinpath(*parts)
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir())
