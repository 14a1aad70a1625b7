"""What the paper's decode loop needs from a model runtime (Calibrated Speculative Decoding, arXiv 2604.13634),
declared here so that the paper never imports one: a model pass over a KV cache that rolls back (``Model``)
and a loaded draft/target pair (``Pair``). ``csd.runtime`` implements them (``csd.runtime.lm``,
``csd.runtime.pair.ModelPair``); the cost model is the paper's own ``csd.costs.CostModel``, measured by the
runtime and handed to the ``csd.decode.Decoder`` by whoever wires them (the command line, the app).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from .representation import Representation


class Model(Protocol):
    """A causal LM as the loop calls it. A model may also offer the optional parts declared below
    (``Wrapper``, ``FixedCache``, ``BlockDrafter``, ``Captures``, ``SharedPasses``); the loop looks each up
    with ``getattr`` and does without it where a model lacks it."""
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


class Wrapper(Protocol):
    """A model that wraps another (the synthetic benchmark's, ``bench/synthetic/models.py``): the loop asks
    ``inner``, the model that owns the cache, for the optional parts below (``FixedCache.check_room``); the
    runtime's description of a pair reads the wrapped draft through it too."""
    inner: Model


class FixedCache(Protocol):
    """A model whose KV cache has a fixed size (the static engine): it refuses a run it cannot hold."""

    def check_room(self, tokens: int, what: str) -> None:
        """Raise ``ValueError`` naming ``what`` if ``tokens`` more tokens would not fit."""


class BlockDrafter(Protocol):
    """A draft that proposes ``g`` greedy tokens in one call (the static engine's captured draft block)."""

    def draft_block(self, cache, feed, g: int) -> torch.Tensor:
        """Feed ``feed``, then draft ``g`` tokens greedily: their ids (g,), on the device."""


class Captures(Protocol):
    """A model that captures graphs as it meets new pass shapes: how many it has captured so far."""
    captures: int


class SharedPasses(Protocol):
    """A model whose passes serve other runs too (the batcher's views): a pass's time is no one run's cost,
    so the loop does not feed it to gamma auto's measured costs, and plans each block as one of
    ``runs_sharing()`` runs (``csd.costs.CostModel.shared``)."""
    shares_passes: bool

    def runs_sharing(self, cache) -> int:
        """How many runs share the passes now, the run of this target cache included."""


class Tokenizer(Protocol):
    """What the loop asks of the pair's tokenizer: a token's text (streaming pieces, event texts)."""

    def decode(self, ids: list[int]) -> str: ...


class Pair(Protocol):
    """A loaded draft/target pair: the two models, their tokenizer, the pair's identity and how its weights
    are held (``rep``: the memory compares it with the representation it was calibrated with)."""
    target_lm: Model
    draft_lm: Model | None
    tokenizer: Tokenizer
    rep: Representation
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
