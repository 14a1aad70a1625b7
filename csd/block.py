"""The decode loop's record of one verify pass (Calibrated Speculative Decoding, arXiv 2604.13634): what
was proposed and by whom, what the target computed over it, and the rule's decision; the loop fills it
step by step and the policies learn from it (``csd.policy.Policy.observe``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .events import REJECTED

if TYPE_CHECKING:
    import torch

    from .rule import BlockScores, Decision

DRAFT = "draft"      # proposed by the draft model
LOOKUP = "lookup"    # copied from the context (csd.lookup): verified exactly, never rescued, never counted


@dataclass
class Block:
    index: int                                   # target pass number in the run, from 0
    source: str = DRAFT                          # DRAFT or LOOKUP
    proposed: list[int] | torch.Tensor = field(default_factory=list)  # x~_1..x~_g (a device tensor until scored)
    confidences: list[float] = field(default_factory=list)  # the draft's top-1 probability of each, where read
    q_rows: list[torch.Tensor] = field(default_factory=list)  # the draft's distribution at each (sampling)
    draft_logits: list[torch.Tensor] = field(default_factory=list)  # the draft's logits at each (explain)
    logits: torch.Tensor | None = None           # (g + 1, V) the target's, from the verify pass
    scores: BlockScores | None = None            # greedy: t*, z(t*), z(x~) and normalisers, on the host
    probs: torch.Tensor | None = None            # the target's probabilities (sampling, explain)
    decision: Decision | None = None
    start: int = 0                               # sequence length before the block
    draft_s: float | None = None                 # seconds of the draft's 1-token steps in this block (None: not timed)
    draft_steps: int = 0                         # the steps draft_s holds (a step that also read a lag is not one)
    verify_s: float | None = None                # seconds of the verify pass (None: not timed, e.g. on a GPU)
    wall_s: float | None = None                  # seconds from proposing to the decision, host and transfer included
    catch_up_s: float = 0.0                      # seconds the draft read what it lacked: the prompt, copied tokens
    pass_tokens: int = 0                         # tokens in the verify pass (the block, its bonus row, catch-up)

    @property
    def size(self) -> int:
        return len(self.proposed)

    @property
    def copied(self) -> bool:
        return self.source == LOOKUP

    @property
    def divergences(self) -> int:
        """Decided positions where x~ != t*, special tokens included (the memory counts only the others)."""
        d = self.decision
        return len(d.observed) + sum(1 for v in d.verdicts if v.count is None and v.x_tilde != v.t_star)

    @property
    def kept(self) -> list[bool]:
        """Per decided position (up to the first rejection): kept (accepted or rescued) or not."""
        return [v.status != REJECTED for v in self.decision.verdicts] if self.decision else []

    @property
    def n_kept(self) -> int:
        return self.decision.n_kept if self.decision else 0
