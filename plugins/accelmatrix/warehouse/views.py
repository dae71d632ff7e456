"""The Looker-Studio-ready views of include/sql/cell_nights.sql, created in the dataset.

The SQL lives in include/ (a file an analyst can read and run with ``bq``); ``{dataset}``
in it stands for PROJECT.DATASET. Statements are split on ``;`` at a line's end, and run as
one query job each, so an error names the view it is about.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from accelmatrix import settings

log = logging.getLogger("accelmatrix.warehouse")

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
    """Create (or replace) the views in the dataset ``dataset_id``; their names. A
    deployment whose include dir has no such file gets no views (a warning), and its
    export goes on: the tables are what the export promises."""
    path = path or settings.include_dir() / VIEW_FILE
    if not path.is_file():
        log.warning("warehouse views not created: %s is missing (copy include/%s)", path, VIEW_FILE)
        return []
    names = []
    for stmt in view_statements(dataset_id, path):
        client.query(stmt.rstrip(";")).result()
        names.append(stmt.split("`")[1].rsplit(".", 1)[1])
    return names
