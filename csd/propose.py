"""Step 1 of the decode loop (Calibrated Speculative Decoding, arXiv 2604.13634): who proposes a block's
tokens. Every proposer answers ``propose(block, seq, room)``: it fills ``block`` with at most ``room``
tokens and says whether it proposed (a copy that does not pay leaves the block to the draft). The draft
proposes on the host (``HostDraft``: greedy, or sampled at the run's temperature; it reads the confidences
a policy or the explain view needs) or on the device (``DeviceDraft``: greedy, no host sync);
``LookupCopy`` copies from the context (``csd.lookup``). AR has no proposer: its blocks are empty.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from .block import LOOKUP

if TYPE_CHECKING:
    from .block import Block
    from .events import RunMetrics
    from .lookup import Lookup
    from .policy import Policy
    from .protocols import Model


class Proposer(Protocol):
    def propose(self, block: Block, seq: list[int], room: int) -> bool:
        """Fill ``block.proposed`` (and what the proposer read) with at most ``room`` tokens after ``seq``;
        False leaves the block to the next proposer."""


class LookupCopy:
    """Tokens copied from the context where they pay more than the draft (``csd.lookup``)."""

    def __init__(self, lookup: Lookup, metrics: RunMetrics):
        self.lookup, self.metrics = lookup, metrics

    def propose(self, block: Block, seq: list[int], room: int) -> bool:
        with self.metrics.lap("policy_s"):
            block.proposed = self.lookup.choose(self.lookup.continuation(seq)[:max(room, 0)])
        if block.proposed:
            block.source = LOOKUP
        return bool(block.proposed)


class HostDraft:
    """The draft token by token on the host while the policy asks for more, up to ``room`` and no
    further than an end token. Greedy, or sampled with the run's generator at ``temperature`` > 0;
    ``read_confidence``: greedy, the draft's top-1 probability is read (a policy or explain needs it);
    ``explain``: the draft's logits are kept for the view."""

    def __init__(self, lm: Model, cache, policy: Policy, metrics: RunMetrics, eos: frozenset[int],
                 temperature: float = 0.0, gen: torch.Generator | None = None, vocab: int = 0,
                 read_confidence: bool = False, explain: bool = False,
                 catch_up: Callable[[], float] | None = None):
        self.lm, self.cache, self.policy, self.metrics, self.eos = lm, cache, policy, metrics, eos
        self.temperature, self.gen, self.vocab = temperature, gen, vocab
        self.read_confidence, self.explain = read_confidence, explain
        # reads the prompt into the draft's cache and says how long it took (csd.decode.Run._draft_catch_up): the
        # draft reads the prompt only when it first drafts, so a run that never drafts never reads it
        self.catch_up = catch_up

    def propose(self, block: Block, seq: list[int], room: int) -> bool:
        with self.metrics.lap("policy_s"):
            self.policy.start()
            # the tokens the draft lacks beyond its first step's input (the prompt, tokens copied since it last
            # drafted): its first step would read them first, a cost the policy weighs before drafting at all
            self.policy.owe(len(seq) - 1 - self.lm.length(self.cache), room + 1)
            go = room > 0 and self.policy.more(0, 1.0)
        if go and self.catch_up is not None:
            block.catch_up_s = self.catch_up()
        feed = seq[self.lm.length(self.cache):]
        block.draft_s = 0.0
        while go:
            with self.metrics.lap("draft_s") as lap:
                logits = self.lm.forward(self.cache, feed, 1)[-1]              # (V,) or (|vocab subset|,)
            if len(feed) == 1:
                block.draft_s += lap.s
                block.draft_steps += 1
            else:       # its first step also read the tokens copied since it last drafted: no step's cost
                block.catch_up_s += lap.s
            self.metrics.draft_forwards += 1
            x, conf = self._choose(block, logits)
            block.proposed.append(x)
            if self.explain:
                block.draft_logits.append(logits)
            feed = [x]
            if x in self.eos or block.size >= room:
                break
            with self.metrics.lap("policy_s"):
                go = self.policy.more(block.size, conf)
        return True

    def _choose(self, block: Block, logits: torch.Tensor) -> tuple[int, float]:
        """The proposal and its draft probability; sampling keeps the full-vocabulary distribution."""
        ids = self.lm.vocab_ids
        token = int if ids is None else (lambda i: int(ids[int(i)]))
        self.metrics.host_syncs += 1
        if self.temperature == 0:
            if not self.read_confidence:
                return token(logits.argmax()), 1.0
            q = torch.softmax(logits.float(), -1)
            conf, i = torch.stack([q.max(), q.argmax().float()]).tolist()
            block.confidences.append(conf)
            return token(i), conf
        q_small = torch.softmax(logits / self.temperature, -1)
        i = int(torch.multinomial(q_small.cpu(), 1, generator=self.gen))
        q = q_small
        if ids is not None:
            q = torch.zeros(self.vocab, dtype=q_small.dtype, device=q_small.device)
            q[ids] = q_small
        block.confidences.append(float(q_small[i]))
        block.q_rows.append(q)
        return token(i), float(q_small[i])


class DeviceDraft:
    """Greedy drafting without a host sync, the block's length planned first: each argmax feeds the next
    step as a device tensor (a static draft drafts the whole block in one call: one graph on CUDA)."""

    def __init__(self, lm: Model, cache, policy: Policy, metrics: RunMetrics, fallback_device: torch.device):
        self.lm, self.cache, self.policy, self.metrics = lm, cache, policy, metrics
        self.fallback_device = fallback_device          # where an empty block lives (the target's device)

    def propose(self, block: Block, seq: list[int], room: int) -> bool:
        with self.metrics.lap("policy_s"):
            g = self.policy.plan(room)
        block.proposed = self._draft(g, seq[self.lm.length(self.cache):])
        return True

    def _draft(self, g: int, feed: list[int]) -> torch.Tensor:
        lm = self.lm
        whole = getattr(lm, "draft_block", None)
        if whole is not None and g > 0:
            with self.metrics.lap("draft_s"):
                xs = whole(self.cache, feed, g)
            self.metrics.draft_forwards += g
            return xs
        xs = []
        with self.metrics.lap("draft_s"):
            for _ in range(g):
                x = lm.forward(self.cache, feed, 1)[-1].argmax()              # 0-dim, on the device
                if lm.vocab_ids is not None:
                    x = lm.vocab_ids[x]
                xs.append(x)
                feed = x.view(1)
            self.metrics.draft_forwards += g
        if not xs:
            return torch.zeros(0, dtype=torch.long, device=self.fallback_device)
        return torch.stack(xs)
