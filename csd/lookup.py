"""Proposals copied from the context (prompt lookup, docs/bench-copies.md): when the sequence's last
tokens occurred earlier, the tokens that followed them there are proposed, at no draft cost. The target
verifies them with the exact rule (never rescued, never counted into the memory), so greedy output stays
the target's and sampled output keeps its distribution. A lookup block is chosen when its expected tokens
per ms (``csd.costs.CostModel``) beat the run's draft-model blocks so far.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .block import LOOKUP
from .config import LOOKUP_NGRAM_MAX as N_MAX  # longest suffix matched

if TYPE_CHECKING:
    from .block import Block

PRIOR = (0.7, 2.0)   # chance of keeping the first copied token before the run has seen one, and its weight


class Lookup:
    """Finds the continuation of the sequence's longest matched suffix (``n_min``..N_MAX tokens, the latest
    occurrence) and chooses how many of its tokens to propose. The n-gram index grows with the sequence."""

    def __init__(self, max_len: int, costs=None, n_min: int = 3):
        if not 1 <= n_min <= N_MAX:
            raise ValueError(f"n_min must be in 1..{N_MAX}, got {n_min}")
        self.max_len, self.costs, self.n_min = max_len, costs, n_min
        self.base = costs                            # a run alone's costs (``share`` plans with a share of them)
        self._index: dict[int, dict[tuple, int]] = {n: {} for n in range(n_min, N_MAX + 1)}
        self._done = 0                               # positions whose n-grams ending there are indexed
        self._kept = [0.0] * (max_len + 1)           # per proposal position: kept / decided
        self._n = [0.0] * (max_len + 1)
        self.model_tokens = 0.0                      # what the run's draft-model blocks made ...
        self.model_ms = 0.0                          # ... and what they cost by the cost model

    def _extend(self, seq: list[int], end: int) -> None:
        """Index the n-grams ending at positions up to ``end`` (exclusive of ``seq[end]``'s own)."""
        for e in range(self._done, end):
            for n, idx in self._index.items():
                if e >= n:
                    idx[tuple(seq[e - n:e])] = e
        self._done = max(self._done, end)

    def continuation(self, seq: list[int]) -> list[int]:
        """Up to ``max_len`` tokens that followed the latest earlier occurrence of the longest
        matching suffix of ``seq`` (empty when no suffix of ``n_min`` tokens or more recurs)."""
        self._extend(seq, len(seq))        # n-grams ending before the last token: the suffix itself is not one
        for n in range(N_MAX, self.n_min - 1, -1):
            if len(seq) <= n:
                continue
            e = self._index[n].get(tuple(seq[-n:]))
            if e is not None:
                return seq[e:e + self.max_len]
        return []

    def rates(self, k: int) -> list[float]:
        """``rates(k)[j - 1]``: the chance that copied token j (1..k) is kept, given that tokens 1..j-1
        were; each position's prior is the rate before it (the first's: ``PRIOR``)."""
        out, (prev, w) = [], PRIOR
        for j in range(1, k + 1):
            prev = (self._kept[j] + prev * w) / (self._n[j] + w)
            out.append(prev)
        return out

    def rate(self, j: int) -> float:
        """The chance that copied token j is kept, given that tokens 1..j-1 were."""
        return self.rates(j)[-1]

    def choose(self, candidates: list[int]) -> list[int]:
        """The prefix of ``candidates`` with the best expected tokens per ms, if that beats both a plain target
        step and the draft model's rate in this run (without a cost model: all of them)."""
        if not candidates or self.costs is None:
            return candidates
        best_k, best = 0, 0.0
        e, prod = 1.0, 1.0
        for k, rate in enumerate(self.rates(len(candidates)), start=1):
            prod *= rate
            e += prod
            r = e / self.costs.verify(k + 1)
            if r > best:
                best_k, best = k, r
        plain = 1.0 / self.costs.verify(1)
        model = self.model_tokens / self.model_ms if self.model_ms > 0 else 0.0
        return candidates[:best_k] if best > max(plain, model) else []

    def share(self, runs: int) -> None:
        """Weigh copies as one of ``runs`` runs that share every pass (``csd.costs.CostModel.shared``)."""
        if self.base is not None:
            self.costs = self.base.shared(runs)

    def observe(self, block: Block) -> None:
        """Copies teach the copy rates, draft-model blocks the rate the copies must beat."""
        if block.source == LOOKUP:
            self.observe_copies(block.size, block.n_kept)
        else:
            self.observe_model(block.n_kept + 1, block.size)

    def observe_copies(self, proposed: int, kept: int) -> None:
        """``proposed`` tokens, the first ``kept`` kept; position j counts only where j - 1 was kept."""
        for j in range(1, min(proposed, kept + 1, self.max_len) + 1):
            self._n[j] += 1
            self._kept[j] += j <= kept

    def observe_model(self, tokens: int, drafted: int) -> None:
        """A draft-model block's added ``tokens`` for ``drafted`` draft tokens, by the copies' cost model."""
        if self.costs is None:
            return
        self.model_tokens += tokens
        self.model_ms += drafted * self.costs.draft_ms + self.costs.verify(drafted + 1)
