"""One decode loop for AR, SD, CSD, the ablations and the rivals (Calibrated Speculative Decoding,
arXiv 2604.13634), yielding one ``TokenEvent`` per token decision. Each model's KV cache holds a prefix
of the committed sequence; one target pass per block. The steps (``Run._speculate``) fill in the block's
record (``csd.block.Block``): 1. propose (``csd.propose``: the draft, ``csd.policy`` saying how many, or
copies from the context; AR proposes nothing); 2. the target scores the block; 3. decide each position
(``csd.rule``); 4. the memory learns the divergences; 5. emit the events (``csd.emit``); 6. crop both
caches to the kept prefix; 7. the policies learn from the block. The models are the runtime's, seen
through ``csd.protocols``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from .block import Block
from .config import GAMMA_AUTO, CSDConfig
from .costs import CostModel
from .emit import EventBuilder
from .events import STOP_CANCELLED, STOP_EOS, STOP_MAX, RunMetrics, TokenEvent
from .lookup import Lookup
from .memory import CorrectionMemory, default_memory
from .policy import AutoGamma, FixedGamma, Learned, Policy
from .propose import DeviceDraft, HostDraft, LookupCopy, Proposer
from .protocols import Pair, ids_tensor
from .rule import Rescue, decide
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
    """Runs generations on one loaded pair. ``costs``: the cost model for ``gamma="auto"``, or a function
    that gives it on first need (``csd.runtime.profile.decoder`` hands this machine's measured one)."""

    def __init__(self, pair: Pair, costs: CostModel | Callable[[], CostModel] | None = None,
                 online_costs: bool = True, prompt_rows=None):
        self.pair, self._costs = pair, costs
        self.online_costs = online_costs          # gamma auto plans with the runs' measured costs
        # the app's runs share the target's rows of prompts that begin alike (csd.runtime.prompt_rows.PromptRows:
        # takes_part(lm), fill and done; the command line and the benchmark pass none)
        self.prompt_rows = prompt_rows
        self.learned = Learned()                  # what this decoder's runs measured, handed to the next run
        self._default_memory: CorrectionMemory | None = None

    @property
    def has_costs(self) -> bool:
        """A cost model was given or has been measured (a factory not yet called is none)."""
        return self._costs is not None and not callable(self._costs)

    @property
    def cost_source(self):
        """What gamma auto plans with, unmeasured: a ``CostModel``, the callable that measures it on first need, or
        None (another decoder on the same pair and scales can share it without measuring anything now)."""
        return self._costs

    @property
    def costs(self) -> CostModel:
        if self._costs is None:
            raise ValueError("gamma auto needs a cost model: Decoder(pair, costs=...) "
                             "(csd.runtime.profile.decoder measures this machine's)")
        if callable(self._costs):
            self._costs = self._costs()
        return self._costs

    def default_memory(self) -> CorrectionMemory:
        """A fresh copy of the pair's calibrated memory (the shipped one for the embedded pair)."""
        if self._default_memory is None:
            self._default_memory = default_memory(self.pair)
        return self._default_memory.copy()

    def run(self, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory | None = None,
            should_stop: Callable[[], bool] | None = None, owner: object = None) -> Run:
        """A run to iterate. ``memory``: what CSD reads and updates (default: a copy of the pair's
        calibrated one). ``should_stop``: polled between prefill chunks, drafting and verifying. ``owner``: who
        runs it (the app's session), where the decoder shares prompts' rows: a run copies none of its owner's (by
        default each run is an owner of its own)."""
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
        return Run(self.pair, list(prompt_ids), cfg, memory, policy, should_stop, self.prompt_rows, owner)


def check_room(pair: Pair, prompt_tokens: int, cfg: CSDConfig) -> None:
    """Refuse a run that a fixed-size KV cache of the pair could not hold (``Model.check_room``; eager
    caches grow). A wrapped model (the benchmark's scripted draft) is asked through its ``inner`` one."""
    longest = max(cfg.gamma_max if cfg.gamma == GAMMA_AUTO else cfg.gamma, cfg.lookup) if cfg.uses_draft else 0
    need = prompt_tokens + cfg.max_new_tokens + longest + 1      # and the last block's proposals past the end
    for role, lm in (("target", pair.target_lm), ("draft", pair.draft_lm if cfg.uses_draft else None)):
        room = getattr(getattr(lm, "inner", lm), "check_room", None)
        if room is not None:
            room(need, f"a run of a {prompt_tokens}-token prompt, max_new_tokens {cfg.max_new_tokens} and "
                       f"blocks of up to {longest} tokens ({role})")


def proposers(pair: Pair, cfg: CSDConfig, policy: Policy | None, cache, metrics: RunMetrics,
              gen: torch.Generator | None, catch_up: Callable[[], float] | None = None) -> list[Proposer]:
    """Who proposes a block, in order: copies from the context where they pay, then the draft, on the
    device (greedy with a fixed gamma, or gamma auto where reading each confidence would wait for the
    device) or on the host (``catch_up``: how the host's draft reads what its cache lacks before it drafts).
    AR: no one (its blocks are empty)."""
    if policy is None:
        return []
    lm, copies = pair.draft_lm, []
    if cfg.lookup:
        copies = [LookupCopy(Lookup(cfg.lookup, policy.costs, cfg.lookup_ngram), metrics)]
    if cfg.temperature == 0 and not cfg.explain and (
            not policy.reads_confidence or lm.device.type in SYNC_FREE_AUTO_DEVICES):
        return copies + [DeviceDraft(lm, cache, policy, metrics, pair.target_lm.device)]
    vocab = pair.target_lm.vocab_size if cfg.temperature > 0 else 0
    return copies + [HostDraft(lm, cache, policy, metrics, frozenset(pair.eos_ids), cfg.temperature, gen, vocab,
                               read_confidence=policy.reads_confidence or cfg.explain, explain=cfg.explain,
                               catch_up=catch_up)]


class Run:
    """Iterate to get the events; afterwards ``token_ids``, ``text`` and ``metrics`` hold the
    result. Stopping the iteration early (``close()``) cancels the run and keeps what it made."""

    def __init__(self, pair: Pair, prompt_ids: list[int], cfg: CSDConfig, memory: CorrectionMemory,
                 policy: Policy | None, should_stop: Callable[[], bool] | None, prompt_rows=None,
                 owner: object = None):
        self.pair, self.cfg, self.memory, self.policy = pair, cfg, memory, policy
        self.prompt_rows = prompt_rows if prompt_rows is not None and prompt_rows.takes_part(pair.target_lm) else None
        self.owner = object() if owner is None else owner      # whose prompt rows this run never copies
        self.prompt_ids = prompt_ids
        self.should_stop = should_stop or (lambda: False)
        self.token_ids: list[int] = []
        self.events: list[TokenEvent] = []
        width = policy.max_len if policy is not None else 0
        self.metrics = RunMetrics(per_position_drafted=[0] * width, per_position_kept=[0] * width)
        self.rescue = cfg.rule(pair.special_ids)     # CSD's modules, or a rival's relaxed rule (csd.rule)
        self.exact = Rescue.of(False, False, cfg.lam, cfg.tau, pair.special_ids)   # the rule for copied tokens
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
        self.proposers = proposers(pair, cfg, policy, self.dcache, self.metrics, self.gen, self._draft_catch_up)
        # the host's draft reads the prompt when it first drafts (HostDraft.catch_up), not before the first block:
        # where the policy never drafts (copies, or blocks that do not pay) the reading is saved whole
        self._draft_reads_late = any(isinstance(p, HostDraft) for p in self.proposers)
        copies = [p.lookup for p in self.proposers if isinstance(p, LookupCopy)]
        self._observers = [p for p in (policy, *copies) if p is not None]   # they learn from every block
        self._emit = EventBuilder(pair, cfg, self.metrics, len(prompt_ids))
        self._step = self._speculate if policy is not None else self._autoregress
        self._shared = getattr(pair.target_lm, "shares_passes", False)     # csd.runtime.batch: passes with other runs
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

    def _check_stop(self) -> None:
        if self.should_stop():
            raise Cancelled

    def _captures(self) -> int:
        return sum(getattr(lm, "captures", 0) for lm in (self.pair.target_lm, self.pair.draft_lm) if lm is not None)

    def _prefill(self) -> None:
        """Feed all prompt tokens but the last (fed with the first block) to the target, in chunks, and to the
        draft where it drafts on the device. The host's draft leaves its reading of the prompt to its first
        block that drafts, if one ever does (``_draft_catch_up``): where drafting does not pay (copies from the
        context, a CPU whose verify rows are dear, many runs sharing passes: ``csd.costs.CostModel.shared``) a
        prompt read into a draft that never drafts is wasted work."""
        body = self._seq[:-1]
        with self.metrics.lap("prefill_s"):
            self._read_target(body)
            if self.dcache is not None and not self._draft_reads_late:
                self._read(self.pair.draft_lm, self.dcache, body, 0)

    def _draft_catch_up(self) -> float:
        """The first time the draft drafts, it reads what it has not: the prompt (which counts as reading the
        prompt, ``prefill_s``) and the answer so far but its newest token (the draft's time, ``draft_s``). Returns
        the seconds; the block's timing leaves them out (``Block.catch_up_s``), so that they never read as the cost
        of a drafted token. Later, the tokens of the blocks since the draft last drafted go with its first step,
        one pass for them all."""
        lm, cache = self.pair.draft_lm, self.dcache
        have, prompt_end, end = lm.length(cache), len(self.prompt_ids) - 1, len(self._seq) - 1
        if have >= prompt_end:
            return 0.0
        t0 = time.perf_counter()
        with self.metrics.lap("prefill_s"):
            self._read(lm, cache, self._seq[:prompt_end], have)
        with self.metrics.lap("draft_s"):
            for a in range(prompt_end, end, PREFILL_CHUNK):
                self._check_stop()
                lm.forward(cache, self._seq[a:min(a + PREFILL_CHUNK, end)], 1)
        return time.perf_counter() - t0

    def _read_target(self, body: list[int]) -> None:
        """The target reads the prompt, copying the rows another run of the app read already
        (``csd.runtime.prompt_rows``)."""
        lm, shared = self.pair.target_lm, self.prompt_rows
        if shared is None:
            self._read(lm, self.tcache, body, 0)
            return
        start = shared.fill(lm, self.tcache, body, self._check_stop, self.owner)
        self.metrics.prompt_rows_copied = start
        read = False
        try:
            self._read(lm, self.tcache, body, start)
            read = True
        finally:
            shared.done(lm, self.tcache, body, read, self.owner)

    def _read(self, lm, cache, body: list[int], start: int) -> None:
        """``lm`` reads ``body[start:]`` in chunks, a stop request seen between them."""
        for a, b in prefill_spans(len(body) - start):
            self._check_stop()
            lm.forward(cache, body[start + a:start + b], 1)

    def _share(self) -> None:
        """Plan the next block as one of the runs sharing the passes now (``csd.costs.CostModel.shared``)."""
        runs = self.pair.target_lm.runs_sharing(self.tcache)
        for planner in self._observers:
            if hasattr(planner, "share"):
                planner.share(runs)

    def _speculate(self) -> Iterator[TokenEvent]:
        """One block. Copies from the context take the exact rule and teach the memory nothing: the output
        stays distributed as the target's."""
        t0, captures = time.perf_counter(), self._captures()
        if self._shared:
            self._share()
        block = self._propose()                                             # 1. propose
        self._check_stop()
        block.logits = self._verify(block)                                  # 2. the target scores the block
        self._decide(block, self.exact if block.copied else self.rescue)    # 3. the rule decides each position
        if not block.copied:
            self._learn(block)                                              # 4. the memory counts divergences
        # the whole block, its transfer included; not a cost where a pass waited for others (a shared pass)
        # or a graph was captured on the way (csd.runtime.static.StaticLM.draft_block)
        if not self._shared and self._captures() == captures:
            block.wall_s = time.perf_counter() - t0 - block.catch_up_s
        try:
            ended = yield from self._emit.drafts(block, self._seq)         # 5. the decided draft positions
            if not ended:
                last = self._emit.target_token(block, self._seq)            #    and the target's own token
                self._rollback()                                            # 6. both caches to the kept prefix
                yield last
        finally:
            with self.metrics.lap("policy_s"):
                for p in self._observers:                                   # 7. the policies learn
                    p.observe(block)
            self._block += 1

    def _propose(self) -> Block:
        """Step 1: the first proposer that proposes fills the block, up to the budget left (less the
        target's own token)."""
        block = Block(self._block, start=len(self._seq))
        room = self.cfg.max_new_tokens - (len(self._seq) - len(self.prompt_ids)) - 1
        next((p for p in self.proposers if p.propose(block, self._seq, room)), None)
        return block

    def _verify(self, block: Block) -> torch.Tensor:
        """Step 2: one target pass over what its cache lacks plus the block: (block.size + 1, V)."""
        lm, drafts = self.pair.target_lm, block.proposed
        with self.metrics.lap("verify_s") as lap:
            pending = self._seq[lm.length(self.tcache):]
            if torch.is_tensor(drafts):
                ids = torch.cat([ids_tensor(pending, drafts.device), drafts])
            else:
                ids = pending + drafts
            logits = lm.forward(self.tcache, ids, len(drafts) + 1)
        self.metrics.target_forwards += 1
        # timed on the CPU only (elsewhere: launch times, not costs), and not where passes are shared with other runs
        # (csd.runtime.batch): there a pass's time holds their rows and the wait for them, not this run's cost
        block.pass_tokens, timed = len(ids), lm.device.type == "cpu" and not self._shared
        block.verify_s, block.draft_s = (lap.s, block.draft_s) if timed else (None, None)
        return logits

    def _decide(self, block: Block, rule: Rescue) -> None:
        """Step 3: ``rule`` on the target's logits. Greedy: one host transfer for the block, whose
        proposals become a host list cut after an end token; sampling a copied block, its proposals
        are point masses."""
        cfg, tl = self.cfg, block.logits
        if block.copied and cfg.temperature > 0:
            block.q_rows = list(point_mass(block.proposed, tl))
        self.metrics.host_syncs += 1
        if cfg.temperature == 0:
            with self.metrics.lap("transfer_s"):
                drafts, scores = score_block(block.proposed, tl, rule.scores)   # the argmax work SD needs anyway
            cut = next((i + 1 for i, x in enumerate(drafts) if x in self.eos), len(drafts))
            block.proposed, block.scores = drafts[:cut], scores.head(cut) if cut < len(drafts) else scores
        with self.metrics.lap("bookkeeping_s"):
            if cfg.temperature == 0:
                block.decision = decide(block.proposed, block.scores, self.memory.count, rule)
                block.probs = torch.softmax(tl.float(), -1) if cfg.explain else None
            else:
                block.probs = p = torch.softmax(tl / cfg.temperature, -1)
                q = torch.stack(block.q_rows).to(p.device) if block.q_rows else p[:0]
                block.decision = verify_sampling(block.proposed, q, p, tl, self.memory.count, rule, self.gen)

    def _learn(self, block: Block) -> None:
        """Step 4: the Online Correction Memory counts the block's divergences (x~, t*)."""
        with self.metrics.lap("bookkeeping_s"):
            for x_t, t_t in block.decision.observed:
                self.memory.observe(x_t, t_t)

    def _rollback(self) -> None:
        """Step 6: both caches back to the kept prefix (the newest token is fed with the next block)."""
        keep = len(self._seq) - 1
        for lm, cache in ((self.pair.target_lm, self.tcache), (self.pair.draft_lm, self.dcache)):
            if cache is not None:
                lm.crop(cache, min(keep, lm.length(cache)))

    def _autoregress(self) -> Iterator[TokenEvent]:
        """One target pass, its top-1 (or a draw at the run's temperature) the next token."""
        logits = self._verify(Block(self._block, start=len(self._seq)))[-1]
        self.metrics.host_syncs += 1
        with self.metrics.lap("transfer_s"):
            top, z_top = torch.stack([logits.argmax().float(), logits.max()]).tolist()
        if self.cfg.temperature == 0:
            tok = int(top)
        else:
            tok = sample(torch.softmax(logits / self.cfg.temperature, -1), self.gen)
        yield self._emit.target_alone(self._block, tok, int(top), z_top, self._seq)
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
