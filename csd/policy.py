"""How many tokens to draft before each verify pass: the draft-length policies behind one protocol
(docs/design.md, "gamma auto"). ``FixedGamma`` is the paper's fixed block (gamma = 6). ``AutoGamma``
drafts while one more token is expected to raise the block's tokens per ms under the cost model
(``csd.costs.CostModel``): after j drafted tokens with keep chances p_1..p_j (the draft's top-1
probability, calibrated per confidence bin), verifying now yields E_j = 1 + sum_i prod_{l<=i} p_l tokens
for C_j = j * draft_ms + verify_ms(j + 1); it drafts on iff some longer block, the run's keep rate per
position standing in for the chances not drafted yet, has a higher E_m / C_m. A position's evidence
fades (``FADE`` a block) while it is not tried, so it keeps exploring; ``online``, it plans with the
run's measured costs. A block's cost is its whole cost: C_0 = verify_ms(1) + the host's share of a pass
(a plain target step), and a block that drafts adds the drafting loop's host time; both are measured on
the machine (``csd.runtime.profile``) and, ``online``, from each block's wall time, so where a block costs more
than the plain steps it saves, ``plan`` and ``more`` answer 0 drafted tokens: plain target steps. Where the draft
lacks tokens (the prompt, which a host's draft reads only when it first drafts, or tokens copied since it last
drafted), the first drafted token of a block first reads them: that one-time cost, spread over the tokens left to
write (``owe``), weighs on each token of a block that drafts, so a run drafts only where it pays for it.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .block import DRAFT

if TYPE_CHECKING:
    from .block import Block
    from .costs import CostModel

BINS = 10            # confidence bins of the online calibration
PRIOR_WEIGHT = 2.0   # pseudo-observations of each bin's prior
POSITION_PRIOR = (0.8, 4.0)   # keep rate of a draft position before the run has seen it: (rate, weight)
FADE = 0.9           # per block in which a position is not decided, its evidence weighs this share less
WINDOW = 5           # the newest samples of each measured cost (online); their median is what the policy plans with
SEEDS = 2            # the profile's value counts as this many samples (one or two slow blocks move nothing)
OVERHEAD_FADE = 0.98    # per plain step, the drafting share not measured since fades back to the profile's...
TIMED_FADE = 0.7        # ...faster where the passes are timed apart (the CPU): a burst's share is then the host's alone


class Policy(Protocol):
    """What the decode loop asks of a draft-length policy (``csd.lookup.Lookup`` observes blocks too)."""
    max_len: int
    costs: CostModel | None    # the machine's cost model it plans with (the lookup weighs copies with it too)
    reads_confidence: bool     # ``more`` reads the draft's top-1 probability (a host sync a token; see decode)

    def start(self) -> None:
        """A new block: nothing drafted yet."""

    def owe(self, rows: int, tokens_left: int) -> None:
        """This block's first drafted token would first make the draft read ``rows`` tokens it lacks, with
        ``tokens_left`` tokens left to write in the run (called after ``start``)."""

    def more(self, j: int, confidence: float) -> bool:
        """After drafting j tokens (the last with this top-1 probability): draft another?"""

    def plan(self, room: int) -> int:
        """The block's length decided before drafting (the device's sync-free draft loop), within ``room``."""

    def observe(self, block: Block) -> None:
        """A verified block: learn from it."""


class FixedGamma:
    """The paper's policy: always draft gamma tokens."""
    costs, reads_confidence = None, False

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.max_len = gamma

    def start(self) -> None:
        pass

    def owe(self, rows: int, tokens_left: int) -> None:
        pass

    def more(self, j: int, confidence: float) -> bool:
        return j < self.gamma

    def plan(self, room: int) -> int:
        return min(self.gamma, max(room, 0))

    def observe(self, block: Block) -> None:
        pass


@dataclass
class Learned:
    """The costs a policy plans with, moved by what the runs measure (``online``); a decoder hands one
    record to each of its runs, so that a run starts from what the runs before it measured.

    A busy machine (a compile, a browser) slows a draft step, a verify pass and the host's work alike, in
    bursts. So each sample is taken relative to its own block's slowdown (the block's verify time over
    the profile's), and each cost is the median of its newest ``WINDOW`` samples, the profile's value
    counting as ``SEEDS`` of them: one or two slow blocks move nothing, a lasting change moves it within
    three, and uniform contention leaves the plan as it was (every cost scales with ``verify_scale``)."""
    verify_scale: float = 1.0       # the machine's slowdown now: measured verify time over the profile's
    draft_ms: float | None = None   # a draft token (None: the profile's)
    pass_ms: float | None = None    # the host's share of any pass (None: the profile's)
    extra_ms: float | None = None   # the host's extra share of a block that drafts (None: the profile's)
    samples: dict[str, deque] = field(default_factory=dict)   # per cost, its newest samples at quiet speed

    @classmethod
    def of(cls, costs: CostModel) -> Learned:
        return cls(1.0, costs.draft_ms, costs.pass_overhead_ms, costs.draft_overhead_ms)

    def note(self, name: str, quiet_value: float, prior: float) -> None:
        """A sample of a cost at quiet speed (its block's time divided by that block's slowdown)."""
        window = self.samples.setdefault(name, deque([prior] * SEEDS, maxlen=WINDOW))
        window.append(quiet_value)
        self._set(name)

    def fade(self, name: str, prior: float, share: float) -> None:
        """Each sample of a cost moves towards ``prior``, keeping this ``share`` of its distance."""
        if name in self.samples:
            self.samples[name] = deque((prior + share * (x - prior) for x in self.samples[name]), maxlen=WINDOW)
            self._set(name)

    def _set(self, name: str) -> None:
        value = statistics.median(self.samples[name])
        if name == "verify_scale":
            self.verify_scale = value
            for other in ("draft_ms", "pass_ms", "extra_ms"):     # every cost at the machine's speed now
                if other in self.samples:
                    self._set(other)
        else:
            setattr(self, name, value * self.verify_scale)


