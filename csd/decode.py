"""One decode loop for AR, SD, CSD, the ablations and the rivals (Calibrated Speculative Decoding,
arXiv 2604.13634), yielding one ``TokenEvent`` per token decision. Each model's KV cache holds a prefix
of the committed sequence; one target pass per block. The steps (``Run._speculate``) fill in the block's
record (``csd.block.Block``): 1. draft (``csd.policy`` says how many) or copy from the context; 2. the
target scores the block; 3. decide each position (``csd.rule``); 4. the memory learns the divergences;
5. emit the events; 6. crop both caches to the kept prefix; 7. the policies learn from the block.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from .block import DRAFT, LOOKUP, Block
from .config import GAMMA_AUTO, CSDConfig
from .events import BONUS, CORRECTED, REJECTED, STOP_CANCELLED, STOP_EOS, STOP_MAX, TARGET, RunMetrics, TokenEvent
from .lookup import Lookup
from .memory import CorrectionMemory, default_memory
from .policy import AutoGamma, FixedGamma, Learned, Policy
from .rule import Rescue, decide
from .runtime.lm import ids_tensor
from .runtime.pair import ModelPair
from .runtime.static import check_room
from .text import Detokenizer
from .verify import point_mass, sample, score_block, verify_sampling

log = logging.getLogger(__name__)
PREFILL_CHUNK = 128   # prompt tokens per prefill pass: a stop request is seen between chunks
# devices where gamma auto drafts without reading each draft confidence (a read waits for the device: docs/gpu.md)
SYNC_FREE_AUTO_DEVICES = ("cuda",)


def prefill_spans(n: int) -> list[tuple[int, int]]:
    """(start, end) of the prefill passes over ``n`` tokens: the first token alone, then chunks of
    ``PREFILL_CHUNK``. The first token is an attention sink (docs/bench-representation.md): in an int8
    pass with one scale it would coarsen every other token's rounding."""
    if n <= 0:
        return []
    return [(0, 1)] + [(s, min(s + PREFILL_CHUNK, n)) for s in range(1, n, PREFILL_CHUNK)]


class Cancelled(Exception):
    """Raised inside a run when its ``should_stop`` callback says so."""


class Decoder:
    """Runs generations on one loaded pair. ``costs``: the cost model for ``gamma="auto"`` (default:
    ``csd.runtime.profile.cached_costs(pair)``, on first need)."""

    def __init__(self, pair: ModelPair, costs=None, online_costs: bool = True):
        self.pair, self._costs = pair, costs
        self.online_costs = online_costs          # gamma auto plans with the runs' measured costs
        self.learned = Learned()                  # what this decoder's runs measured, handed to the next run
        self._default_memory: CorrectionMemory | None = None

    @property
    def costs(self):
        if self._costs is None:
            from .runtime.profile import cached_costs
            self._costs = cached_costs(self.pair)
        return self._costs

    def default_memory(self) -> CorrectionMemory:
        """A fresh copy of the pair's calibrated memory (the shipped one for the embedded pair)."""
        if self._default_memory is None:
            self._default_memory = default_memory(self.pair)
        return self._default_memory.copy()

    def run(self, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory | None = None,
            should_stop: Callable[[], bool] | None = None) -> Run:
        """A run to iterate. ``memory``: what CSD reads and updates (default: a copy of the pair's
        calibrated one). ``should_stop``: polled between prefill chunks, drafting and verifying."""
        cfg.validated(self.pair.context_limit, len(prompt_ids))
        check_room(self.pair, len(prompt_ids), cfg)     # a static KV cache refuses what it cannot hold
        if cfg.uses_draft and self.pair.draft_lm is None:
            raise ValueError(f"method {cfg.method!r} needs a draft model, and none is loaded")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if memory is None:
            memory = self.default_memory()
        if memory.pair_id != self.pair.pair_id:
            raise ValueError(f"the memory belongs to {memory.pair_id!r}, not to this pair {self.pair.pair_id!r}")
        policy = None
        if cfg.uses_draft:
            policy = AutoGamma(self.costs, cfg.gamma_max, cfg.gamma_min, online=self.online_costs,
                               learned=self.learned) if cfg.gamma == GAMMA_AUTO else FixedGamma(cfg.gamma)
        return Run(self.pair, list(prompt_ids), cfg, memory, policy, should_stop)


