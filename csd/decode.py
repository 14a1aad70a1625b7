"""One decode loop for AR, SD, CSD and the ablations (Calibrated Speculative Decoding,
arXiv 2604.13634), yielding one ``TokenEvent`` per token decision.

Both models keep a KV cache holding a prefix of the committed sequence; each step feeds a
model only the tokens its cache lacks, and a rejection crops both caches back to the kept
prefix. One target forward pass per verify step.
"""
from __future__ import annotations

import inspect
import time
from typing import Iterator

import torch
from transformers import DynamicCache

from .config import CSDConfig
from .events import (BONUS, CORRECTED, REJECTED, RESCUED, TARGET, RunMetrics, TokenEvent)
from .memory import CorrectionMemory
from .models import ModelPair
from .rule import Decision, Rescue, decide_greedy, score_block, verify_sampling


class Decoder:
    """Runs generations on one loaded pair. The models are shared read-only; the memory and
    the random generator belong to each run."""

    def __init__(self, pair: ModelPair):
        self.pair = pair

    def run(self, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory | None = None) -> "Run":
        cfg.validated(self.pair.context_limit, len(prompt_ids))
        if cfg.uses_draft and self.pair.draft is None:
            raise ValueError(f"method {cfg.method!r} needs a draft model, and none is loaded")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if memory is not None and memory.pair_id != self.pair.pair_id:
            raise ValueError(f"the memory belongs to {memory.pair_id!r}, not to this pair {self.pair.pair_id!r}")
        return Run(self, list(prompt_ids), cfg, memory if memory is not None else CorrectionMemory(self.pair.pair_id))

    def generate(self, prompt: str, cfg: CSDConfig, memory: CorrectionMemory | None = None, chat: bool = True) -> "Run":
        """Encode, run to the end, and return the finished run."""
        run = self.run(self.pair.encode_prompt(prompt, chat), cfg, memory)
        for _ in run:
            pass
        return run


