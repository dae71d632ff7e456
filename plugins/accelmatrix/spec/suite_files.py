"""Which files are suites, and the DAG id of each: no model imported (the DAG file uses it)."""

from __future__ import annotations

from pathlib import Path

SUITE_SUFFIXES = (".yaml", ".yml")


def suite_id(path: Path | str) -> str:
    """The DAG id of a suite file: its name without the extension."""
    return Path(path).stem


def suite_files(root: Path | str) -> list[Path]:
    """Every suite file directly in ``root`` (``*.yaml`` and ``*.yml``), sorted.

    Both spellings are YAML: skipping one silently made a suite vanish with nothing said.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.suffix in SUITE_SUFFIXES and p.is_file())
