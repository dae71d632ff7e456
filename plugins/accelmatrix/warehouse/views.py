"""The Looker-Studio-ready views of include/sql/cell_nights.sql, created in the dataset.

The SQL lives in include/ (a file an analyst can read and run with ``bq``); ``{dataset}``
in it stands for PROJECT.DATASET. Statements are split on ``;`` at a line's end, and run one
query job each (a view is DDL: BigQuery runs one CREATE VIEW per statement just as well in a
script, the emulator more reliably one at a time).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix import settings

if TYPE_CHECKING:  # pragma: no cover
    from google.cloud import bigquery

__all__ = ["VIEW_FILE", "create_views", "view_statements"]

VIEW_FILE = "sql/cell_nights.sql"


def view_statements(dataset_id: str, path: Path | None = None) -> list[str]:
    """The file's statements with ``{dataset}`` replaced, comments dropped."""
    text = (path or settings.include_dir() / VIEW_FILE).read_text()
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [
        s.strip().replace("{dataset}", dataset_id)
        for s in body.split(";\n")
        if s.strip().rstrip(";")
    ]


def create_views(client: bigquery.Client, dataset_id: str, path: Path | None = None) -> list[str]:
    """Create (or replace) the views in the dataset ``dataset_id``; their names."""
    names = []
    for stmt in view_statements(dataset_id, path):
        client.query(stmt.rstrip(";")).result()
        names.append(stmt.split("`")[1].rsplit(".", 1)[1])
    return names
