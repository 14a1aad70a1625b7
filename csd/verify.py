"""Verification of a draft block from the target's logits (Leviathan et al. 2023; CSD, arXiv 2604.13634):
the tensor side of ``csd.rule``, pure functions of tensors. ``score_block`` feeds ``csd.rule.decide``;
``verify_sampling`` is rejection sampling with CSD's rescue of rejections.
"""
from __future__ import annotations

from collections.abc import Collection

import torch

from .events import REJECTED
from .rule import ENTROPY, RANK, TOP3_ENTROPY, BlockScores, CountFn, Decision, Rescue, decide

ALL = (RANK, ENTROPY, TOP3_ENTROPY)   # the order of the optional scores in the transfer


def score_block(x_tilde: list[int] | torch.Tensor, target_logits: torch.Tensor,
                scores: Collection[str] = ()) -> tuple[list[int], BlockScores]:
    """The g draft tokens (a list or a device tensor) as a list, and t*, z(t*), z(x~), each row's
    log-normaliser and the relaxed rules' ``scores``, in ONE host transfer. target_logits: (g + 1, V)."""
    g = len(x_tilde)
    xs = x_tilde if torch.is_tensor(x_tilde) else torch.tensor(x_tilde, dtype=torch.long,
                                                               device=target_logits.device)
    tl = target_logits.float()
    t_star = tl.argmax(-1)                                              # (g + 1,)
    z_t = tl.gather(-1, t_star[:, None])[:, 0]                          # (g + 1,)
    z_x = tl[:g].gather(-1, xs[:, None])[:, 0]                          # (g,)
    lse = torch.logsumexp(tl, -1)                                       # (g + 1,)
    extra = []                                                          # (g,) each, in ALL order
    if RANK in scores:                       # tokens scored strictly above x~: x~ is in the top k iff rank < k
        extra.append((tl[:g] > z_x[:, None]).sum(-1).float())
    if ENTROPY in scores:                    # vLLM's typical acceptance: -sum p log(p + 1e-5), T = 1
        p = torch.exp(tl[:g] - lse[:g, None])
        extra.append(-(p * torch.log(p + 1e-5)).sum(-1))
    if TOP3_ENTROPY in scores:               # FLy's gate: -sum over the top 3 of p log p, p over the whole vocabulary
        lp3 = torch.topk(tl[:g], min(3, tl.shape[-1]), -1).values - lse[:g, None]
        extra.append(-(lp3.exp() * lp3.clamp_min(torch.finfo(lp3.dtype).min)).sum(-1))   # 0 log 0 = 0
    # ids < 2**24 are exact in float32; the block's numbers cross to the host together
    host = torch.cat([xs.float(), t_star.float(), z_t, z_x, lse, *extra]).tolist()
    ids = [int(v) for v in host[:g]]
    t = [int(v) for v in host[g:2 * g + 1]]
    rest = host[5 * g + 3:]
    named = {name: rest[j * g:(j + 1) * g] for j, name in enumerate(n for n in ALL if n in scores)}
    if RANK in named:
        named[RANK] = [int(v) for v in named[RANK]]
    return ids, BlockScores(t, host[2 * g + 1:3 * g + 2], host[3 * g + 2:4 * g + 2], host[4 * g + 2:4 * g + 3 + g],
                            **named)


def point_mass(tokens: list[int], target_logits: torch.Tensor) -> torch.Tensor:
    """Copied proposals as a draft distribution, all mass on each token (g, V): rejection sampling then
    keeps the target's distribution."""
    dev = target_logits.device
    q = torch.zeros(len(tokens), target_logits.shape[-1], device=dev)
    q[torch.arange(len(tokens), device=dev), torch.tensor(tokens, dtype=torch.long, device=dev)] = 1.0
    return q


def verify_sampling(x_tilde: list[int], q: torch.Tensor, p: torch.Tensor, target_logits: torch.Tensor,
                    count: CountFn, rescue: Rescue, generator: torch.Generator | None) -> Decision:
    """Rejection sampling with CSD's rescue: q (g, V) and p (g + 1, V) at the run's temperature. A draft
    token is accepted with probability min(1, p(x)/q(x)); a rejected one whose pattern passes the memory
    and gate is rescued; else the replacement is drawn from norm(max(0, p - q))."""
    g = len(x_tilde)
    xs = torch.tensor(x_tilde, dtype=torch.long, device=p.device)
    p_x = p[:g].gather(-1, xs[:, None])[:, 0]                             # (g,)
    q_x = q.gather(-1, xs[:, None])[:, 0]                                 # (g,)
    u = torch.rand(g, generator=generator).to(p.device)                  # the generator lives on the CPU
    accept = (u <= (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0)).tolist()  # q <= p: always accept
    d = decide(x_tilde, score_block(x_tilde, target_logits, rescue.scores)[1], count, rescue, accept=accept)
    if d.bonus:
        nxt = sample(p[g], generator)
    else:                    # the walk ended on a rejection at its last verdict
        i = len(d.verdicts) - 1
        assert d.verdicts[i].status == REJECTED
        residual = (p[i] - q[i]).clamp_min(0.0)
        nxt = sample(residual if residual.sum() > 0 else p[i], generator)
    return Decision(d.verdicts, d.n_kept, nxt, d.bonus, d.observed)


def sample(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from non-negative weights (normalised here), with the run's generator."""
    return int(torch.multinomial((weights / weights.sum()).cpu(), 1, generator=generator))
