"""What the paper's decode loop needs from a model runtime (Calibrated Speculative Decoding, arXiv 2604.13634),
declared here so that the paper never imports one: a model pass over a KV cache that rolls back (``Model``)
and a loaded draft/target pair (``Pair``). ``csd.runtime`` implements them (``csd.runtime.lm``,
``csd.runtime.pair.ModelPair``); the cost model is the paper's own ``csd.costs.CostModel``, measured by the
runtime and handed to the ``csd.decode.Decoder`` by whoever wires them (the command line, the app).
"""
from __future__ import annotations

from typing import Protocol

import torch


class Model(Protocol):
    """A causal LM as the loop calls it. Optional: ``check_room(tokens, what)`` (a fixed-size cache refuses
    a run it cannot hold), ``draft_block(cache, feed, g)`` (g greedy drafts in one call), ``captures`` (graphs
    captured so far), ``shares_passes`` (its passes serve other runs too: their times are no run's cost)."""
    vocab_ids: torch.Tensor | None      # the token id of each logit row (a reduced vocabulary), or None
    vocab_size: int
    device: torch.device

    def new_cache(self): ...

    def forward(self, cache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds: float32 logits of the last ``keep`` positions (keep, V)."""

    def length(self, cache) -> int: ...

    def crop(self, cache, length: int) -> None:
        """Roll the cache back to its first ``length`` tokens."""

    def release(self, cache) -> None:
        """The run that made ``cache`` is over."""


class Pair(Protocol):
    """A loaded draft/target pair: the two models, their tokenizer and the pair's identity."""
    target_lm: Model
    draft_lm: Model | None
    tokenizer: object
    pair_id: str
    eos_ids: tuple[int, ...]
    special_ids: frozenset[int]     # never counted nor rescued (csd.rule)
    context_limit: int
    is_embedded: bool               # the shipped pair, whose calibrated memory ships too


def ids_tensor(ids: list[int] | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Token ids as a 1-D long tensor on ``device``; to a GPU through pinned memory without a host sync."""
    if torch.is_tensor(ids):
        return ids.view(-1)
    t = torch.tensor(ids, dtype=torch.long)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
