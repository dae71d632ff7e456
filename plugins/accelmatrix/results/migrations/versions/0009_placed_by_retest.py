"""change points placed by their re-test: the first bad build a bisect proved, with the
detector's own placement kept for audit.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ID_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)

COLUMNS = (
    ("placed_by", sa.String(LABEL_LEN)),
    ("detected_run_id", sa.String(ID_LEN)),
    ("detected_logical_date", UTC_TS),
    ("detected_runtime_version", sa.String(LABEL_LEN)),
)


def upgrade() -> None:
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("change_points")}
    with op.batch_alter_table("change_points") as batch:
        for name, type_ in COLUMNS:
            if name not in have:
                batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("change_points") as batch:
        for name, _type in reversed(COLUMNS):
            batch.drop_column(name)
