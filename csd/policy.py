"""How many tokens to draft before each verify pass: the draft-length policies behind one protocol.

``FixedGamma`` is the paper's fixed block (gamma = 6). ``AutoGamma`` drafts while one more token is
expected to raise the tokens per second of the block, under the machine's measured cost model
(``csd.costs.CostModel``: the draft's time per token, the target's time for a pass of k tokens)
and what this run has seen so far:

- the chance that draft token j is kept given that the tokens before it were (accepted or
  rescued), estimated from the draft's own top-1 probability, calibrated online per confidence
  bin (a Beta prior centred on the bin, updated with every decided position of the run);
- before drafting token j + 1 its chance is unknown: the run's keep rate at position j + 1 stands in.

After j drafted tokens with chances p_1..p_j, verifying now yields E_j = 1 + sum_i prod_{l<=i} p_l
tokens for C_j = j * draft_ms + verify_ms(j + 1); one more token is drafted iff some longer block,
with the position rates standing in for the chances of the tokens not drafted yet, has a higher
E_m / C_m than E_j / C_j. A draft that turns unsure stops the block early; a cheap verify
pass and a confident draft make it long. On a GPU, where reading a confidence waits for the
device, ``plan`` fixes the block's length before drafting from the position rates alone.

It keeps exploring. A keep rate is learned only where the policy drafts, so a run whose first blocks
were rejected would otherwise stop drafting and never learn that the draft does better later. So the
evidence of a position counts less while the position is not tried: after k blocks without a
decision there, its observations weigh ``FADE ** k`` against the prior's fixed weight, and the
estimate drifts back towards the prior until the policy tries again (the evidence itself is kept:
one more failure makes it as sure as before). A few early rejections are retried within a few
blocks; a draft that keeps failing is retried more and more rarely (about every 20 blocks after
30 failures), one token at a time; where the cost model says drafting cannot pay even at the
prior's rate, it is never tried. ``floor`` sets the
fewest tokens a block drafts (the app's "show speculation" mode: a demo that never collapses to AR).

It plans with the run's own costs. The cost model is the machine's profile, measured once and
cached; a machine that is busier than when it was profiled (another process, a second user) makes
the draft and the longer verify passes dearer than the profile says, and a policy that believed it
drafted blocks too long (measured on a shared 2-core EPYC: 69 ms a token where the profile predicted
32). With ``online`` (the decode loop's default on the CPU, where a block's times are its costs),
every verified block moves the draft's cost per token and the ratio of measured to profiled verify
time towards what it measured (an exponential average, ``COST_WEIGHT`` per block), and the plan
uses those: the profile's shape (how a pass's time grows with its tokens), the run's level.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .block import DRAFT

if TYPE_CHECKING:
    from .block import Block
    from .costs import CostModel

BINS = 10            # confidence bins of the online calibration
PRIOR_WEIGHT = 2.0   # pseudo-observations of each bin's prior
POSITION_PRIOR = (0.8, 4.0)   # keep rate of a draft position before the run has seen it: (rate, weight)
FADE = 0.9           # per block in which a position is not decided, its evidence weighs this share less
COST_WEIGHT = 0.2    # weight of the newest block in the run's own cost estimates (online)


class Policy(Protocol):
    """What the decode loop asks of a draft-length policy (``csd.lookup.Lookup`` observes blocks too)."""
    max_len: int
    costs: CostModel | None    # the machine's cost model it plans with (the lookup weighs copies with it too)
    reads_confidence: bool     # ``more`` reads the draft's top-1 probability (a host sync a token; see decode)

    def start(self) -> None:
        """A new block: nothing drafted yet."""

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

    def more(self, j: int, confidence: float) -> bool:
        return j < self.gamma

    def plan(self, room: int) -> int:
        return min(self.gamma, max(room, 0))

    def observe(self, block: Block) -> None:
        pass


class AutoGamma:
    reads_confidence = True

    def __init__(self, costs: CostModel, max_len: int = 16, floor: int = 0, fade: float = FADE,
                 online: bool = False):
        self.costs = costs
        self.online = online
        self.verify_scale = 1.0       # measured verify time over the profile's (online)
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
        self._d = costs.draft_ms
        self.start()

    # -- per block ---------------------------------------------------------------------------
    def start(self) -> None:
        self._prod = 1.0              # chance that every token so far is kept
        self._e = 1.0                 # expected tokens if verified now (the target's own token)
        self._c = self.verify_scale * self.costs.verify(1)

    def chance(self, confidence: float) -> float:
        b = min(BINS - 1, max(0, int(confidence * BINS)))
        centre = (b + 0.5) / BINS
        return (self._acc[b] + centre * PRIOR_WEIGHT) / (self._n[b] + PRIOR_WEIGHT)

    def position_rate(self, j: int) -> float:
        """The keep rate at draft position j (given that the tokens before it were kept)."""
        return self._rates[j]

    def _update_rates(self) -> None:
        """Each position's keep rate: its evidence, faded by the blocks since it was last tried, against
        a prior that is the rate of the position before it (the first position's: ``POSITION_PRIOR``).
        So a position never tried inherits what the run has seen closer to the block's start: a run
        whose drafts are kept 95% of the time learns to try long blocks, one whose first token fails
        learns not to draft."""
        rate, w = POSITION_PRIOR
        for j in range(1, self.max_len + 1):
            f = self.fade ** self._idle[j]
            rate = (f * self._pos_kept[j] + rate * w) / (f * self._pos_n[j] + w)
            self._rates[j] = rate

    def more(self, j: int, confidence: float) -> bool:
        """After drafting j >= 1 tokens, the last with top-1 probability ``confidence``
        (j = 0 asks before the first): is drafting more expected to pay? Looks ahead to every
        block length up to ``max_len`` (verify costs need not be convex: on some CPUs a 2-token
        pass costs twice a 1-token pass while a 7-token pass costs three times)."""
        if j >= self.max_len:
            return False
        if j > 0:
            self._prod *= self.chance(confidence)
            self._e += self._prod
            self._c += self._d + self.verify_scale * self._marginal[j - 1]
        if j < self.floor:
            return True
        e, c, prod = self._e, self._c, self._prod
        for m in range(j, self.max_len):
            prod *= self.position_rate(m + 1)
            e += prod
            c += self._d + self.verify_scale * self._marginal[m]
            if e * self._c > self._e * c:
                return True
        return False

    def plan(self, room: int) -> int:
        """The block length decided before drafting, from the run's keep rate per position alone: the
        length with the most expected tokens per ms (0: verify without drafting), at least ``floor``.
        For the GPU's sync-free draft loop, which cannot read the draft's confidences without waiting
        for the device after every token."""
        self.start()
        room = min(self.max_len, max(room, 0))
        e, c, prod = self._e, self._c, self._prod
        best, best_rate = 0, e / c
        for m in range(room):
            prod *= self.position_rate(m + 1)
            e += prod
            c += self._d + self.verify_scale * self._marginal[m]
            if e / c > best_rate:
                best, best_rate = m + 1, e / c
        return min(max(best, self.floor), room)

    # -- after the verify pass -------------------------------------------------------------------
    def observe(self, block: Block) -> None:
        """A verified block of the draft model (copied blocks teach nothing about the draft)."""
        if block.source == DRAFT:
            kept = block.kept
            self.learn(block.confidences[:len(kept)], kept)
        if self.online:
            self.measured(block)

    @property
    def draft_ms(self) -> float:
        """The draft's cost per token the policy plans with (the profile's, moved by the run's if online)."""
        return self._d

    def measured(self, block: Block) -> None:
        """Move the planning costs towards a block's measured times (where they were measured)."""
        if block.verify_s is not None and block.pass_tokens:
            ratio = 1000 * block.verify_s / self.costs.verify(block.pass_tokens)
            self.verify_scale += COST_WEIGHT * (ratio - self.verify_scale)
        if block.source == DRAFT and block.draft_s is not None and block.size:
            self._d += COST_WEIGHT * (1000 * block.draft_s / block.size - self._d)

    def learn(self, confidences: list[float], kept: list[bool]) -> None:
        """The decided positions of a block: whether each was kept, and the draft's confidence in
        it where it was read (none from the sync-free draft loop: then the positions alone learn).
        The positions not decided in this block idle one more block."""
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
