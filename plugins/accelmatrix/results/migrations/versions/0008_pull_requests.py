"""pull requests: GitHub deliveries acted on, and the runs started for pull requests.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID_LEN = 250
NAME_LEN = 250
LABEL_LEN = 250
UTC_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A copy of a newer database stripped of its alembic_version already has the tables.
    if not inspector.has_table("github_deliveries"):
        op.create_table(
            "github_deliveries",
            sa.Column("delivery_id", sa.String(ID_LEN), primary_key=True),
            sa.Column("event", sa.String(LABEL_LEN), nullable=False),
            sa.Column("at", UTC_TS, nullable=False),
        )
    if not inspector.has_table("pull_request_runs"):
        op.create_table(
            "pull_request_runs",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("dag_id", sa.String(ID_LEN), nullable=False),
            sa.Column("run_id", sa.String(ID_LEN), nullable=False),
            sa.Column("kind", sa.String(LABEL_LEN), nullable=False),
            sa.Column("repo", sa.String(NAME_LEN), nullable=False),
            sa.Column("number", sa.Integer, nullable=False),
            sa.Column("head_sha", sa.String(LABEL_LEN), nullable=False),
            sa.Column("base_ref", sa.String(NAME_LEN), nullable=False),
            sa.Column("base_sha", sa.String(LABEL_LEN), nullable=False),
            sa.Column("sender", sa.String(NAME_LEN), nullable=False),
            sa.Column("fork", sa.Boolean, nullable=False),
            sa.Column("comment_id", sa.BigInteger, nullable=True),
            sa.Column("created_at", UTC_TS, nullable=False),
            sa.UniqueConstraint("dag_id", "run_id", name="uq_pull_request_runs_run"),
        )
        op.create_index(
            "ix_pull_request_runs_pr", "pull_request_runs", ["dag_id", "repo", "number", "id"]
        )


def downgrade() -> None:
    op.drop_index("ix_pull_request_runs_pr", table_name="pull_request_runs")
    op.drop_table("pull_request_runs")
    op.drop_table("github_deliveries")
