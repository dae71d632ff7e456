"""bounds: step-time bounds re-centered by accelmatrix (the bounds files stay as git has them).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

NAME_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)
REAL = sa.Float(precision=53)


def upgrade() -> None:
    # A copy of a newer database stripped of its alembic_version already has the table.
    if sa.inspect(op.get_bind()).has_table("bounds"):
        return
    op.create_table(
        "bounds",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("file", sa.String(NAME_LEN), nullable=False),
        sa.Column("benchmark", sa.String(NAME_LEN), nullable=False),
        sa.Column("step_time_lower_bound", REAL, nullable=True),
        sa.Column("step_time_upper_bound", REAL, nullable=True),
        sa.Column("average", REAL, nullable=True),
        sa.Column("confidence_interval", REAL, nullable=True),
        sa.Column("sample_size", sa.Integer, nullable=True),
        sa.Column("file_lower_bound", REAL, nullable=True),
        sa.Column("file_upper_bound", REAL, nullable=True),
        sa.Column("reason", sa.String(LABEL_LEN), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),  # JSON text, like every JSON column
        sa.Column("by", sa.String(LABEL_LEN), nullable=False),
        sa.Column("at", UTC_TS, nullable=False),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_index("ix_bounds_file_benchmark", "bounds", ["file", "benchmark", "id"])


def downgrade() -> None:
    op.drop_index("ix_bounds_file_benchmark", table_name="bounds")
    op.drop_table("bounds")
