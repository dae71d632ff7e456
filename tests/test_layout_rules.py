"""Rules of the code's layout that import contracts cannot state (pyproject.toml holds those).

The results store's private reader ``_reading()`` is used inside ``accelmatrix.results``
only: everything else (the UI, history, reports, the CLI, benches, DAGs) reads through the
store's public methods, which return the typed records of ``accelmatrix.contracts``. A query
built outside the store would tie its caller to the tables' layout and skip the store's
checks (ids, the schema at head). Tests may still read the tables directly.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "plugins" / "accelmatrix" / "results"
PRIVATE_READER = re.compile(r"\._reading\(")


def _uses(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE_READER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return hits


def test_private_reader_used_inside_the_results_store_only() -> None:
    shipped = [p for d in ("plugins", "bench", "dags") for p in sorted((ROOT / d).rglob("*.py"))]
    outside = [p for p in shipped if not p.is_relative_to(STORE)]
    assert len(outside) > 100, "the scan found no code to check"
    assert _uses(outside) == []
    # The pattern does find the reader where it belongs: the scan is not blind.
    assert len(_uses([p for p in shipped if p.is_relative_to(STORE)])) >= 10
