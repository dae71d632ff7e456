"""The setup and run commands of the fault-injection suite (tests/test_fault_matrix.py).

Standard library only: it runs as a local process, over SSH on the loopback sshd (also "the
TPU VM") and as a fake-kubelet pod, with the same argv::

    fault_workload.py setup|run FAULT SIGNALS_DIR [SECONDS]

FAULT is the cell's ``fault`` axis value. The script writes ``SIGNALS_DIR/<machine>-<fault>.
<phase>`` when it starts (the test watches these to inject a fault at the right moment: kill
the setup task, preempt the TPU node, mark the DAG run failed) and then:

* setup: ``setup`` exits 2 (a setup failure); ``kill`` sleeps (the test SIGKILLs the task
  process meanwhile) on its first attempt and returns at once on the retry; else exit 0.
* run: ``workload`` exits 3 (a test failure); ``timeout`` sleeps past the suite's timeout;
  ``preempt`` runs for SECONDS printing steps, ``slow`` until SIGNALS_DIR/release exists (at
  most SECONDS); ``diskfull`` leaves a 1 MiB artifact (out/big.bin) after a short run;
  else a short successful run.

Every metric line the run prints (``step N loss: X``) is counted in ``SIGNALS_DIR/<machine>-
<fault>.steps`` (rewritten after each line, by the latest attempt): the test compares it with
the metric rows the results store holds for the cell (the table's "rows lost").
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

FINISHED = "Finished training run"
# How long the run of these faults lasts unless SECONDS is given: long enough to be hit mid-run.
# `slow` runs until the test creates SIGNALS_DIR/release (at most SECONDS).
SECONDS = {"preempt": 10.0, "slow": 140.0}


def main(argv: list[str]) -> int:
    phase, fault, signals = argv[0], argv[1], Path(argv[2])
    seconds = float(argv[3]) if len(argv) > 3 else SECONDS.get(fault, 0.0)
    machine = os.environ.get("ACCELMATRIX_AXIS_MACHINE", "unknown")
    signals.mkdir(parents=True, exist_ok=True)
    marker = signals / f"{machine}-{fault}.{phase}"
    first = not marker.exists()
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\n")
    say = lambda text: print(text, flush=True)  # noqa: E731
    counted = signals / f"{machine}-{fault}.steps"

    def step(i: int, loss: float) -> None:
        say(f"step {i} loss: {loss:.3f}")
        if phase == "run":
            counted.write_text(f"{i}\n")

    if phase == "setup":
        if fault == "setup":
            say("setup: injected failure: dependency 'libfault' not found")
            return 2
        if fault == "kill" and first:
            say("setup: slow step started (the test kills the task process now)")
            time.sleep(300)
            return 0
        say("setup ok" + ("" if first else " (a retry)"))
        return 0
    if fault == "workload":
        step(1, 0.5)
        say("workload: injected failure: loss became NaN")
        return 3
    if fault == "timeout":
        step(1, 0.5)
        time.sleep(600)
        return 0
    if fault == "diskfull":
        out = Path("out")
        out.mkdir(exist_ok=True)
        (out / "big.bin").write_bytes(os.urandom(1 << 20))
    steps = max(1, int(seconds))
    for i in range(steps):
        step(i + 1, 1.0 / (i + 2))
        if fault == "slow" and (signals / "release").exists():
            break
        if seconds:
            time.sleep(seconds / steps)
    say(FINISHED)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
