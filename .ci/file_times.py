"""Per-file wall time of a test run, from pytest's JUnit XML, as a Markdown table.

    pytest ... --junitxml=junit.xml && python .ci/file_times.py junit.xml [before.xml]

A file's time is the sum of its tests' setup, call and teardown (pytest's JUnit "time");
under `--dist loadfile` one worker runs a whole file, so that is the file's wall time on
its worker. With a second file, the table has a column per run ("before", "after").
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def per_file(path: str) -> tuple[Counter, Counter, Counter]:
    seconds: Counter = Counter()
    tests: Counter = Counter()
    bad: Counter = Counter()
    for case in ET.parse(path).iter("testcase"):  # noqa: S314 - our own pytest's output
        name = case.get("classname", "").split(".")
        # classname is the module path (tests.test_x) plus a class, if any.
        while name and not name[-1].startswith("test_"):
            name.pop()
        f = "/".join(name) + ".py"
        seconds[f] += float(case.get("time") or 0)
        tests[f] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            bad[f] += 1
    return seconds, tests, bad


def main(paths: list[str]) -> None:
    runs = [per_file(p) for p in paths]
    files = sorted(set().union(*(r[0] for r in runs)), key=lambda f: -runs[-1][0].get(f, 0))
    head = ["file"] + [
        f"tests, s ({'before' if i == 0 and len(runs) > 1 else 'after'})"
        if len(runs) > 1
        else "tests, s"
        for i in range(len(runs))
    ]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for f in files:
        cells = []
        for seconds, tests, bad in runs:
            if f not in tests:
                cells.append("-")
            else:
                fail = f" ({bad[f]} failed)" if bad[f] else ""
                cells.append(f"{tests[f]}, {seconds[f]:.0f}{fail}")
        print(f"| {f} | " + " | ".join(cells) + " |")
    totals = [f"{sum(r[1].values())}, {sum(r[0].values()):.0f}" for r in runs]
    print("| **all files (test time summed)** | " + " | ".join(totals) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
