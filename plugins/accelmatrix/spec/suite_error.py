"""SuiteError, in a module of its own: the DAG file catches it without importing the spec."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class SuiteError(ValueError):
    """A suite file cannot be used. ``problems`` holds one line per problem."""

    def __init__(self, path: Path | str, problems: Iterable[str]):
        self.path = str(path)
        self.problems = list(problems)
        super().__init__(
            f"{self.path}: invalid suite\n" + "\n".join(f"  - {p}" for p in self.problems)
        )
