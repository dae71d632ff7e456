"""confirmations, and the re-test verdict on change_points.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ID_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)
REAL = sa.Float(precision=53)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    columns = {c["name"] for c in inspector.get_columns("change_points")}
    with op.batch_alter_table("change_points") as batch:
        if "confirm_state" not in columns:
            batch.add_column(sa.Column("confirm_state", sa.String(LABEL_LEN), nullable=True))
        if "confirm" not in columns:
            batch.add_column(sa.Column("confirm", sa.Text, nullable=True))
    if inspector.has_table("confirmations"):
        return
    op.create_table(
        "confirmations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
        sa.Column("group_id", sa.Integer, nullable=False),
        sa.Column("state", sa.String(LABEL_LEN), nullable=False),
        # JSON text, like every JSON column of the store.
        sa.Column("targets", sa.Text, nullable=False),
        sa.Column("good_build", sa.String(LABEL_LEN), nullable=True),
        sa.Column("suspect_build", sa.String(LABEL_LEN), nullable=True),
        sa.Column("builds", sa.Text, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("run_id", sa.String(ID_LEN), nullable=True),
        sa.Column("run_ids", sa.Text, nullable=False),
        sa.Column("samples", sa.Text, nullable=False),
        sa.Column("decision", sa.Text, nullable=True),
        sa.Column("steps", sa.Text, nullable=False),
        sa.Column("culprit", sa.String(LABEL_LEN), nullable=True),
        sa.Column("last_good", sa.String(LABEL_LEN), nullable=True),
        sa.Column("cost", REAL, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.UniqueConstraint("dag_id", "group_id", name="uq_confirmations_group"),
    )


def downgrade() -> None:
    op.drop_table("confirmations")
    with op.batch_alter_table("change_points") as batch:
        batch.drop_column("confirm")
        batch.drop_column("confirm_state")
