"""The event type shared by the engine, the store and the UI: one frozen ``TokenEvent`` per token decision,
``RunMetrics`` for a run; plain dataclasses of JSON-friendly values, so ``db/`` and ``ui/`` need no torch.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

# a progress callback for the engine's long steps: (message, fraction done in [0, 1])
Progress = Callable[[str, float], None]

# Status of a token decision.
ACCEPTED = "accepted"    # draft token equal to the target's choice (kept)
RESCUED = "rescued"      # draft token differed from the target's top-1 but CSD kept it
RELAXED = "relaxed"      # draft token differed from the target's top-1 but a relaxed rule kept it (lossy, topk, ...)
REJECTED = "rejected"    # draft token discarded (not part of the output)
CORRECTED = "corrected"  # the target's token emitted in place of a rejected draft token
BONUS = "bonus"          # the target's token after a fully kept block
TARGET = "target"        # a token of the target alone (autoregressive method)
STATUSES = (ACCEPTED, RESCUED, RELAXED, REJECTED, CORRECTED, BONUS, TARGET)
OUTPUT_STATUSES = frozenset({ACCEPTED, RESCUED, RELAXED, CORRECTED, BONUS, TARGET})  # those that enter the text
DIVERGENCE_STATUSES = frozenset({RESCUED, RELAXED, REJECTED})  # draft != target top-1
KEPT_DIVERGENCES = frozenset({RESCUED, RELAXED})  # kept although the target preferred another token

# Which rule decided a draft position (for the teach view and the what-if analysis).
RULE_MATCH = "match"               # x~ == t*
RULE_MEMORY_RARE = "memory<lambda"  # pattern count below lambda
RULE_GAP_LOW = "gap<log tau"        # gate refused
RULE_RESCUE = "rescue"              # memory and gate passed
RULE_SAMPLED = "sampled"            # rejection sampling accepted (temperature > 0)
RULE_NO_RESCUE = "no rescue"        # SD: no rescue mechanism
RULE_SPECIAL = "special token"      # x~ or t* is an end-of-turn / template token: never rescued, never counted
RULE_RELAXED = "relaxed"            # the run's relaxed rule (lossy, topk, typical, fly: csd.rule.Relax) kept x~
RULE_NOT_RELAXED = "not relaxed"    # the run's relaxed rule refused x~

# Why a run stopped.
STOP_EOS, STOP_MAX, STOP_CANCELLED = "eos", "max_new_tokens", "cancelled"


@dataclass(frozen=True)
class TokenEvent:
    position: int                 # index among the new tokens (for REJECTED: the index it would have had)
    token_id: int                 # the token this event is about
    text: str                     # its text in the output (for REJECTED: the draft token's text)
    status: str                   # one of STATUSES
    block: int                    # verify step (target pass) index, from 0
    index_in_block: int           # draft position within the block, from 0 (the block length for a bonus)
    draft_id: int | None = None   # x~: the draft's proposal at this position
    draft_text: str | None = None
    target_id: int | None = None  # t*: the target's top-1 at this position
    target_text: str | None = None
    draft_logit: float | None = None   # z(x~): target logit of the draft token
    target_logit: float | None = None  # z(t*): target logit of its top-1
    gap: float | None = None           # z(x~) - z(t*) (<= 0), compared with log tau
    memory_count: int | None = None    # count(x~ -> t*) at decision time, compared with lambda
    rule: str | None = None            # which rule decided (RULE_*)
    draft_prob: float | None = None    # q(x~) under the draft (at the run's temperature, or greedy softmax)
    target_prob: float | None = None   # p(x~) under the target
    draft_top: list | None = None      # explain mode: [[token text, prob], ...] of the draft
    target_top: list | None = None     # explain mode: [[token text, prob], ...] of the target
    block_len: int | None = None       # draft tokens proposed in this event's block (the gamma used there)
    pass_end: bool = False             # the last event of its target pass: a viewer can draw the pass now
    discarded: list | None = None      # REJECTED only: the block's later draft token ids, thrown away unverified
    special: bool = False              # the token is a special token (end of turn, chat template)
    source: str | None = None          # "lookup": proposed by copying from the context (csd.lookup), not by the draft
    # what the relaxed rules read (csd.rule.Relax), logged so that the what-if can replay any rule on an answer;
    # None where the run did not compute it (each rule computes what it needs; CSDConfig.score_all: all of them)
    target_rank: int | None = None     # tokens the target scores strictly above x~ (0: x~ ties the top-1)
    entropy: float | None = None       # the target row's entropy -sum p log(p + 1e-5), nats, T = 1 (typical)
    top3_entropy: float | None = None  # -sum over the target's top 3 of p log p, T = 1 (FLy's gate)
    matches_after: int | None = None   # the block's draft tokens right after this one that equal the target's top-1

    @property
    def in_output(self) -> bool:
        return self.status in OUTPUT_STATUSES

    @property
    def is_divergence(self) -> bool:
        return self.status in DIVERGENCE_STATUSES

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TokenEvent:
        names = _FIELD_NAMES[cls]
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RunMetrics:
    """What a run measured, filled in as it goes (``Run.metrics_snapshot()`` copies it)."""
    new_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0                 # draft tokens proposed
    accepted: int = 0                # draft tokens kept by exact match / rejection sampling
    rescued: int = 0                 # draft tokens kept by CSD although they diverged
    # draft tokens kept by a relaxed rule (lossy, topk, typical, fly) although they diverged
    relaxed: int = 0
    divergences: int = 0             # decided draft positions where x~ != t* (rescued + relaxed + rejected)
    wall_s: float = 0.0
    prefill_s: float = 0.0           # reading the prompt: the target before the first block, the draft when it drafts
    prompt_rows_copied: int = 0      # prompt tokens whose target rows another run read (csd.runtime.prompt_rows)
    draft_s: float = 0.0             # time in the draft's forward passes
    verify_s: float = 0.0            # time in the target's forward passes
    bookkeeping_s: float = 0.0       # time spent in memory lookups, the gate and memory updates
    transfer_s: float = 0.0          # time in each block's one host transfer (on a GPU: waiting for its passes)
    policy_s: float = 0.0            # time spent choosing block lengths (gamma auto)
    host_syncs: int = 0              # device-to-host transfers (greedy, fixed gamma: one per block)
    per_position_drafted: list = field(default_factory=list)   # per draft position: times it was decided
    per_position_kept: list = field(default_factory=list)      # per draft position: times it was kept
    lookup_blocks: int = 0           # target passes that verified tokens copied from the context (csd.lookup)
    lookup_drafted: int = 0          # tokens proposed that way (not in ``drafted``)
    lookup_kept: int = 0             # of those, kept (not in ``accepted``)
    stopped_by: str = ""             # "eos", "max_new_tokens" or "cancelled"

    def keep(self, status: str) -> None:
        """Count one kept draft token by its status (accepted, rescued or relaxed)."""
        if status == RESCUED:
            self.rescued += 1
        elif status == RELAXED:
            self.relaxed += 1
        else:
            self.accepted += 1

    def lap(self, name: str) -> Lap:
        """``with metrics.lap("draft_s") as lap:`` adds the block's seconds to that metric."""
        return Lap(self, name)

    def proposed(self, size: int, divergences: int, copied: bool) -> None:
        """Count a decided block's proposals and divergences (a copied block's apart: they are never counted)."""
        if copied:
            self.lookup_blocks += 1
            self.lookup_drafted += size
        else:
            self.drafted += size
            self.divergences += divergences

    def position(self, i: int, status: str, copied: bool) -> None:
        """Count draft position ``i``'s decision (a copy's only when kept) and, kept, its token."""
        if not copied:
            self.per_position_drafted[i] += 1
        if status != REJECTED:
            self.new_tokens += 1
            if copied:
                self.lookup_kept += 1
            else:
                self.per_position_kept[i] += 1
                self.keep(status)

    # derived: kept (accepted + rescued + relaxed) over proposed draft tokens, each way's share of them, tokens
    # per target pass (vLLM's mean acceptance length), draft tokens per target pass (the gamma actually used)
    acceptance_rate = property(lambda m: _share(m.accepted + m.rescued + m.relaxed, m.drafted))
    accepted_share = property(lambda m: _share(m.accepted, m.drafted))
    rescued_share = property(lambda m: _share(m.rescued, m.drafted))
    relaxed_share = property(lambda m: _share(m.relaxed, m.drafted))
    mean_accepted_length = property(lambda m: _share(m.new_tokens, m.target_forwards))
    mean_block_len = property(lambda m: _share(m.drafted, m.target_forwards))
    tokens_per_s = property(lambda m: _share(m.new_tokens, m.wall_s))
    per_position_acceptance = property(lambda m: [_share(k, d) for k, d in zip(m.per_position_kept,
                                                                              m.per_position_drafted)])
    bookkeeping_share = property(lambda m: _share(m.bookkeeping_s, m.wall_s))
    policy_share = property(lambda m: _share(m.policy_s, m.wall_s))
    DERIVED = ("acceptance_rate", "accepted_share", "rescued_share", "relaxed_share", "mean_accepted_length",
               "mean_block_len", "tokens_per_s", "per_position_acceptance", "bookkeeping_share", "policy_share")

    def to_dict(self) -> dict:
        return {**asdict(self), **{k: getattr(self, k) for k in self.DERIVED}}

    @classmethod
    def from_dict(cls, d: dict) -> RunMetrics:
        names = _FIELD_NAMES[cls]
        return cls(**{k: v for k, v in d.items() if k in names})


class Lap:
    """Times a ``with`` block into one of ``RunMetrics``' seconds (unless it raises); ``s`` keeps them."""

    def __init__(self, metrics: RunMetrics, name: str):
        self.metrics, self.name, self.s = metrics, name, 0.0

    def __enter__(self) -> Lap:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.s = time.perf_counter() - self.t0
            setattr(self.metrics, self.name, getattr(self.metrics, self.name) + self.s)


def _share(n: float, d: float) -> float:
    return n / d if d > 0 else 0.0


_FIELD_NAMES = {cls: frozenset(f.name for f in fields(cls)) for cls in (TokenEvent, RunMetrics)}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens two answers share from their start (where they first differ)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
