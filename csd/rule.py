"""The verification rule of (Calibrated) Speculative Decoding, as pure functions of tensors.

Paper: Calibrated Speculative Decoding, arXiv 2604.13634. At each draft position i, with the
draft's proposal x~_i and the target's top-1 t*_i (PAPER.md, "Decision at each draft position"):
  1. x~_i == t*_i                                            -> accepted
  2. count(x~_i -> t*_i) >= lam and z(x~_i) - z(t*_i) >= log tau -> rescued, go on with i+1
  3. otherwise                                               -> rejected, emit t*_i, stop
Every divergence (2, 3) is counted after its own decision, so it never vouches for itself;
within one block a repeated pattern sees the earlier occurrence's increment.
SD is the same rule with neither module; the ablations switch one module off.
No model calls, no I/O: the decode loop feeds tensors in and applies ``Decision.observed``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .events import (ACCEPTED, REJECTED, RESCUED, RULE_GAP_LOW, RULE_MATCH, RULE_MEMORY_RARE,
                     RULE_NO_RESCUE, RULE_RESCUE, RULE_SAMPLED)

CountFn = Callable[[int, int], int]


@dataclass(frozen=True)
class Rescue:
    """Which CSD modules are on, and their thresholds."""
    use_ocm: bool = True
    use_scg: bool = True
    lam: float = 6
    log_tau: float = -4.605170185988091  # log(0.01)

    @property
    def enabled(self) -> bool:
        return self.use_ocm or self.use_scg


NO_RESCUE = Rescue(use_ocm=False, use_scg=False)


@dataclass(frozen=True)
class Verdict:
    status: str        # ACCEPTED, RESCUED or REJECTED
    rule: str          # RULE_* that decided
    x_tilde: int
    t_star: int
    z_x: float         # target logit of the draft token
    z_t: float         # target logit of its top-1
    count: int         # memory count of (x~ -> t*) at decision time (0 for a match)

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


def rescue_decision(x: int, t: int, z_x: float, z_t: float, count: int, rescue: Rescue) -> tuple[bool, str]:
    """Whether a divergent draft token is rescued, and the rule that decided (steps 2-3)."""
    if not rescue.enabled:
        return False, RULE_NO_RESCUE
    if rescue.use_ocm and count < rescue.lam:
        return False, RULE_MEMORY_RARE
    if rescue.use_scg and z_x - z_t < rescue.log_tau:
        return False, RULE_GAP_LOW
    return True, RULE_RESCUE


@dataclass(frozen=True)
class BlockScores:
    """What greedy SD itself computes from the target's logits: t* and the two logits."""
    t_star: list[int]   # (g + 1,) the target's top-1 at each position, the last one the bonus
    z_t: list[float]    # (g + 1,) its logit
    z_x: list[float]    # (g,) the target logit of each draft token


def score_block(x_tilde: list[int], target_logits: torch.Tensor) -> BlockScores:
    g = len(x_tilde)
    t_star = target_logits.argmax(-1)                                   # (g + 1,)
    z_t = target_logits.gather(-1, t_star[:, None])[:, 0]               # (g + 1,)
    z_x = target_logits[:g].gather(-1, torch.tensor(x_tilde, dtype=torch.long,
                                                    device=target_logits.device)[:, None])[:, 0]  # (g,)
    return BlockScores(t_star.tolist(), z_t.tolist(), z_x.tolist())


def decide_greedy(x_tilde: list[int], s: BlockScores, count: CountFn, rescue: Rescue = NO_RESCUE) -> Decision:
    """The decision walk over scored positions: memory lookups and the gate, no tensors."""
    return _walk(x_tilde, s.t_star, s.z_x, s.z_t, count, rescue, accept=None)


def verify_greedy(x_tilde: list[int], target_logits: torch.Tensor, count: CountFn,
                  rescue: Rescue = NO_RESCUE) -> Decision:
    """Greedy verification of a draft block.

    x_tilde: the gamma draft tokens; target_logits: (gamma + 1, V) target logits where row i
    scores position i of the block and row gamma gives the bonus token; count: memory lookup.
    """
    return decide_greedy(x_tilde, score_block(x_tilde, target_logits), count, rescue)


def verify_sampling(x_tilde: list[int], q: torch.Tensor, p: torch.Tensor, target_logits: torch.Tensor,
                    count: CountFn, rescue: Rescue, generator: torch.Generator | None) -> Decision:
    """Rejection-sampling verification (Leviathan et al. 2023) with CSD rescue of rejections.

    q: (gamma, V) draft probabilities, p: (gamma + 1, V) target probabilities, both at the run's
    temperature. A draft token is accepted with probability min(1, p(x)/q(x)); a rejected one
    whose pattern passes the memory and gate (t* = the target's argmax) is rescued; otherwise
    the replacement is drawn from norm(max(0, p - q)). Without rescue the output is distributed
    exactly as the target's.
    """
    g = len(x_tilde)
    dev = p.device
    xs = torch.tensor(x_tilde, dtype=torch.long, device=dev)
    p_x = p[:g].gather(-1, xs[:, None])[:, 0]                             # (g,)
    q_x = q.gather(-1, xs[:, None])[:, 0]                                 # (g,)
    u = torch.rand(g, generator=generator).to(dev)                          # generator lives on the CPU
    accept = (u <= (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0)).tolist()  # q >= p: always accept
    s = score_block(x_tilde, target_logits)
    d = _walk(x_tilde, s.t_star, s.z_x, s.z_t, count, rescue, accept=accept)
    if d.bonus:
        nxt = _sample(p[g], generator)
    elif d.verdicts[-1].status == REJECTED:
        i = len(d.verdicts) - 1
        residual = (p[i] - q[i]).clamp_min(0.0)
        nxt = _sample(residual if residual.sum() > 0 else p[i], generator)
    else:  # unreachable: a walk stops on a bonus or a rejection
        raise AssertionError("verification ended without bonus or rejection")
    return Decision(d.verdicts, d.n_kept, nxt, d.bonus, d.observed)


def _sample(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    probs = weights / weights.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _walk(x_tilde, t_star, z_x, z_t, count: CountFn, rescue: Rescue, accept) -> Decision:
    """Steps 1-4 over the block. ``accept`` is None (greedy: match = x~ == t*) or per-position
    rejection-sampling outcomes."""
    verdicts, observed = [], []
    seen: dict[tuple[int, int], int] = {}  # divergences earlier in this block, not yet in memory
    for i, x in enumerate(x_tilde):
        t = t_star[i]
        if (x == t) if accept is None else accept[i]:
            verdicts.append(Verdict(ACCEPTED, RULE_MATCH if x == t else RULE_SAMPLED, x, t, z_x[i], z_t[i], 0))
            continue
        if x == t:  # sampling rejected the target's own top-1: nothing to rescue, no pattern
            verdicts.append(Verdict(REJECTED, RULE_NO_RESCUE, x, t, z_x[i], z_t[i], 0))
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
        c = count(x, t) + seen.get((x, t), 0)
        ok, why = rescue_decision(x, t, z_x[i], z_t[i], c, rescue)
        verdicts.append(Verdict(RESCUED if ok else REJECTED, why, x, t, z_x[i], z_t[i], c))
        observed.append((x, t))            # counted after its own decision
        seen[(x, t)] = seen.get((x, t), 0) + 1
        if not ok:
            return Decision(tuple(verdicts), i, t, False, tuple(observed))
    return Decision(tuple(verdicts), len(x_tilde), t_star[len(x_tilde)], True, tuple(observed))