class _Lap:
    """``with _Lap(metrics, "draft_s") as lap:`` adds the block's seconds to that metric (unless it
    raises) and keeps them in ``lap.s``."""

    def __init__(self, metrics: RunMetrics, name: str):
        self.metrics, self.name, self.s = metrics, name, 0.0

    def __enter__(self) -> _Lap:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.s = time.perf_counter() - self.t0
            setattr(self.metrics, self.name, getattr(self.metrics, self.name) + self.s)


class Run:
    """Iterate to get the events; afterwards ``token_ids``, ``text`` and ``metrics`` hold the
    result. Stopping the iteration early (``close()``) cancels the run and keeps what it made."""

    def __init__(self, pair: ModelPair, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory,
                 policy: Policy | None, should_stop: Callable[[], bool] | None):
        self.pair, self.cfg, self.memory, self.policy = pair, cfg, memory, policy
        self.prompt_ids = prompt_ids
        self.should_stop = should_stop or (lambda: False)
        self.token_ids: list[int] = []
        self.events: list[TokenEvent] = []
        width = policy.max_len if policy is not None else 0
        self.metrics = RunMetrics(per_position_drafted=[0] * width, per_position_kept=[0] * width)
        self.rescue = cfg.rule(pair.special_ids)     # CSD's modules, or a rival's relaxed rule (csd.rule)
        self.exact = Rescue.of(False, False, cfg.lam, cfg.tau, pair.special_ids)   # the rule for copied tokens
        self.lookup = Lookup(cfg.lookup, policy.costs, cfg.lookup_ngram) if cfg.lookup and policy else None
        self._observers = [p for p in (policy, self.lookup) if p is not None]   # they learn from every block
        self.eos = frozenset(pair.eos_ids)
        self.gen = None
        if cfg.temperature > 0:     # one generator per run, never the process-wide one
            self.gen = torch.Generator(device="cpu")
            if cfg.seed is not None:
                self.gen.manual_seed(cfg.seed)
            else:
                self.gen.seed()
        self.tcache = pair.target_lm.new_cache()
        self.dcache = pair.draft_lm.new_cache() if cfg.uses_draft else None
        self.caches = (self.tcache, self.dcache)  # exposed for inspection (tests check them after rollbacks)
        # greedy with a fixed gamma, or gamma auto on a GPU (planned from position rates): drafts on the device
        self._on_device = (policy is not None and cfg.temperature == 0 and not cfg.explain
                           and (not policy.reads_confidence
                                or pair.draft_lm.device.type in SYNC_FREE_AUTO_DEVICES))
        self._need_conf = (policy is not None and policy.reads_confidence and not self._on_device) or cfg.explain
        self._vocab = pair.target_lm.vocab_size if cfg.temperature > 0 else 0
        self._step = self._speculate if policy is not None else self._autoregress
        self._shared = getattr(pair.target_lm, "shares_passes", False)     # csd.runtime.batch: passes with other runs
        self._detok = Detokenizer(pair.tokenizer)
        self._seq = list(prompt_ids)
        self._block = 0
        self._t0: float | None = None
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

    def metrics_snapshot(self) -> RunMetrics:
        """A copy of the metrics so far, with the wall time up to now (for a live view)."""
        m = replace(self.metrics, per_position_drafted=list(self.metrics.per_position_drafted),
                    per_position_kept=list(self.metrics.per_position_kept))
        if self._t0 is not None and not self.metrics.stopped_by:
            m.wall_s = time.perf_counter() - self._t0
        return m

    # -- small steps ---------------------------------------------------------------------------
    def _lap(self, name: str) -> _Lap:
        return _Lap(self.metrics, name)

    def _check_stop(self) -> None:
        if self.should_stop():
            raise Cancelled

    def _piece(self, token_id: int) -> str:
        return self.pair.tokenizer.decode([token_id])

    def _captures(self) -> int:
        return sum(getattr(lm, "captures", 0) for lm in (self.pair.target_lm, self.pair.draft_lm) if lm is not None)

    def _room(self) -> int:
        """Tokens a block may propose: the budget left, less the target's own token."""
        return self.cfg.max_new_tokens - (len(self._seq) - len(self.prompt_ids)) - 1

    def _prefill(self) -> None:
        """Feed all prompt tokens but the last (fed with the first block) to both models, in chunks."""
        body = self._seq[:-1]
        with self._lap("prefill_s"):
            for lm, cache in ((self.pair.target_lm, self.tcache), (self.pair.draft_lm, self.dcache)):
                for a, b in prefill_spans(len(body)) if cache is not None else ():
                    self._check_stop()
                    lm.forward(cache, body[a:b], 1)

    def _draft_logits_to_token(self, logits: torch.Tensor) -> tuple[int, float, torch.Tensor | None]:
        """(token, its draft probability, the draft's full-vocabulary distribution when sampling)."""
        cfg, ids = self.cfg, self.pair.draft_lm.vocab_ids
        token = int if ids is None else (lambda i: int(ids[int(i)]))
        self.metrics.host_syncs += 1
        if cfg.temperature == 0:
            if not self._need_conf:
                return token(logits.argmax()), 1.0, None
            q = torch.softmax(logits.float(), -1)
            conf, i = torch.stack([q.max(), q.argmax().float()]).tolist()
            return token(i), conf, None
        q_small = torch.softmax(logits / cfg.temperature, -1)
        i = int(torch.multinomial(q_small.cpu(), 1, generator=self.gen))
        if ids is None:
            return i, float(q_small[i]), q_small
        q = torch.zeros(self._vocab, dtype=q_small.dtype, device=q_small.device)
        q[ids] = q_small
        return int(ids[i]), float(q_small[i]), q

    def _draft(self) -> Block:
        """Step 1: propose up to the policy's block length (fewer near max_new_tokens, none past EOS)."""
        lm = self.pair.draft_lm
        block = Block(self._block, DRAFT, start=len(self._seq))
        room = self._room()
        feed = self._seq[lm.length(self.dcache):]
        if self._on_device:
            with self._lap("policy_s"):
                g = self.policy.plan(room)
            block.proposed = self._draft_on_device(g, feed)
            return block
        with self._lap("policy_s"):
            self.policy.start()
            go = room > 0 and self.policy.more(0, 1.0)
        block.draft_s = 0.0
        while go:
            with self._lap("draft_s") as lap:
                logits = lm.forward(self.dcache, feed, 1)[-1]                  # (V,) or (|vocab subset|,)
            block.draft_s += lap.s
            self.metrics.draft_forwards += 1
            x, conf, q = self._draft_logits_to_token(logits)
            block.proposed.append(x)
            block.confidences.append(conf)
            if q is not None:
                block.q_rows.append(q)
            if self.cfg.explain:
                block.draft_logits.append(logits)
            feed = [x]
            if x in self.eos or block.size >= room:
                break
            with self._lap("policy_s"):
                go = self.policy.more(block.size, conf)
        return block

    def _draft_on_device(self, g: int, feed: list[int]) -> torch.Tensor:
        """Greedy drafting without a host sync: each argmax feeds the next step as a device tensor (a static
        draft drafts the whole block in one call: one graph on CUDA)."""
        lm = self.pair.draft_lm
        block = getattr(lm, "draft_block", None)
        if block is not None and g > 0:
            with self._lap("draft_s"):
                xs = block(self.dcache, feed, g)
            self.metrics.draft_forwards += g
            return xs
        xs = []
        with self._lap("draft_s"):
            for _ in range(g):
                x = lm.forward(self.dcache, feed, 1)[-1].argmax()              # 0-dim, on the device
                if lm.vocab_ids is not None:
                    x = lm.vocab_ids[x]
                xs.append(x)
                feed = x.view(1)
            self.metrics.draft_forwards += g
        dev = lm.device if xs else self.pair.target_lm.device
        return torch.stack(xs) if xs else torch.zeros(0, dtype=torch.long, device=dev)

    def _verify(self, block: Block) -> torch.Tensor:
        """Step 2: one target pass over what its cache lacks plus the block: (block.size + 1, V)."""
        lm, drafts = self.pair.target_lm, block.proposed
        with self._lap("verify_s") as lap:
            pending = self._seq[lm.length(self.tcache):]
            if torch.is_tensor(drafts):
                ids = torch.cat([ids_tensor(pending, drafts.device), drafts])
            else:
                ids = pending + drafts
            logits = lm.forward(self.tcache, ids, len(drafts) + 1)
        self.metrics.target_forwards += 1
        block.pass_tokens, timed = len(ids), lm.device.type == "cpu"    # elsewhere: launch times, not costs
        block.verify_s, block.draft_s = (lap.s, block.draft_s) if timed else (None, None)
        return logits

    def _decide(self, block: Block, rule: Rescue) -> None:
        """Step 3: ``rule`` on the target's logits. Greedy: one host transfer for the block, whose
        proposals become a host list; sampling a copied block, its proposals are point masses."""
        cfg, tl = self.cfg, block.logits
        if block.source == LOOKUP and cfg.temperature > 0:
            block.q_rows = list(point_mass(block.proposed, tl))
        self.metrics.host_syncs += 1
        if cfg.temperature == 0:
            with self._lap("transfer_s"):
                drafts, scores = score_block(block.proposed, tl, rule.scores)   # the argmax work SD needs anyway
            cut = next((i + 1 for i, x in enumerate(drafts) if x in self.eos), len(drafts))
            if cut < len(drafts):        # nothing after an end token can be kept
                drafts, scores = drafts[:cut], scores.head(cut)
            block.proposed, block.scores = drafts, scores
        with self._lap("bookkeeping_s"):
            if cfg.temperature == 0:
                block.decision = decide(block.proposed, block.scores, self.memory.count, rule)
                block.probs = torch.softmax(tl.float(), -1) if cfg.explain else None
            else:
                block.probs = p = torch.softmax(tl / cfg.temperature, -1)
                q = torch.stack(block.q_rows).to(p.device) if block.q_rows else p[:0]
                block.decision = verify_sampling(block.proposed, q, p, tl, self.memory.count, rule, self.gen)

    def _learn(self, block: Block) -> None:
        """Step 4: the Online Correction Memory counts the block's divergences (x~, t*)."""
        with self._lap("bookkeeping_s"):
            for x_t, t_t in block.decision.observed:
                self.memory.observe(x_t, t_t)

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

    def _count(self, block: Block) -> None:
        m, d = self.metrics, block.decision
        if block.source == LOOKUP:
            m.lookup_blocks += 1
            m.lookup_drafted += block.size
        else:
            m.drafted += block.size
            m.divergences += len(d.observed) + sum(1 for v in d.verdicts if v.count is None and v.x_tilde != v.t_star)

    def _draft_event(self, block: Block, i: int) -> TokenEvent:
        v, cfg, explain = block.decision.verdicts[i], self.cfg, {}
        kept = v.status != REJECTED
        text = self._detok.push(v.x_tilde) if kept else self._detok.peek(v.x_tilde)
        if cfg.explain:
            explain = dict(target_top=self._top(block.probs[i]))
            if block.draft_logits:
                q = torch.softmax(block.draft_logits[i] / (cfg.temperature or 1.0), -1)
                explain["draft_top"] = self._top(q, self.pair.draft_lm.vocab_ids)
        draft_prob = float(block.q_rows[i][v.x_tilde]) if block.q_rows else \
            (block.confidences[i] if block.confidences and self._need_conf else None)
        return TokenEvent(
            len(self._seq) - len(self.prompt_ids), v.x_tilde, text, v.status, self._block, i,
            draft_id=v.x_tilde, draft_text=self._piece(v.x_tilde), target_id=v.t_star,
            target_text=self._piece(v.t_star), draft_logit=v.z_x, target_logit=v.z_t, gap=v.gap,
            memory_count=v.count, rule=v.rule, target_prob=self._prob(block, i, v.x_tilde, v.z_x),
            draft_prob=draft_prob, block_len=block.size, special=v.x_tilde in self.pair.special_ids,
            discarded=list(block.proposed[i + 1:]) if not kept else None,
            source=block.source if block.source != DRAFT else None, **v.logged(), **explain)

    def _emit(self, block: Block, rollback: Callable[[], None]) -> Iterator[TokenEvent]:
        """Step 5: one event per decided draft position, then the target's own token (a rejected copy
        is not an event); ``rollback`` (step 6) runs before that last event, so that a viewer sees the
        state it describes."""
        m, d = self.metrics, block.decision
        copied = block.source == LOOKUP
        self._count(block)
        for i, v in enumerate(d.verdicts):
            kept = v.status != REJECTED
            if copied and not kept:
                break
            if not copied:
                m.per_position_drafted[i] += 1
            ev = self._draft_event(block, i)
            if not kept:
                yield ev
                break
            if copied:
                m.lookup_kept += 1
            else:
                m.per_position_kept[i] += 1
                m.keep(v.status)
            self._seq.append(v.x_tilde)
            m.new_tokens += 1
            if v.x_tilde in self.eos:       # the end of the text: the pass ends here
                yield replace(ev, pass_end=True)
                return
            yield ev
        row = len(d.verdicts) if d.bonus else len(d.verdicts) - 1
        nxt = d.next_token
        if block.scores is not None:
            t_top, z_top = block.scores.t_star[row], block.scores.z_t[row]
        else:
            m.host_syncs += 1
            t_top, z_top = int(block.logits[row].argmax()), float(block.logits[row].max())
        explain = dict(target_top=self._top(block.probs[row])) if self.cfg.explain else {}
        self._seq.append(nxt)
        m.new_tokens += 1
        ev = TokenEvent(len(self._seq) - 1 - len(self.prompt_ids), nxt, self._detok.push(nxt),
                        BONUS if d.bonus else CORRECTED, self._block, row, target_id=t_top,
                        target_text=self._piece(t_top), target_logit=z_top,
                        target_prob=self._prob(block, row, nxt, z_top), block_len=block.size, pass_end=True,
                        special=nxt in self.pair.special_ids, **explain)
        rollback()
        yield ev

    def _rollback(self) -> None:
        """Step 6: both caches back to the kept prefix (the newest token is fed with the next block)."""
        keep = len(self._seq) - 1
        self.pair.target_lm.crop(self.tcache, min(keep, self.pair.target_lm.length(self.tcache)))
        if self.dcache is not None:
            self.pair.draft_lm.crop(self.dcache, min(keep, self.pair.draft_lm.length(self.dcache)))

    def _speculate(self) -> Iterator[TokenEvent]:
        """One block. Copies from the context (``csd.lookup``) take the exact rule and teach the memory
        nothing: the output stays distributed as the target's."""
        t0, captures = time.perf_counter(), self._captures()
        copied = self._lookup_proposals() if self.lookup is not None else []
        block = Block(self._block, LOOKUP, copied, start=len(self._seq)) if copied else self._draft()   # 1. propose
        self._check_stop()
        block.logits = self._verify(block)                                  # 2. the target scores the block
        self._decide(block, self.exact if copied else self.rescue)          # 3. the rule decides each position
        if not copied:
            self._learn(block)                                              # 4. the memory counts divergences
        # the whole block, its transfer included; not a cost where a pass waited for others (a shared pass)
        # or a graph was captured on the way (csd.runtime.static.StaticLM.draft_block)
        if not self._shared and self._captures() == captures:
            block.wall_s = time.perf_counter() - t0
        try:
            yield from self._emit(block, self._rollback)     # 5. the events; 6. both caches back to the kept prefix
        finally:
            with self._lap("policy_s"):
                for p in self._observers:              # step 7
                    p.observe(block)
            self._block += 1

    def _lookup_proposals(self) -> list[int]:
        """Tokens to copy from the context, or [] when the draft model pays more (``csd.lookup``)."""
        with self._lap("policy_s"):
            return self.lookup.choose(self.lookup.continuation(self._seq)[:max(self._room(), 0)])

    def _autoregress(self) -> Iterator[TokenEvent]:
        logits = self._verify(Block(self._block, DRAFT, start=len(self._seq)))[-1]
        self.metrics.host_syncs += 1
        with self._lap("transfer_s"):
            top, z_top = torch.stack([logits.argmax().float(), logits.max()]).tolist()
        t_top = int(top)
        tok = t_top if self.cfg.temperature == 0 else \
            sample(torch.softmax(logits / self.cfg.temperature, -1), self.gen)
        self._seq.append(tok)
        self.metrics.new_tokens += 1
        yield TokenEvent(len(self._seq) - 1 - len(self.prompt_ids), tok, self._detok.push(tok), TARGET, self._block, 0,
                         target_id=t_top, target_text=self._piece(t_top), target_logit=z_top,
                         pass_end=True, special=tok in self.pair.special_ids)
        self._block += 1

    @torch.inference_mode()
    def _loop(self) -> Iterator[TokenEvent]:
        """Prefill, then blocks until an end token, the budget or a stop (``metrics.stopped_by``)."""
        m, budget = self.metrics, len(self.prompt_ids) + self.cfg.max_new_tokens
        self._t0 = time.perf_counter()
        m.stopped_by = ""
        stopped = STOP_CANCELLED
        try:
            self._prefill()
            ended = False
            while not ended and len(self._seq) < budget:
                self._check_stop()
                yield from self._step()
                ended = self._seq[-1] in self.eos     # every step commits at least one token
            stopped = STOP_EOS if ended else STOP_MAX
        except Cancelled:
            pass
        finally:
            self.token_ids = self._seq[len(self.prompt_ids):]
            self.pair.target_lm.release(self.tcache)
            m.wall_s = time.perf_counter() - self._t0
            m.stopped_by = stopped
