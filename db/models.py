"""Schema of the divergence-event store: runs, their token events (one ``TokenEventRow`` per
``csd.events.TokenEvent``), memory snapshots. A change here needs a new Alembic revision."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"     # RunRow.status values

# A 64-bit key everywhere but SQLite, where only INTEGER PRIMARY KEY is the autoincrementing rowid.
BigId = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict: JSON, float: Float(53)}


class RunRow(Base):
    """One stored run (a generation, a calibration, a benchmark item); ``csd.decode.Run`` is the live one."""
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    kind: Mapped[str] = mapped_column(String(32), default="generate")  # generate | calibrate | bench | ...
    pair_id: Mapped[str] = mapped_column(String(200), default="")      # the model pair (memory key)
    draft_name: Mapped[str | None] = mapped_column(String(200))
    target_name: Mapped[str | None] = mapped_column(String(200))
    method: Mapped[str | None] = mapped_column(String(32))             # csd.config.METHODS (a bench column's name)
    gamma: Mapped[int | None]
    lam: Mapped[float | None]
    tau: Mapped[float | None]
    temperature: Mapped[float | None]
    seed: Mapped[int | None] = mapped_column(BigInteger)
    max_new_tokens: Mapped[int | None]
    lookup: Mapped[int | None]                                         # copies from the context: up to N, 0 none
    rule_params: Mapped[dict | None]                                   # a rival's parameters (lossy, topk, ...)
    prompt: Mapped[str] = mapped_column(Text, default="")
    output_text: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict | None]                                       # RunMetrics.to_dict()
    status: Mapped[str] = mapped_column(String(16), default=RUNNING)
    error: Mapped[str | None] = mapped_column(Text)
    session_id: Mapped[str | None] = mapped_column(String(64), index=True)  # browser/user session tag
    label: Mapped[str] = mapped_column(String(200), default="")
    representation: Mapped[str | None] = mapped_column(String(32))   # the target's: "int8, activations per token", ...
    draft_weights: Mapped[str | None] = mapped_column(String(32))    # int8, int4, bfloat16, ...
    # csd.memory.MemoryPolicy.label; NULL: not recorded
    memory_policy: Mapped[str | None] = mapped_column(String(80))


class TokenEventRow(Base):
    __tablename__ = "token_events"
    __table_args__ = (
        UniqueConstraint("run_id", "seq", name="uq_token_events_run_seq"),  # also the run_id index
        # run_id + status, covering the what-if columns: csd.db.analytics reads them from the index alone
        Index("ix_token_events_run_status", "run_id", "status", "draft_id", "target_id", "memory_count", "gap"),
        Index("ix_token_events_pattern", "draft_id", "target_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int]                      # order of the event within its run, from 0
    position: Mapped[int]
    token_id: Mapped[int]
    text: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    block: Mapped[int]
    index_in_block: Mapped[int]
    draft_id: Mapped[int | None]
    draft_text: Mapped[str | None] = mapped_column(Text)
    target_id: Mapped[int | None]
    target_text: Mapped[str | None] = mapped_column(Text)
    draft_logit: Mapped[float | None]
    target_logit: Mapped[float | None]
    gap: Mapped[float | None]
    memory_count: Mapped[int | None]
    rule: Mapped[str | None] = mapped_column(String(32))
    draft_prob: Mapped[float | None]
    target_prob: Mapped[float | None]
    explain: Mapped[dict | None]          # {"draft_top": [[text, prob], ...], "target_top": [...]} in teach mode
    context: Mapped[str] = mapped_column(Text, default="")  # ~40 characters of output text before the token
    block_len: Mapped[int | None]         # draft tokens proposed in the event's block
    pass_end: Mapped[bool] = mapped_column(default=False, server_default=false())   # last event of its target pass
    discarded: Mapped[list | None] = mapped_column(JSON)   # REJECTED: the block's later draft ids, never verified
    special: Mapped[bool] = mapped_column(default=False, server_default=false())    # a special token
    source: Mapped[str | None] = mapped_column(String(16))   # "lookup": copied from the context (csd.lookup)
    # what the relaxed rules read, for the what-if (csd.events.TokenEvent; NULL where not computed, and in older runs)
    target_rank: Mapped[int | None]
    entropy: Mapped[float | None]
    top3_entropy: Mapped[float | None]
    matches_after: Mapped[int | None]


class MemorySnapshot(Base):
    __tablename__ = "memory_snapshots"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    pair_id: Mapped[str] = mapped_column(String(200), index=True)
    label: Mapped[str] = mapped_column(String(200), default="")
    n_patterns: Mapped[int]
    total: Mapped[int]
    counts: Mapped[dict]                  # CorrectionMemory.to_dict()
