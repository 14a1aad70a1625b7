"""The decision rule of (Calibrated) Speculative Decoding, written once (arXiv 2604.13634).

At each draft position i, with the draft's proposal x~_i and the target's top-1 t*_i (PAPER.md,
"Decision at each draft position"):
  1. x~_i == t*_i                                               -> accepted
  2. count(x~_i -> t*_i) >= lam and z(x~_i) - z(t*_i) >= log tau -> rescued, go on with i+1
  3. otherwise                                                  -> rejected, emit t*_i, stop
Every divergence (2, 3) is counted after its own decision, so it never vouches for itself;
within one block a repeated pattern sees the earlier occurrence's increment. A pattern with a
special token on either side (end of turn, chat template) is never rescued and never counted:
rescuing one could end an answer where the target goes on, or run past the target's stop.
SD is the same rule with neither module; the ablations switch one module off.

Pure Python (no torch, no I/O): ``rescues`` works on one position and on numpy arrays alike, so
the decode loop, the store's what-if over 100k logged events, the recolouring and the figures
all call the same function. ``csd.verify`` turns the target's logits into the inputs here.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from .events import (
    ACCEPTED,
    REJECTED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MATCH,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_RESCUE,
    RULE_SAMPLED,
    RULE_SPECIAL,
)

CountFn = Callable[[int, int], int]


def log_tau(tau: float) -> float:
    """The gate's threshold on the logit gap; tau <= 0 lets every gap through."""
    return math.log(tau) if tau > 0 else -math.inf


def rescues(count, gap, lam: float, log_tau_: float, use_ocm: bool = True, use_scg: bool = True):
    """Steps 2-3 on a divergence: rescued iff the memory knows the pattern (count >= lam) and the
    gate passes (gap >= log tau), for the modules that are on. On scalars it gives a bool (an
    unknown count or gap, None, is never rescued); on numpy arrays an elementwise mask that
    broadcasts over thresholds too (a what-if grid: counts (N,), lam (L, 1, 1), log tau (T, 1));
    NaN compares False, so an unlogged count or gap is never rescued either."""
    if np.ndim(count) == 0 and np.ndim(gap) == 0:
        if (use_ocm and count is None) or (use_scg and gap is None) or not (use_ocm or use_scg):
            return False
        return bool((not use_ocm or count >= lam) and (not use_scg or gap >= log_tau_))
    count, gap = np.asarray(count, dtype=float), np.asarray(gap, dtype=float)
    shape = np.broadcast_shapes(count.shape, gap.shape, np.shape(lam), np.shape(log_tau_))
    ok = np.full(shape, use_ocm or use_scg)
    if use_ocm:
        ok &= count >= lam
    if use_scg:
        ok &= gap >= log_tau_
    return ok


@dataclass(frozen=True)
class Rescue:
    """Which CSD modules are on, their thresholds, and the tokens that are never rescued."""
    use_ocm: bool = True
    use_scg: bool = True
    lam: float = 6
    log_tau: float = math.log(0.01)
    special: frozenset[int] = frozenset()

    @property
    def enabled(self) -> bool:
        return self.use_ocm or self.use_scg

    @classmethod
    def of(cls, use_ocm: bool, use_scg: bool, lam: float, tau: float, special: Collection[int] = ()) -> Rescue:
        return cls(use_ocm, use_scg, lam, log_tau(tau), frozenset(special))


NO_RESCUE = Rescue(use_ocm=False, use_scg=False)


@dataclass(frozen=True)
class Verdict:
    status: str        # ACCEPTED, RESCUED or REJECTED
    rule: str          # RULE_* that decided
    x_tilde: int
    t_star: int
    z_x: float         # target logit of the draft token
    z_t: float         # target logit of its top-1
    count: int | None  # memory count of (x~ -> t*) at decision time (0 for a match, None when never looked up)

    @property
    def gap(self) -> float:
        return self.z_x - self.z_t


