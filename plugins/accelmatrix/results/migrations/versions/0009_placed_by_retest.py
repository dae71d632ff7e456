"""change points placed by their re-test: the first bad build a bisect proved, with the
detector's own placement kept for audit; and ids that SQLite never hands out twice.

SQLite reuses the largest deleted rowid of a table without AUTOINCREMENT: a retracted change
point's or an emptied group's id went to the next change, which then inherited the old
one's re-test (keyed by group id, naming its targets by change point id). The three tables
are rebuilt with AUTOINCREMENT on SQLite; other databases never reuse a sequence's ids.

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


NEVER_REUSED = ("change_points", "change_groups", "confirmations")


def upgrade() -> None:
    bind = op.get_bind()
    have = {c["name"] for c in sa.inspect(bind).get_columns("change_points")}
    with op.batch_alter_table("change_points") as batch:
        for name, type_ in COLUMNS:
            if name not in have:
                batch.add_column(sa.Column(name, type_, nullable=True))
    if bind.dialect.name == "sqlite":
        for table in NEVER_REUSED:
            sql = bind.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"),
                {"t": table},
            ).scalar()
            if sql and "AUTOINCREMENT" not in sql.upper():
                with op.batch_alter_table(
                    table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
                ):
                    pass


def downgrade() -> None:
    with op.batch_alter_table("change_points") as batch:
        for name, _type in reversed(COLUMNS):
            batch.drop_column(name)
