"""the rivals (relaxed acceptance rules): their parameters on a run, what they read on a token event

A new status ("relaxed") and rule names ("relaxed", "not relaxed") fit the existing text columns;
the new columns are nullable, so older runs read as "not logged".

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("rule_params", sa.JSON(), nullable=True))
    with op.batch_alter_table("token_events") as t:
        t.add_column(sa.Column("target_rank", sa.Integer(), nullable=True))
        t.add_column(sa.Column("entropy", sa.Float(precision=53), nullable=True))
        t.add_column(sa.Column("top3_entropy", sa.Float(precision=53), nullable=True))
        t.add_column(sa.Column("matches_after", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("token_events") as t:
        for name in ("matches_after", "top3_entropy", "entropy", "target_rank"):
            t.drop_column(name)
    with op.batch_alter_table("runs") as t:
        t.drop_column("rule_params")
