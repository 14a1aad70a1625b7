"""runs: the copy length from the context (csd.lookup) a run was decoded with (0: none; NULL: older runs)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("lookup", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.drop_column("lookup")
