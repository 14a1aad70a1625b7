"""runs: the correction memory's policy a run decoded with ("unbounded", "capacity 1000", "half-life 500", ...;
NULL: older runs, and runs that read no memory)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""
from alembic import op
import sqlalchemy as sa

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("memory_policy", sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.drop_column("memory_policy")
