"""The decision rule of (Calibrated) Speculative Decoding, written once (arXiv 2604.13634).

At each draft position i, with the draft's proposal x~_i and the target's top-1 t*_i (PAPER.md,
"Decision at each draft position"):
  1. x~_i == t*_i                                               -> accepted
  2. count(x~_i -> t*_i) >= lam and z(x~_i) - z(t*_i) >= log tau -> rescued, go on with i+1
  3. otherwise                                                  -> rejected, emit t*_i, stop
Every divergence (2, 3) is counted after its own decision, so it never vouches for itself;
within one block a repeated pattern sees the earlier occurrence's increment. A pattern with a
special token on either side (end of turn, chat template) is never rescued and never counted.
SD is the same rule with neither module; the ablations switch one module off.

The rivals (``Relax``: lossy SD, TensorRT-LLM's top-k, vLLM/Medusa's typical acceptance, FLy;
docs/rivals.md) replace steps 2-3 with their own test and keep the walk; a kept divergence is
``relaxed``. Each is one elementwise function of logged quantities, so the what-if replays it on
stored events exactly as the loop decided.

Pure Python (no torch, no I/O): ``rescues`` works on one position and on numpy arrays alike, so
the decode loop, the store's what-if, the recolouring and the figures call the same function.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .events import (
    ACCEPTED,
    REJECTED,
    RELAXED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MATCH,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_NOT_RELAXED,
    RULE_RELAXED,
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


# -- the rivals: relaxed acceptance rules on the same verify pass (docs/rivals.md) -------------------
LOSSY, TOPK, TYPICAL, FLY = "lossy", "topk", "typical", "fly"
RIVALS = (LOSSY, TOPK, TYPICAL, FLY)
# what ``csd.verify.score_block`` adds to a block's scores when a rule reads it (each costs a pass over the vocabulary)
RANK, ENTROPY, TOP3_ENTROPY = "rank", "entropy", "top3_entropy"
ALL_SCORES = frozenset({RANK, ENTROPY, TOP3_ENTROPY})
FLY_GATE_OFF = 0.01   # FLy: an entropy threshold at or below this turns its gate off (as FLy's own code does)


def _out(ok):
    """A bool for scalar inputs, the mask for arrays."""
    return bool(ok) if np.ndim(ok) == 0 else ok


def _floats(*values):
    """Scalars or arrays as float arrays; None (not logged) becomes NaN, which every test below refuses."""
    return [np.asarray(np.nan if v is None else v, dtype=float) for v in values]


def lossy_keeps(gap, log_tau_lossy: float):
    """Lossy SD: keep x~ when p(x~) >= tau p(top-1), i.e. z(x~) - z(t*) >= log tau (CSD's baseline: tau 0.6)."""
    (gap,) = _floats(gap)
    with np.errstate(invalid="ignore"):
        return _out(gap >= log_tau_lossy)


def topk_keeps(rank, p_x, gap, k: int, delta: float):
    """TensorRT-LLM's relaxed acceptance: x~ among the target's top k (fewer than k tokens score strictly
    higher) and p(x~) >= p(top-1) - delta, in probability at T = 1 (p(top-1) - p(x~) = p(x~) (e^-gap - 1))."""
    rank, p_x, gap = _floats(rank, p_x, gap)
    with np.errstate(over="ignore", invalid="ignore"):
        return _out((rank < k) & (p_x * np.expm1(-gap) <= delta))


def typical_keeps(p_x, entropy, threshold: float, alpha: float):
    """vLLM's typical acceptance (Medusa 3.3.1): p(x~) > min(threshold, alpha exp(-H)), H = -sum p log(p + 1e-5)."""
    p_x, entropy = _floats(p_x, entropy)
    with np.errstate(over="ignore", invalid="ignore"):
        return _out(p_x > np.minimum(threshold, alpha * np.exp(-entropy)))


def fly_keeps(index, block_len, after, top3_entropy, win_len: int, entropy_thre: float):
    """FLy (arXiv 2511.22972): a mismatch at block position i is forgiven when the next win_len - 1 draft
    tokens all equal the target's top-1 (``after`` >= win_len - 1), i is not among the block's last win_len
    positions (i + win_len < block length), and, with the gate on, the target's top-3 entropy there is at least
    entropy_thre (a near-certain target is never overruled)."""
    index, block_len, after, h3 = _floats(index, block_len, after, top3_entropy)
    with np.errstate(invalid="ignore"):
        ok = (index + win_len < block_len) & (after >= win_len - 1)
        if entropy_thre > FLY_GATE_OFF:
            ok = ok & (h3 >= entropy_thre)
    return _out(ok)


def _param(default, method: str):
    return field(default=default, metadata={"method": method})


@dataclass(frozen=True)
class Rivals:
    """The rivals' parameters (greedy; docs/rivals.md), one record with their defaults; each is read by its
    method only (the field's ``method``). Their ranges: ``csd.config``; their help: the command line's."""
    tau_lossy: float = _param(0.6, LOSSY)               # lossy: keep x when p(x) >= tau * p(top-1) (CSD's baseline)
    topk: int = _param(15, TOPK)                         # topk: x among the target's top k (TensorRT-LLM's example)
    delta: float = _param(0.5, TOPK)                     # topk: and p(x) >= p(top-1) - delta, in probability
    posterior_threshold: float = _param(0.09, TYPICAL)   # typical: p(x) > min(threshold, alpha * exp(-H)) (vLLM's)
    posterior_alpha: float = _param(0.3, TYPICAL)        # typical: alpha (vLLM's and Medusa's)
    win_len: int = _param(6, FLY)                        # fly: the deferred window (FLy's config)
    entropy_thre: float = _param(0.3, FLY)               # fly: the top-3 entropy gate (<= FLY_GATE_OFF: off)


@dataclass(frozen=True)
class Relax:
    """A rival's relaxed acceptance rule: its method and the rivals' parameters it reads (greedy:
    ``csd.config`` refuses sampling and checks the ranges)."""
    method: str                          # one of RIVALS
    params: Rivals = field(default_factory=Rivals)

    @property
    def log_tau(self) -> float:
        """lossy: log tau_lossy."""
        return log_tau(self.params.tau_lossy)

    @property
    def needs(self) -> frozenset[str]:
        """The scores beyond t*, the logits and the normalisers that this rule reads."""
        return {TOPK: frozenset({RANK}), TYPICAL: frozenset({ENTROPY}),
                FLY: frozenset({TOP3_ENTROPY}) if self.params.entropy_thre > FLY_GATE_OFF else frozenset()
                }.get(self.method, frozenset())

    @property
    def reads(self) -> tuple[str, ...]:
        """The logged values (``keeps``'s keywords) this rule decides on: without one, a divergence is unknown."""
        return {LOSSY: ("gap",), TOPK: ("gap", "p_x", "target_rank"), TYPICAL: ("p_x", "entropy"),
                FLY: ("index", "block_len", "matches_after") + (("top3_entropy",) if self.needs else ())
                }[self.method]

    def keeps(self, *, gap=None, p_x=None, target_rank=None, entropy=None, top3_entropy=None, index=None,
              block_len=None, matches_after=None):
        """Whether the rule keeps divergent draft tokens (scalars or numpy arrays of logged values, named as
        the event's fields; a value not logged, None or NaN, is never kept). ``index``: the position in its
        block. Special tokens are the caller's: they are never relaxed."""
        p = self.params
        if self.method == LOSSY:
            return lossy_keeps(gap, self.log_tau)
        if self.method == TOPK:
            return topk_keeps(target_rank, p_x, gap, p.topk, p.delta)
        if self.method == TYPICAL:
            return typical_keeps(p_x, entropy, p.posterior_threshold, p.posterior_alpha)
        if self.method == FLY:
            return fly_keeps(index, block_len, matches_after, top3_entropy, p.win_len, p.entropy_thre)
        raise ValueError(f"unknown relaxed rule {self.method!r}; choose one of {', '.join(RIVALS)}")


def matches_after(x_tilde: Sequence[int], t_star: Sequence[int]) -> list[int]:
    """For each draft position: how many of the block's next draft tokens equal the target's top-1, in a row."""
    out, run = [0] * len(x_tilde), 0
    for i in range(len(x_tilde) - 1, -1, -1):
        out[i] = run
        run = run + 1 if x_tilde[i] == t_star[i] else 0
    return out


@dataclass(frozen=True)
class Rescue:
    """A run's rule: which CSD modules are on and their thresholds, or a rival's relaxed rule instead; the
    tokens that are never rescued nor relaxed; and the scores the verify pass computes for them."""
    use_ocm: bool = True
    use_scg: bool = True
    lam: float = 6
    log_tau: float = math.log(0.01)
    special: frozenset[int] = frozenset()
    relax: Relax | None = None        # a rival's rule replaces the memory and the gate (csd.config: not with them)
    scores: frozenset[str] = frozenset()   # what score_block adds (RANK, ENTROPY, TOP3_ENTROPY)

    @property
    def enabled(self) -> bool:
        return self.use_ocm or self.use_scg

    @classmethod
    def of(cls, use_ocm: bool, use_scg: bool, lam: float, tau: float, special: Collection[int] = (),
           relax: Relax | None = None, scores: Collection[str] = ()) -> Rescue:
        needs = relax.needs if relax is not None else frozenset()
        return cls(use_ocm, use_scg, lam, log_tau(tau), frozenset(special), relax, needs | frozenset(scores))

    def keeps_logged(self, *, count=None, gap=None, **scores):
        """Whether this rule keeps logged divergences (the what-if over an answer or the store): scalars or
        numpy arrays of the logged count, gap and, for the rivals, p(x~), rank, entropies, index, block
        length and matches after (the keywords of ``Relax.keeps``). Special tokens are the caller's."""
        if self.relax is not None:
            return self.relax.keeps(gap=gap, **scores)
        return rescues(count, gap, self.lam, self.log_tau, self.use_ocm, self.use_scg)


NO_RESCUE = Rescue(use_ocm=False, use_scg=False)


@dataclass(frozen=True)
class Verdict:
    status: str        # ACCEPTED, RESCUED, RELAXED or REJECTED
    rule: str          # RULE_* that decided
    x_tilde: int
    t_star: int
    z_x: float         # target logit of the draft token
    z_t: float         # target logit of its top-1
    count: int | None  # memory count of (x~ -> t*) at decision time (0 for a match, None when never looked up)
    target_rank: int | None = None       # tokens scored strictly above x~ (when computed)
    entropy: float | None = None         # the row's entropy (when computed)
    top3_entropy: float | None = None    # the row's top-3 entropy (when computed)
    matches_after: int | None = None     # the block's next draft tokens equal to the target's top-1, in a row

    @property
    def gap(self) -> float:
        return self.z_x - self.z_t

    def logged(self) -> dict:
        """What the relaxed rules read, as the event's fields (csd.events.TokenEvent)."""
        return dict(target_rank=self.target_rank, entropy=self.entropy, top3_entropy=self.top3_entropy,
                    matches_after=self.matches_after)


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
    rank: list[int] = ()            # (g,) tokens scored strictly above each draft token (when a rule reads it)
    entropy: list[float] = ()       # (g,) each row's entropy -sum p log(p + 1e-5) (when a rule reads it)
    top3_entropy: list[float] = ()  # (g,) each row's top-3 entropy (when a rule reads it)

    def head(self, g: int) -> BlockScores:
        """The scores of the first g draft positions (and the row after them)."""
        return BlockScores(self.t_star[:g + 1], self.z_t[:g + 1], self.z_x[:g], self.lse[:g + 1], self.rank[:g],
                           self.entropy[:g], self.top3_entropy[:g])

    def p_x(self, i: int) -> float:
        """The target's probability of draft token i (T = 1); NaN without normalisers."""
        return math.exp(self.z_x[i] - self.lse[i]) if self.lse else math.nan

    def logged(self, i: int) -> dict:
        """The optional scores of draft position i, by the event's field names (None where not computed)."""
        return dict(target_rank=int(self.rank[i]) if self.rank else None,
                    entropy=self.entropy[i] if self.entropy else None,
                    top3_entropy=self.top3_entropy[i] if self.top3_entropy else None)


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
    or the per-position outcomes of rejection sampling. With a rival's rule (``rescue.relax``) a
    divergence is relaxed or rejected by that rule instead of steps 2-3 (greedy only)."""
    relax = rescue.relax
    if relax is not None and accept is not None:
        raise ValueError("the relaxed rules decide greedily: they take no rejection-sampling outcomes")
    after = matches_after(x_tilde, s.t_star)
    verdicts, observed = [], []
    seen: dict[tuple[int, int], int] = {}  # divergences earlier in this block, not yet in memory
    for i, x in enumerate(x_tilde):
        t = s.t_star[i]
        verdict = partial(Verdict, x_tilde=x, t_star=t, z_x=s.z_x[i], z_t=s.z_t[i], matches_after=after[i],
                          **s.logged(i))
        kept = (x == t) if accept is None else accept[i]     # greedy: a match; sampling: its own test
        if kept:
            verdicts.append(verdict(ACCEPTED, RULE_MATCH if x == t else RULE_SAMPLED, count=0))
            continue
        if x == t:  # sampling rejected the target's own top-1: nothing to rescue, no pattern
            verdicts.append(verdict(REJECTED, RULE_NO_RESCUE, count=0))
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
        special = x in rescue.special or t in rescue.special
        c = None if special else count(x, t) + seen.get((x, t), 0)
        if relax is None:
            ok, why = rescue_decision(x, t, s.z_x[i], s.z_t[i], c, rescue)
        else:
            ok = not special and relax.keeps(gap=s.z_x[i] - s.z_t[i], p_x=s.p_x(i), index=i,
                                             block_len=len(x_tilde), matches_after=after[i], **s.logged(i))
            why = _relaxed_rule(special, ok)
        verdicts.append(verdict(_kept_status(ok, relax), why, count=c))
        if not special:
            observed.append((x, t))            # counted after its own decision
            seen[(x, t)] = seen.get((x, t), 0) + 1
        if not ok:
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
    return Decision(tuple(verdicts), len(x_tilde), s.t_star[len(x_tilde)], True, tuple(observed))


def _relaxed_rule(special: bool, ok: bool) -> str:
    """Which rule decided a rival's position: a special token is never relaxed."""
    if special:
        return RULE_SPECIAL
    return RULE_RELAXED if ok else RULE_NOT_RELAXED


def _kept_status(ok: bool, relax: Relax | None) -> str:
    """The status of a divergence: kept by CSD's rescue, kept by a rival's relaxed rule, or rejected."""
    if not ok:
        return REJECTED
    return RESCUED if relax is None else RELAXED


def top_share(counts: Sequence[int] | Collection[int], fraction: float = 0.2) -> float:
    """Share of all divergences covered by the top ``fraction`` of patterns (the paper's Pareto
    figure: about 69% at 0.2). ``counts``: one count per pattern, in any order."""
    values = sorted((c for c in counts if c > 0), reverse=True)
    if not values:
        return 0.0
    k = max(1, round(len(values) * fraction))
    return sum(values[:k]) / sum(values)