@dataclass(frozen=True)
class Decision:
    verdicts: tuple[Verdict, ...]        # one per decided draft position
    n_kept: int                          # draft tokens kept (accepted + rescued)
    next_token: int                      # the target's correction, or the bonus token
    bonus: bool                          # True when every draft token was kept
    observed: tuple[tuple[int, int], ...]  # divergences to add to the memory, in order


@dataclass(frozen=True)
class BlockScores:
    """What greedy SD itself computes from the target's logits: t* and the two logits."""
    t_star: list[int]   # (g + 1,) the target's top-1 at each position, the last one the bonus
    z_t: list[float]    # (g + 1,) its logit
    z_x: list[float]    # (g,) the target logit of each draft token
    lse: list[float] = ()   # (g + 1,) log of each row's softmax normaliser (target probabilities without a sync)

    def head(self, g: int) -> BlockScores:
        """The scores of the first g draft positions (and the row after them)."""
        return BlockScores(self.t_star[:g + 1], self.z_t[:g + 1], self.z_x[:g], self.lse[:g + 1])


def rescue_decision(x: int, t: int, z_x: float, z_t: float, count: int | None, rescue: Rescue) -> tuple[bool, str]:
    """Whether a divergent draft token is rescued, and the rule that decided (steps 2-3)."""
    if not rescue.enabled:
        return False, RULE_NO_RESCUE
    if x in rescue.special or t in rescue.special:
        return False, RULE_SPECIAL
    if rescues(count, z_x - z_t, rescue.lam, rescue.log_tau, rescue.use_ocm, rescue.use_scg):
        return True, RULE_RESCUE
    return False, (RULE_MEMORY_RARE if rescue.use_ocm and not count >= rescue.lam else RULE_GAP_LOW)


def decide(x_tilde: Sequence[int], s: BlockScores, count: CountFn, rescue: Rescue = NO_RESCUE,
           accept: Sequence[bool] | None = None) -> Decision:
    """Steps 1-4 over one block. ``accept`` is None for greedy verification (a match is x~ == t*)
    or the per-position outcomes of rejection sampling."""
    verdicts, observed = [], []
    seen: dict[tuple[int, int], int] = {}  # divergences earlier in this block, not yet in memory
    for i, x in enumerate(x_tilde):
        t = s.t_star[i]
        if (x == t) if accept is None else accept[i]:
            verdicts.append(Verdict(ACCEPTED, RULE_MATCH if x == t else RULE_SAMPLED, x, t, s.z_x[i], s.z_t[i], 0))
            continue
        if x == t:  # sampling rejected the target's own top-1: nothing to rescue, no pattern
            verdicts.append(Verdict(REJECTED, RULE_NO_RESCUE, x, t, s.z_x[i], s.z_t[i], 0))
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
        special = x in rescue.special or t in rescue.special
        c = None if special else count(x, t) + seen.get((x, t), 0)
        ok, why = rescue_decision(x, t, s.z_x[i], s.z_t[i], c, rescue)
        verdicts.append(Verdict(RESCUED if ok else REJECTED, why, x, t, s.z_x[i], s.z_t[i], c))
        if not special:
            observed.append((x, t))            # counted after its own decision
            seen[(x, t)] = seen.get((x, t), 0) + 1
        if not ok:
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
    return Decision(tuple(verdicts), len(x_tilde), s.t_star[len(x_tilde)], True, tuple(observed))


def top_share(counts: Sequence[int] | Collection[int], fraction: float = 0.2) -> float:
    """Share of all divergences covered by the top ``fraction`` of patterns (the paper's Pareto
    figure: about 69% at 0.2). ``counts``: one count per pattern, in any order."""
    values = sorted((c for c in counts if c > 0), reverse=True)
    if not values:
        return 0.0
    k = max(1, round(len(values) * fraction))
    return sum(values[:k]) / sum(values)
