"""cell_specs: each planned cell's expanded spec, read by the cell's tasks.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ID_LEN = 250
CELL_ID_LEN = 1024


def upgrade() -> None:
    # A copy of a newer database stripped of its alembic_version already has the table.
    if sa.inspect(op.get_bind()).has_table("cell_specs"):
        return
    op.create_table(
        "cell_specs",
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("run_id", sa.String(ID_LEN), nullable=False),
        sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False),
        # JSON text, like every JSON column of the store.
        sa.Column("spec", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "cell_id", name="pk_cell_specs"),
    )


def downgrade() -> None:
    op.drop_table("cell_specs")
