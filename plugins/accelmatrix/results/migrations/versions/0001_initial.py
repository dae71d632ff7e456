"""The results schema as of c367b2a, and adoption of databases made before Alembic.

Revision ID: 0001
Revises:
Create Date: 2026-11-24

On an empty database this creates exactly the tables of ``accelmatrix.results.schema`` at
the time of writing (written out here, not imported: a revision must not change when the
live schema does; tests/test_results_migrations.py checks that head matches schema.py).

Databases made before Alembic (by ``create_all`` plus ``ALTER TABLE ... ADD COLUMN`` of
nullable columns) have some or all of these tables and no ``alembic_version``; upgrading
them runs this same revision, which creates the missing tables, adds missing nullable
columns and missing indexes, and refuses (naming every missing column) a table that lacks
a NOT NULL column: nothing sensible can be filled in for the rows it already holds.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID_LEN = 250
CELL_ID_LEN = 1024
NAME_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)
REAL = sa.Float(precision=53)


def _key(*, with_cell: bool) -> list[sa.Column]:
    cols = [
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("run_id", sa.String(ID_LEN), nullable=False),
    ]
    if with_cell:
        cols.append(sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False))
    return cols


def _runs() -> list:
    return [
        *_key(with_cell=False),
        sa.Column("suite", sa.String(LABEL_LEN), nullable=True),
        sa.Column("logical_date", UTC_TS, nullable=True),
        sa.Column("run_type", sa.String(LABEL_LEN), nullable=True),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("git_ref", sa.String(LABEL_LEN), nullable=True),
        sa.Column("runtime_version", sa.String(LABEL_LEN), nullable=True),
        sa.Column("state", sa.String(LABEL_LEN), nullable=True),
        sa.Column("started_at", UTC_TS, nullable=True),
        sa.Column("finished_at", UTC_TS, nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", name="pk_runs"),
    ]


def _cells() -> list:
    return [
        *_key(with_cell=True),
        sa.Column("cell_index", sa.Integer, nullable=True),
        sa.Column("axes", sa.Text, nullable=False),
        sa.Column("machine", sa.String(LABEL_LEN), nullable=True),
        sa.Column("backend", sa.String(LABEL_LEN), nullable=True),
        sa.Column("quarantined", sa.Boolean, nullable=False),
        sa.Column("excluded_reason", sa.Text, nullable=True),
        sa.Column("state", sa.String(LABEL_LEN), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("provision_started_at", UTC_TS, nullable=True),
        sa.Column("provisioned_at", UTC_TS, nullable=True),
        sa.Column("run_started_at", UTC_TS, nullable=True),
        sa.Column("run_ended_at", UTC_TS, nullable=True),
        sa.Column("teardown_at", UTC_TS, nullable=True),
        sa.Column("resource_held_seconds", REAL, nullable=True),
        sa.Column("workload_seconds", REAL, nullable=True),
        sa.Column("cost", REAL, nullable=True),
        sa.Column("data_docs", sa.Text, nullable=True),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "cell_id", name="pk_cells"),
    ]


def _metrics() -> list:
    return [
        *_key(with_cell=True),
        sa.Column("name", sa.String(NAME_LEN), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("value", REAL, nullable=True),
        sa.Column("unit", sa.String(LABEL_LEN), nullable=True),
        sa.Column("source", sa.String(LABEL_LEN), nullable=True),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "name", "step", name="pk_metrics"),
    ]


def _checks() -> list:
    return [
        *_key(with_cell=True),
        sa.Column("check_name", sa.String(NAME_LEN), nullable=False),
        sa.Column("check_type", sa.String(LABEL_LEN), nullable=False),
        sa.Column("passed", sa.Boolean, nullable=False),
        sa.Column("expected", sa.Text, nullable=True),
        sa.Column("observed", sa.Text, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("benchmark", sa.String(NAME_LEN), nullable=True),
        sa.Column("metric", sa.String(NAME_LEN), nullable=True),
        sa.Column("value", REAL, nullable=True),
        sa.Column("lower_bound", REAL, nullable=True),
        sa.Column("upper_bound", REAL, nullable=True),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "check_name", name="pk_checks"),
    ]


def _series_status() -> list:
    return [
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("benchmark", sa.String(NAME_LEN), nullable=False),
        sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False),
        sa.Column("metric", sa.String(NAME_LEN), nullable=False),
        sa.Column("status", sa.String(LABEL_LEN), nullable=False),
        sa.Column("points", sa.Integer, nullable=False),
        sa.Column("flips", sa.Integer, nullable=False),
        sa.Column("trailing", sa.Integer, nullable=False),
        sa.Column("longest_earlier", sa.Integer, nullable=False),
        sa.Column("last_value", REAL, nullable=True),
        sa.Column("last_logical_date", UTC_TS, nullable=True),
        sa.Column("window_days", sa.Integer, nullable=False),
        sa.Column("computed_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint(
            "dag_id", "benchmark", "cell_id", "metric", name="pk_series_status"
        ),
    ]


def _alerts() -> list:
    return [
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False),
        sa.Column("status", sa.String(LABEL_LEN), nullable=False),
        sa.Column("kind", sa.String(LABEL_LEN), nullable=False),
        sa.Column("recurrences", sa.Integer, nullable=False),
        sa.Column("opened_at", UTC_TS, nullable=False),
        sa.Column("last_seen_at", UTC_TS, nullable=False),
        sa.Column("resolved_at", UTC_TS, nullable=True),
        sa.Column("first_run_id", sa.String(ID_LEN), nullable=False),
        sa.Column("last_run_id", sa.String(ID_LEN), nullable=False),
        sa.Column("last_state", sa.String(LABEL_LEN), nullable=True),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "cell_id", name="pk_alerts"),
    ]


def _reaped() -> list:
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("backend", sa.String(LABEL_LEN), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("dag_id", sa.String(ID_LEN), nullable=True),
        sa.Column("run_id", sa.String(ID_LEN), nullable=True),
        sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("at", UTC_TS, nullable=False),
    ]


# Table name -> (its columns and constraints, its indexes as name -> columns), in the
# order they are created.
TABLES: dict[str, tuple[Callable[[], list], dict[str, list[str]]]] = {
    "runs": (_runs, {"ix_runs_suite_logical_date": ["suite", "logical_date"]}),
    "cells": (_cells, {}),
    "metrics": (_metrics, {"ix_metrics_dag_name": ["dag_id", "name"]}),
    "checks": (_checks, {"ix_checks_benchmark": ["benchmark"]}),
    "series_status": (_series_status, {}),
    "alerts": (_alerts, {}),
    "reaped": (_reaped, {"ix_reaped_at": ["at"]}),
}


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    problems = []
    for name, (columns, indexes) in TABLES.items():
        if not insp.has_table(name):
            op.create_table(name, *columns())
            for index, cols in indexes.items():
                op.create_index(index, name, cols)
            continue
        # A database from before Alembic: bring the table up to this revision.
        have = {c["name"] for c in insp.get_columns(name)}
        missing = [c for c in columns() if isinstance(c, sa.Column) and c.name not in have]
        if any(not c.nullable or c.primary_key for c in missing):
            problems.append(f"{name}: {', '.join(c.name for c in missing)}")
            continue
        for col in missing:
            op.add_column(name, col)
        have_ix = {i["name"] for i in insp.get_indexes(name)}
        for index, cols in indexes.items():
            if index not in have_ix:
                op.create_index(index, name, cols)
    if problems:
        raise RuntimeError(
            "the results database was created by an older accelmatrix and lacks columns ("
            + "; ".join(problems)
            + "): migrate it (ALTER TABLE ... ADD COLUMN) or point ACCELMATRIX_RESULTS_URL"
            " at a new database"
        )


def downgrade() -> None:
    for name in reversed(TABLES):
        op.drop_table(name)