class AutoGamma:
    reads_confidence = True

    def __init__(self, costs: CostModel, max_len: int = 16, floor: int = 0, fade: float = FADE,
                 online: bool = False, learned: Learned | None = None):
        self.costs = self.base = costs     # base: a run alone's; costs: what the next block is planned with
        self._shares: dict[int, CostModel] = {}
        self.online = online
        self.learned = learned if learned is not None else Learned()
        for name, value in vars(Learned.of(costs)).items():     # what nothing measured yet: the profile's
            if getattr(self.learned, name) is None:
                setattr(self.learned, name, value)
        self.max_len = max_len
        self.floor = min(floor, max_len)
        self.fade = fade
        self._acc = [0.0] * BINS      # kept decisions per confidence bin
        self._n = [0.0] * BINS        # decided positions per confidence bin
        self._pos_kept = [0.0] * (max_len + 1)
        self._pos_n = [0.0] * (max_len + 1)
        self._idle = [0] * (max_len + 1)      # blocks since the position was last decided
        self._rates = [0.0] * (max_len + 1)
        self._update_rates()
        self._marginal = [costs.verify(k + 1) - costs.verify(k) for k in range(1, max_len + 2)]
        self.start()

    @property
    def verify_scale(self) -> float:
        return self.learned.verify_scale

    @property
    def draft_ms(self) -> float:
        """The draft's cost per token it plans with (moved if online; less where runs share the draft's steps)."""
        shared_cut = self.base.draft_ms - self.costs.draft_ms
        return max(self.learned.draft_ms - shared_cut, 0.0)

    def share(self, runs: int) -> None:
        """Plan the next blocks as one of ``runs`` runs that share every pass (``CostModel.shared``): the weights'
        reading is split between them and a row's arithmetic is not, so each drafted or copied token weighs more
        against a plain step than it does for a run alone, and a class decoding together drafts less."""
        if runs not in self._shares:
            self._shares[runs] = self.base.shared(runs)
        self.costs = self._shares[runs]

    def _step_ms(self, m: int) -> float:
        """What drafting the m-th token of a block adds: the step, the verify pass's longer length, and
        for the first one the drafting loop's host time."""
        return self.draft_ms + self.verify_scale * self._marginal[m - 1] + (self.learned.extra_ms if m == 1 else 0.0)

    # -- per block ---------------------------------------------------------------------------
    def start(self) -> None:
        self._prod = 1.0              # chance that every token so far is kept
        self._e = 1.0                 # expected tokens if verified now (the target's own token)
        self._c = self.verify_scale * self.costs.verify(1) + self.learned.pass_ms    # a plain target step
        self._owed = 0.0              # ms a token of a block that drafts carries of the draft's reading what it lacks

    def owe(self, rows: int, tokens_left: int) -> None:
        """Before the block's first drafted token the draft reads ``rows`` tokens it lacks. Their cost is paid once
        and then serves every token the run writes while it drafts, so each of the ``tokens_left`` tokens carries
        its share, on the blocks that draft only: ``more(0)`` weighs a plain step against drafting with this owed.
        The reading's cost is a pass of that many rows, the draft's step scaled as the target's profile scales
        from 1 token to that many (compute-bound rows, past its longest measured pass), at the run's own costs: in
        a pass shared with other runs the draft's rows are not split (``CostModel.shared``)."""
        base = self.base
        if rows <= 0 or tokens_left <= 0 or not base.verify(1) > 0:
            self._owed = 0.0
            return
        reading_ms = self.learned.draft_ms * base.verify(rows) / base.verify(1)
        self._owed = reading_ms / tokens_left

    def chance(self, confidence: float) -> float:
        b = min(BINS - 1, max(0, int(confidence * BINS)))
        centre = (b + 0.5) / BINS
        return (self._acc[b] + centre * PRIOR_WEIGHT) / (self._n[b] + PRIOR_WEIGHT)

    def position_rate(self, j: int) -> float:
        """The keep rate at draft position j (given that the tokens before it were kept)."""
        return self._rates[j]

    def _update_rates(self) -> None:
        """Each position's keep rate: its evidence, faded by the blocks since it was last tried, against
        a prior that is the rate of the position before it (the first position's: ``POSITION_PRIOR``)."""
        rate, w = POSITION_PRIOR
        for j in range(1, self.max_len + 1):
            f = self.fade ** self._idle[j]
            rate = (f * self._pos_kept[j] + rate * w) / (f * self._pos_n[j] + w)
            self._rates[j] = rate

    def more(self, j: int, confidence: float) -> bool:
        """After drafting j tokens, the last with top-1 probability ``confidence``: is drafting more
        expected to pay? Looks ahead to every length up to ``max_len`` (verify costs need not be convex)."""
        if j >= self.max_len:
            return False
        if j > 0:
            self._prod *= self.chance(confidence)
            self._e += self._prod
            self._c += self._step_ms(j)
        return j < self.floor or any(e * self._c > self._e * c for _m, e, c in self._ahead(j, self.max_len))

    def plan(self, room: int) -> int:
        """The block length with the most expected tokens per ms from the position rates alone (the GPU's
        sync-free draft loop reads no confidences), at least ``floor``."""
        self.start()
        room = min(self.max_len, max(room, 0))
        best, best_rate = 0, self._e / self._c
        for m, e, c in self._ahead(0, room):
            if e / c > best_rate:
                best, best_rate = m, e / c
        return min(max(best, self.floor), room)

    def _ahead(self, j: int, end: int):
        """(m, expected tokens, cost) of the blocks of m = j + 1..end tokens, the position rates standing in
        for the chances of the tokens after the j drafted. Before the first drafted token (j = 0) each expected
        token also carries its share of what the draft owes (``owe``); once drafting, that is paid."""
        e, c, prod = self._e, self._c, self._prod
        owed = self._owed if j == 0 else 0.0
        for m in range(j, end):
            prod *= self.position_rate(m + 1)
            e += prod
            c += self._step_ms(m + 1)
            yield m + 1, e, c + e * owed

    # -- after the verify pass -------------------------------------------------------------------
    def observe(self, block: Block) -> None:
        """A verified block of the draft model (copied blocks teach nothing about the draft)."""
        if block.source == DRAFT:
            kept = block.kept
            self.learn(block.confidences[:len(kept)], kept)
        if self.online:
            self.measured(block)

    def measured(self, block: Block) -> None:
        """Move the planning costs towards a block's measured times (``Learned``): the passes' where the CPU
        times them apart, then the host's share, what the block's wall time leaves over its passes (on a GPU
        the wall time is the one true figure: the transfer waits for the device). A run's first block is not
        counted: its wall time may include the prompt's passes."""
        c, costs = self.learned, self.costs
        slow = 1.0                  # this block's slowdown: its verify pass over the profile's
        if block.verify_s is not None and block.pass_tokens:
            slow = max(1000 * block.verify_s / costs.verify(block.pass_tokens), 1e-3)
            c.note("verify_scale", slow, 1.0)
        drafted = block.source == DRAFT and block.size
        if drafted and block.draft_s is not None and block.draft_steps:
            # the 1-token steps only: a step that also read the tokens copied since the draft last drafted costs
            # more than a token (Block.catch_up_s), and taken for one it made the draft look 2-8x dearer
            c.note("draft_ms", 1000 * block.draft_s / block.draft_steps / slow, costs.draft_ms)
        if block.wall_s is None or block.index == 0 or not block.pass_tokens:
            return
        if block.verify_s is not None:
            verify_ms = 1000 * block.verify_s
        else:                       # not timed apart: what the profile says, at this run's level
            verify_ms = self.verify_scale * costs.verify(block.pass_tokens)
        draft_ms = 0.0
        if drafted:
            draft_ms = 1000 * block.draft_s if block.draft_s is not None else self.draft_ms * block.size
        rest = max(1000 * block.wall_s - verify_ms - draft_ms, 0.0) / slow
        if not block.size:
            c.note("pass_ms", rest, costs.pass_overhead_ms)
            # not drafting, the drafting share is not measured: it fades back to the profile's, so that a
            # burst (a capture, a busy moment) does not stop drafting for good
            c.fade("extra_ms", costs.draft_overhead_ms, OVERHEAD_FADE if block.verify_s is None else TIMED_FADE)
        elif drafted:
            c.note("extra_ms", max(rest - c.pass_ms / self.verify_scale, 0.0), costs.draft_overhead_ms)

    def learn(self, confidences: list[float], kept: list[bool]) -> None:
        """Whether each decided position was kept, and the draft's confidence where it was read; the
        positions not decided idle one more block."""
        for j, k in enumerate(kept, 1):
            if j <= len(confidences):
                b = min(BINS - 1, max(0, int(confidences[j - 1] * BINS)))
                self._n[b] += 1
                self._acc[b] += k
        for j in range(1, self.max_len + 1):
            if j <= len(kept):
                self._pos_n[j] += 1
                self._pos_kept[j] += kept[j - 1]
                self._idle[j] = 0
            else:
                self._idle[j] += 1
        self._update_rates()
