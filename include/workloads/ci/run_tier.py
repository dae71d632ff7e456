#!/usr/bin/env python
"""One tier of the tiered_ci suite on a checked-out project: lint and/or tests to JUnit XML.

Why a script and not just ``pytest`` as the workload: a tier runs several tools, and their
results must come out as files the suite evaluates (JUnit XML for the test results and the
lint findings, ``timing.json`` for the elapsed time), never as a word grepped from the log.

Exit status: 0 when every tool ran and reported, whatever it found (failing tests and lint
findings are judged from the JUnit files by the suite's ``junit`` checks, which name them);
2 when a tool could not do its job (pytest interrupted, internal or usage error, no tests
collected, ruff crashed, a JUnit file missing), because then there is nothing to judge.

Tiers:
  cpu        ruff check + the tests not marked ``accelerator``   (per change)
  nightly    every test, accelerator ones included                (cron, accelerator machine)
  on-demand  same as nightly                                      (from the UI)

Standalone (no accelmatrix import): it runs wherever the workload runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TIERS = ("cpu", "nightly", "on-demand")
PYTEST_OK = (0, 1)  # all passed / some failed: both produced a complete report
RUFF_OK = (0, 1)  # clean / findings


def run(argv: list[str], cwd: Path) -> tuple[int, float]:
    """Run one tool, streaming its output into the workload log; (exit code, seconds)."""
    print(f"$ {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(argv, cwd=cwd, check=False).returncode  # noqa: S603 - argv, no shell
    return code, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", choices=TIERS, required=True)
    ap.add_argument("--src", type=Path, required=True, help="the checked-out project")
    ap.add_argument("--out", type=Path, required=True, help="where JUnit XML and timing go")
    args = ap.parse_args(argv)
    src, out = args.src.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    timing: dict[str, float | str] = {"tier": args.tier}
    started = time.perf_counter()

    if args.tier == "cpu":
        lint_xml = out / "junit-lint.xml"
        code, timing["ruff_seconds"] = run(
            [
                sys.executable,
                "-m",
                "ruff",
                "check",
                "--no-cache",
                "--output-format",
                "junit",
                "--output-file",
                str(lint_xml),
                ".",
            ],
            src,
        )
        if code not in RUFF_OK or not lint_xml.is_file():
            problems.append(f"ruff exited with {code} without a complete report")
        else:  # ruff names files by absolute path: make failure names read like pytest's
            lint_xml.write_text(lint_xml.read_text().replace(f"{src}/", ""))

    tests_xml = out / "junit-tests.xml"
    selection = ["-m", "not accelerator"] if args.tier == "cpu" else []
    code, timing["pytest_seconds"] = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *selection,
            f"--junitxml={tests_xml}",
        ],
        src,
    )
    if code not in PYTEST_OK or not tests_xml.is_file():
        problems.append(f"pytest exited with {code} without a complete report")

    timing["elapsed_seconds"] = time.perf_counter() - started
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    for p in problems:
        print(f"run_tier: {p}", file=sys.stderr, flush=True)
    print(f"run_tier: tier {args.tier} done in {timing['elapsed_seconds']:.2f} s", flush=True)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
