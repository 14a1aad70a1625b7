"""token events: block length, end of pass, discarded drafts, special tokens; runs: representations

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("token_events") as t:
        t.add_column(sa.Column("block_len", sa.Integer(), nullable=True))
        t.add_column(sa.Column("pass_end", sa.Boolean(), nullable=False, server_default=sa.false()))
        t.add_column(sa.Column("discarded", sa.JSON(), nullable=True))
        t.add_column(sa.Column("special", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("target_repr", sa.String(32), nullable=True))
        t.add_column(sa.Column("draft_repr", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.drop_column("draft_repr")
        t.drop_column("target_repr")
    with op.batch_alter_table("token_events") as t:
        t.drop_column("special")
        t.drop_column("discarded")
        t.drop_column("pass_end")
        t.drop_column("block_len")
