"""runs: the representation columns renamed as the engine's one record names them (``csd.representation``):
the target's (with an int8 target's activation scales) ``representation``, the draft's ``draft_weights``

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
OLD = ("target_repr", "draft_repr")      # the names revision 0002 gave them
NEW = ("representation", "draft_weights")


def upgrade() -> None:
    with op.batch_alter_table("runs") as t:
        for old, new in zip(OLD, NEW):
            t.alter_column(old, new_column_name=new)


def downgrade() -> None:
    with op.batch_alter_table("runs") as t:
        for old, new in zip(OLD, NEW):
            t.alter_column(new, new_column_name=old)
