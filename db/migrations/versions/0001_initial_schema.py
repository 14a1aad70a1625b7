"""initial schema: runs, token_events, memory_snapshots

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from alembic import op
import sqlalchemy as sa

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Float = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("pair_id", sa.String(200), nullable=False),
        sa.Column("draft_name", sa.String(200), nullable=True),
        sa.Column("target_name", sa.String(200), nullable=True),
        sa.Column("method", sa.String(32), nullable=True),
        sa.Column("gamma", sa.Integer(), nullable=True),
        sa.Column("lam", Float, nullable=True),
        sa.Column("tau", Float, nullable=True),
        sa.Column("temperature", Float, nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("max_new_tokens", sa.Integer(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("label", sa.String(200), nullable=False),
    )
    op.create_index("ix_runs_session_id", "runs", ["session_id"])

    op.create_table(
        "memory_snapshots",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pair_id", sa.String(200), nullable=False),
        sa.Column("label", sa.String(200), nullable=False),
        sa.Column("n_patterns", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
    )
    op.create_index("ix_memory_snapshots_pair_id", "memory_snapshots", ["pair_id"])
    op.create_index("ix_memory_snapshots_run_id", "memory_snapshots", ["run_id"])

    op.create_table(
        "token_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("index_in_block", sa.Integer(), nullable=False),
        sa.Column("draft_id", sa.Integer(), nullable=True),
        sa.Column("draft_text", sa.Text(), nullable=True),
        sa.Column("target_id", sa.Integer(), nullable=True),
        sa.Column("target_text", sa.Text(), nullable=True),
        sa.Column("draft_logit", Float, nullable=True),
        sa.Column("target_logit", Float, nullable=True),
        sa.Column("gap", Float, nullable=True),
        sa.Column("memory_count", sa.Integer(), nullable=True),
        sa.Column("rule", sa.String(32), nullable=True),
        sa.Column("draft_prob", Float, nullable=True),
        sa.Column("target_prob", Float, nullable=True),
        sa.Column("explain", sa.JSON(), nullable=True),
        sa.Column("context", sa.Text(), nullable=False),
        sa.UniqueConstraint("run_id", "seq", name="uq_token_events_run_seq"),
    )
    op.create_index("ix_token_events_run_status", "token_events",
                    ["run_id", "status", "draft_id", "target_id", "memory_count", "gap"])
    op.create_index("ix_token_events_pattern", "token_events", ["draft_id", "target_id"])


def downgrade() -> None:
    op.drop_table("token_events")
    op.drop_table("memory_snapshots")
    op.drop_table("runs")
