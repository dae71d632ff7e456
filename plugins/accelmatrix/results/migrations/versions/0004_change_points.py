"""change_points and change_groups: the perf history's change points and their causes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ID_LEN = 250
CELL_ID_LEN = 1024
NAME_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)
REAL = sa.Float(precision=53)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A copy of a newer database stripped of its alembic_version already has the tables.
    if not inspector.has_table("change_points"):
        op.create_table(
            "change_points",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
            sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False),
            sa.Column("metric", sa.String(NAME_LEN), nullable=False),
            sa.Column("benchmark", sa.String(NAME_LEN), nullable=True),
            sa.Column("machine", sa.String(LABEL_LEN), nullable=True),
            sa.Column("backend", sa.String(LABEL_LEN), nullable=True),
            sa.Column("run_id", sa.String(ID_LEN), nullable=False),
            sa.Column("logical_date", UTC_TS, nullable=False),
            sa.Column("runtime_version", sa.String(LABEL_LEN), nullable=True),
            sa.Column("prev_run_id", sa.String(ID_LEN), nullable=True),
            sa.Column("prev_logical_date", UTC_TS, nullable=True),
            sa.Column("prev_runtime_version", sa.String(LABEL_LEN), nullable=True),
            sa.Column("position", sa.Integer, nullable=False),
            sa.Column("n_before", sa.Integer, nullable=False),
            sa.Column("n_after", sa.Integer, nullable=False),
            *(
                sa.Column(name, REAL, nullable=True)
                for name in (
                    "mean_before",
                    "mean_after",
                    "median_before",
                    "median_after",
                    "std_before",
                    "std_after",
                    "change",
                    "effect",
                    "p_value",
                )
            ),
            sa.Column("direction", sa.String(LABEL_LEN), nullable=False),
            sa.Column("group_id", sa.Integer, nullable=True),
            sa.Column("state", sa.String(LABEL_LEN), nullable=False),
            sa.Column("state_by", sa.String(LABEL_LEN), nullable=True),
            sa.Column("state_at", UTC_TS, nullable=True),
            sa.Column("note", sa.Text, nullable=True),
            sa.Column("missing", sa.Integer, nullable=False),
            sa.Column("detected_at", UTC_TS, nullable=False),
            sa.Column("updated_at", UTC_TS, nullable=False),
            sa.UniqueConstraint(
                "dag_id", "cell_id", "metric", "logical_date", name="uq_change_points"
            ),
        )
        op.create_index("ix_change_points_group", "change_points", ["group_id"])
    if not inspector.has_table("change_groups"):
        op.create_table(
            "change_groups",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
            sa.Column("kind", sa.String(LABEL_LEN), nullable=False),
            sa.Column("direction", sa.String(LABEL_LEN), nullable=False),
            sa.Column("run_id", sa.String(ID_LEN), nullable=True),
            sa.Column("logical_date", UTC_TS, nullable=False),
            sa.Column("runtime_version", sa.String(LABEL_LEN), nullable=True),
            sa.Column("prev_logical_date", UTC_TS, nullable=True),
            sa.Column("prev_runtime_version", sa.String(LABEL_LEN), nullable=True),
            sa.Column("machine", sa.String(LABEL_LEN), nullable=True),
            sa.Column("summary", sa.Text, nullable=False),
            sa.Column("series_count", sa.Integer, nullable=False),
            # JSON text, like every JSON column of the store.
            sa.Column("cells", sa.Text, nullable=False),
            sa.Column("machines", sa.Text, nullable=False),
            sa.Column("metrics", sa.Text, nullable=False),
            sa.Column("change_median", REAL, nullable=True),
            sa.Column("change_min", REAL, nullable=True),
            sa.Column("change_max", REAL, nullable=True),
            sa.Column("state", sa.String(LABEL_LEN), nullable=False),
            sa.Column("state_by", sa.String(LABEL_LEN), nullable=True),
            sa.Column("state_at", UTC_TS, nullable=True),
            sa.Column("note", sa.Text, nullable=True),
            sa.Column("notified_at", UTC_TS, nullable=True),
            sa.Column("created_at", UTC_TS, nullable=False),
            sa.Column("updated_at", UTC_TS, nullable=False),
        )
        op.create_index("ix_change_groups_dag", "change_groups", ["dag_id", "logical_date"])


def downgrade() -> None:
    op.drop_table("change_groups")
    op.drop_table("change_points")
