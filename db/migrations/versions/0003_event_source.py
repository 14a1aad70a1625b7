"""token events: source of a proposal ("lookup" when copied from the context, else the draft)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("token_events") as t:
        t.add_column(sa.Column("source", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("token_events") as t:
        t.drop_column("source")
