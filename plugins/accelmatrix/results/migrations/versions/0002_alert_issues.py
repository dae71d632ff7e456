"""alerts.issues: the GitHub issue each alert opened, per sink, so it can be closed.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Skipped when present: 0001 adopts unversioned databases by adding every column the
    # schema.py of their day had, and a copy of a newer database stripped of its
    # alembic_version (as a restore script may leave it) already has this one.
    if "issues" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("alerts")}:
        return
    # JSON text ({"<conn_id>:<owner>/<repo>": number}), like every JSON column of the store.
    op.add_column("alerts", sa.Column("issues", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("issues")