class Run:
    """Iterate to get the events; afterwards ``token_ids``, ``text`` and ``metrics`` hold the
    result. Stopping the iteration early (``close()``) cancels the run and keeps what it made."""

    def __init__(self, decoder: Decoder, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory):
        self.decoder, self.pair, self.cfg, self.memory = decoder, decoder.pair, cfg, memory
        self.prompt_ids = prompt_ids
        self.token_ids: list[int] = []
        self.events: list[TokenEvent] = []
        self.metrics = RunMetrics(per_position_drafted=[0] * cfg.gamma, per_position_kept=[0] * cfg.gamma)
        self._it = self._loop()

    def __iter__(self) -> Iterator[TokenEvent]:
        return self

    def __next__(self) -> TokenEvent:
        ev = next(self._it)
        self.events.append(ev)
        return ev

    def close(self) -> None:
        self._it.close()

    @property
    def text(self) -> str:
        return self.pair.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    # -- helpers -------------------------------------------------------------------------------
    def _tok_text(self, token_id: int, context: list[int]) -> str:
        """Text a token adds after ``context`` (byte-level BPE: a lone token may be half a character)."""
        dec = self.pair.tokenizer.decode
        ctx = context[-6:]
        return dec(ctx + [token_id]).removeprefix(dec(ctx)) if ctx else dec([token_id])

    def _piece(self, token_id: int) -> str:
        return self.pair.tokenizer.decode([token_id])

    def _forward(self, model, cache: DynamicCache, ids: list[int], keep: int) -> torch.Tensor:
        """Feed ``ids`` after the cached prefix; logits of the last ``keep`` positions, (keep, V) fp32."""
        x = torch.tensor([ids], dtype=torch.long, device=model.device)
        out = model(input_ids=x, use_cache=True, logits_to_keep=keep, **{_cache_kwarg(model): cache})
        return out.logits[0].float()

    @staticmethod
    def _crop(cache: DynamicCache, length: int) -> None:
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)  # transformers 5.24 takes the number of tokens to drop, negated

    # -- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()
    def _loop(self) -> Iterator[TokenEvent]:
        cfg, pair, m = self.cfg, self.pair, self.metrics
        seq = list(self.prompt_ids)
        n_prompt = len(seq)
        eos = set(pair.eos_ids)
        temp = cfg.temperature
        gen = None
        if temp > 0:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(cfg.seed if cfg.seed is not None else int(torch.seed() % (2 ** 63)))
        rescue = Rescue(cfg.use_ocm, cfg.use_scg, cfg.lam, cfg.log_tau)
        tcache = DynamicCache(config=pair.target.config)
        dcache = DynamicCache(config=pair.draft.config) if cfg.uses_draft else None
        self.caches = (tcache, dcache)  # exposed for inspection (tests check them after rollbacks)
        t0 = time.perf_counter()
        m.stopped_by = "cancelled"
        block = 0
        try:
            while len(seq) - n_prompt < cfg.max_new_tokens:
                out = seq[n_prompt:]
                if not cfg.uses_draft:
                    # AR: one target pass, one token.
                    logits = self._forward(pair.target, tcache, seq[tcache.get_seq_length():], 1)[-1]
                    m.target_forwards += 1
                    tok = int(logits.argmax()) if temp == 0 else _sample_logits(logits, temp, gen)
                    seq.append(tok)
                    m.new_tokens += 1
                    yield TokenEvent(len(out), tok, self._tok_text(tok, out), TARGET, block, 0,
                                     target_id=int(logits.argmax()), target_logit=float(logits.max()))
                    block += 1
                    if tok in eos:
                        m.stopped_by = "eos"
                        return
                    continue

                # 1. Draft proposes up to gamma tokens (fewer near max_new_tokens or after an EOS).
                g = min(cfg.gamma, cfg.max_new_tokens - len(out) - 1)
                drafts, q_rows, d_logits = [], [], []
                feed = seq[dcache.get_seq_length():]
                for _ in range(g):
                    dl = self._forward(pair.draft, dcache, feed, 1)[-1]     # (V,)
                    m.draft_forwards += 1
                    if temp == 0:
                        x = int(dl.argmax())
                    else:
                        q_row = torch.softmax(dl / temp, -1)
                        x = int(torch.multinomial(q_row.cpu(), 1, generator=gen))
                        q_rows.append(q_row)
                    drafts.append(x)
                    if cfg.explain:
                        d_logits.append(dl)
                    feed = [x]
                    if x in eos:
                        break
                # 2. Target scores the whole block in one pass: (len(drafts) + 1, V).
                tl = self._forward(pair.target, tcache, seq[tcache.get_seq_length():] + drafts, len(drafts) + 1)
                m.target_forwards += 1
                # 3. Verify (pure rule), then 4. update the memory with this block's divergences.
                #    Bookkeeping time = the decision walk (memory lookups, gate) + memory updates;
                #    the argmax SD needs anyway is not counted.
                if temp == 0:
                    scores = score_block(drafts, tl)
                    tb = time.perf_counter()
                    d: Decision = decide_greedy(drafts, scores, self.memory.count, rescue)
                else:
                    tb = time.perf_counter()
                    p = torch.softmax(tl / temp, -1)
                    q = torch.stack(q_rows).to(p.device) if q_rows else p[:0]
                    d = verify_sampling(drafts, q, p, tl, self.memory.count, rescue, gen)
                for x_t, t_t in d.observed:
                    self.memory.observe(x_t, t_t)
                m.bookkeeping_s += time.perf_counter() - tb
                # 5. Emit events; stop at EOS.
                m.drafted += len(drafts)
                probs_t = torch.softmax(tl, -1) if (cfg.explain or temp == 0) else p
                for i, v in enumerate(d.verdicts):
                    m.per_position_drafted[i] += 1
                    ev = TokenEvent(
                        len(out), v.x_tilde, self._tok_text(v.x_tilde, out), v.status, block, i,
                        draft_id=v.x_tilde, draft_text=self._piece(v.x_tilde), target_id=v.t_star,
                        target_text=self._piece(v.t_star), draft_logit=v.z_x, target_logit=v.z_t, gap=v.gap,
                        memory_count=v.count, rule=v.rule, target_prob=float(probs_t[i, v.x_tilde]),
                        draft_prob=float(q_rows[i][v.x_tilde]) if q_rows else None)
                    if cfg.explain:
                        self._explain(ev, probs_t[i], d_logits[i])
                    if v.status == REJECTED:
                        yield ev
                        break
                    m.per_position_kept[i] += 1
                    if v.status == RESCUED:
                        m.rescued += 1
                    else:
                        m.accepted += 1
                    seq.append(v.x_tilde)
                    out.append(v.x_tilde)
                    m.new_tokens += 1
                    yield ev
                    if v.x_tilde in eos:
                        m.stopped_by = "eos"
                        return
                m.divergences += len(d.observed)
                status = BONUS if d.bonus else CORRECTED
                nxt = d.next_token
                seq.append(nxt)
                m.new_tokens += 1
                row = len(d.verdicts) if d.bonus else len(d.verdicts) - 1
                ev = TokenEvent(len(out), nxt, self._tok_text(nxt, out), status, block, row,
                                target_id=int(tl[row].argmax()), target_text=self._piece(int(tl[row].argmax())),
                                target_logit=float(tl[row].max()), target_prob=float(probs_t[row, nxt]))
                if cfg.explain:
                    self._explain(ev, probs_t[row], None)
                out.append(nxt)
                # Roll both caches back to the kept prefix (the new token is fed next step).
                keep = len(seq) - 1
                self._crop(tcache, keep)
                self._crop(dcache, keep)
                block += 1
                yield ev
                if nxt in eos:
                    m.stopped_by = "eos"
                    return
            m.stopped_by = "max_new_tokens"
        finally:
            self.token_ids = seq[n_prompt:]
            m.wall_s = time.perf_counter() - t0

    def _explain(self, ev: TokenEvent, p_target: torch.Tensor, draft_logits: torch.Tensor | None) -> None:
        k = self.cfg.explain_top_k
        top = torch.topk(p_target, k)
        ev.target_top = [[self._piece(int(i)), float(v)] for v, i in zip(top.values, top.indices)]
        if draft_logits is not None:
            q = torch.softmax(draft_logits / (self.cfg.temperature or 1.0), -1)
            top = torch.topk(q, k)
            ev.draft_top = [[self._piece(int(i)), float(v)] for v, i in zip(top.values, top.indices)]


def _cache_kwarg(model) -> str:
    """transformers 5.2x names the KV-cache argument `cache`; older and remote-code models say
    `past_key_values`."""
    name = getattr(model, "_csd_cache_kwarg", None)
    if name is None:
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._csd_cache_kwarg = name
    return name


def _sample_logits(logits: torch.Tensor, temp: float, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(torch.softmax(logits / temp, -1).cpu(), 1, generator=gen))
