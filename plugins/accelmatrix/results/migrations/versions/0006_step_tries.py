"""step_tries: the newest try of each task that wrote a cell's row (results/fence.py).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ID_LEN = 250
CELL_ID_LEN = 1024


def upgrade() -> None:
    # A copy of a newer database stripped of its alembic_version already has the table.
    if sa.inspect(op.get_bind()).has_table("step_tries"):
        return
    op.create_table(
        "step_tries",
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("run_id", sa.String(ID_LEN), nullable=False),
        sa.Column("cell_id", sa.String(CELL_ID_LEN), nullable=False),
        sa.Column("task_id", sa.String(ID_LEN), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "cell_id", "task_id", name="pk_step_tries"),
    )


def downgrade() -> None:
    op.drop_table("step_tries")
