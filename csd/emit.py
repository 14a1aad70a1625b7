"""Step 5 of the decode loop (Calibrated Speculative Decoding, arXiv 2604.13634): a decided block as
``TokenEvent``s, one per decided draft position and then the target's own token, each committed to the
sequence and counted in the run's metrics as it is emitted (a consumer that stops early keeps what it saw).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from .events import BONUS, CORRECTED, REJECTED, TARGET, RunMetrics, TokenEvent
from .text import Detokenizer

if TYPE_CHECKING:
    from .block import Block
    from .config import CSDConfig
    from .protocols import Pair


class EventBuilder:
    """Makes a run's events: token texts (streamed through one ``Detokenizer``), the target's
    probabilities, the explain view's top tokens; positions count from the end of the prompt."""

    def __init__(self, pair: Pair, cfg: CSDConfig, metrics: RunMetrics, prompt_len: int):
        self.pair, self.cfg, self.metrics, self.prompt_len = pair, cfg, metrics, prompt_len
        self.eos = frozenset(pair.eos_ids)
        self.detok = Detokenizer(pair.tokenizer)

    def drafts(self, block: Block, seq: list[int]) -> Iterator[TokenEvent]:
        """The decided draft positions up to the first rejection (a rejected copy is not an event); returns
        True where a kept token ends the text (its event ends the pass)."""
        m, copied = self.metrics, block.copied
        m.proposed(block.size, 0 if copied else block.divergences, copied)
        for i, v in enumerate(block.decision.verdicts):
            kept = v.status != REJECTED
            if copied and not kept:
                break
            m.position(i, v.status, copied)
            ev = self._draft_event(block, i, len(seq))
            if not kept:
                yield ev
                break
            seq.append(v.x_tilde)
            if v.x_tilde in self.eos:       # the end of the text: the pass ends here
                yield replace(ev, pass_end=True)
                return True
            yield ev
        return False

    def target_token(self, block: Block, seq: list[int]) -> TokenEvent:
        """The target's own token after the kept drafts: a correction, or a bonus after a fully kept block."""
        d = block.decision
        row = len(d.verdicts) if d.bonus else len(d.verdicts) - 1
        nxt = d.next_token
        if block.scores is not None:
            t_top, z_top = block.scores.t_star[row], block.scores.z_t[row]
        else:
            self.metrics.host_syncs += 1
            t_top, z_top = int(block.logits[row].argmax()), float(block.logits[row].max())
        explain = dict(target_top=self._top(block.probs[row])) if self.cfg.explain else {}
        seq.append(nxt)
        self.metrics.new_tokens += 1
        return TokenEvent(len(seq) - 1 - self.prompt_len, nxt, self.detok.push(nxt), BONUS if d.bonus else CORRECTED,
                          block.index, row, target_id=t_top, target_text=self._piece(t_top), target_logit=z_top,
                          target_prob=self._prob(block, row, nxt, z_top), block_len=block.size, pass_end=True,
                          special=nxt in self.pair.special_ids, **explain)

    def target_alone(self, index: int, tok: int, t_top: int, z_top: float, seq: list[int]) -> TokenEvent:
        """AR's token (``tok``; ``t_top`` the target's top-1, logit ``z_top``), committed to ``seq``."""
        seq.append(tok)
        self.metrics.new_tokens += 1
        return TokenEvent(len(seq) - 1 - self.prompt_len, tok, self.detok.push(tok), TARGET, index, 0,
                          target_id=t_top, target_text=self._piece(t_top), target_logit=z_top, pass_end=True,
                          special=tok in self.pair.special_ids)

    def _draft_event(self, block: Block, i: int, n: int) -> TokenEvent:
        v, cfg, explain = block.decision.verdicts[i], self.cfg, {}
        kept = v.status != REJECTED
        text = self.detok.push(v.x_tilde) if kept else self.detok.peek(v.x_tilde)
        if cfg.explain:
            explain = dict(target_top=self._top(block.probs[i]))
            if block.draft_logits:
                q = torch.softmax(block.draft_logits[i] / (cfg.temperature or 1.0), -1)
                explain["draft_top"] = self._top(q, self.pair.draft_lm.vocab_ids)
        draft_prob = self._draft_prob(block, i, v.x_tilde)
        return TokenEvent(
            n - self.prompt_len, v.x_tilde, text, v.status, block.index, i,
            draft_id=v.x_tilde, draft_text=self._piece(v.x_tilde), target_id=v.t_star,
            target_text=self._piece(v.t_star), draft_logit=v.z_x, target_logit=v.z_t, gap=v.gap,
            memory_count=v.count, rule=v.rule, target_prob=self._prob(block, i, v.x_tilde, v.z_x),
            draft_prob=draft_prob, block_len=block.size, special=v.x_tilde in self.pair.special_ids,
            discarded=list(block.proposed[i + 1:]) if not kept else None,
            source=block.source if block.copied else None, **v.logged(), **explain)

    @staticmethod
    def _draft_prob(block: Block, i: int, token: int) -> float | None:
        """The draft's probability of its proposal: from its sampled rows, else the confidence a lean
        greedy draft reported, else unknown (copied tokens have none)."""
        if block.q_rows:
            return float(block.q_rows[i][token])
        if block.confidences:
            return block.confidences[i]
        return None

    def _piece(self, token_id: int) -> str:
        return self.pair.tokenizer.decode([token_id])

    def _top(self, probs: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> list:
        top = torch.topk(probs, min(self.cfg.explain_top_k, probs.numel()))
        ids = top.indices if vocab_ids is None else vocab_ids[top.indices]
        return [[self._piece(int(i)), float(v)] for v, i in zip(top.values, ids)]

    def _prob(self, block: Block, row: int, token: int, z: float) -> float:
        """The target's probability of ``token`` (logit ``z``) at ``row``."""
        if block.scores is not None:
            return math.exp(z - block.scores.lse[row])
        self.metrics.host_syncs += 1
        return float(block.probs[row, token])
