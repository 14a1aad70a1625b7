"""The run rules (CSD, SD, the ablations, the rivals) in words, and replayed on an answer's logged events (the
what-if) through ``csd.rule``'s ``Rescue.keeps_logged``: nothing here re-implements a rule."""
from __future__ import annotations

import math

from csd.config import RIVAL_PARAMS, CSDConfig
from csd.events import DIVERGENCE_STATUSES, RULE_SPECIAL, TokenEvent
from csd.rule import FLY, LOSSY, TOPK, TYPICAL, Relax, Rescue

RIVAL_FIELDS = tuple(p for ps in RIVAL_PARAMS.values() for p in ps)   # the app's order of the rivals' inputs
INT_FIELDS = ("topk", "win_len")
WHATIF_METHODS = ("csd", "sd", "ocm-only", "scg-only", LOSSY, TOPK, TYPICAL, FLY)   # Analyse's what-if choices
METHOD_SHORT = {   # the app's method picker: fits a narrow column
    "ar": "target alone", "sd": "speculative, top-1 match", "csd": "SD + memory + gate",
    "ocm-only": "memory, no gate", "scg-only": "gate, no memory",
    LOSSY: "rival: p ≥ τ·p(top-1)", TOPK: "rival: top-k within δ", TYPICAL: "rival: typical acceptance",
    FLY: "rival: FLy deferred window",
}


def num(x: float | None, nd: int = 2) -> str:
    """A number for a sentence (the true minus sign; – when not logged)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "−∞" if x < 0 else "∞"
    return f"{x:.{nd}f}".replace("-", "−")


def whatif_rule(method: str, lam: float, tau: float, rivals: dict | None = None) -> Rescue:
    """The one door from a slider to the rule: ``method`` at λ, τ and the rivals' parameters, checked by the
    engine's config (``ConfigError`` names a value out of range). Every what-if below goes through it."""
    return CSDConfig.of(method=method, lam=float(lam), tau=float(tau), **(rivals or {})).validated().rule()


def as_rule(whatif) -> Rescue:
    """A what-if as a rule: a ``Rescue`` (made by ``whatif_rule``) as it is, or CSD's (λ, τ) through the door."""
    return whatif if isinstance(whatif, Rescue) else whatif_rule("csd", *whatif)


def memory_knows(count, lam: float):
    """The memory's half of CSD's rule at λ (count >= λ): a bool, or a mask of a numpy array of counts."""
    return whatif_rule("ocm-only", lam, CSDConfig.tau).keeps_logged(count=count)


def gate_passes(gap, tau: float):
    """The gate's half of CSD's rule at τ (gap >= log τ): a bool, or a mask of a numpy array of gaps."""
    return whatif_rule("scg-only", CSDConfig.lam, tau).keeps_logged(gap=gap)


def describe(rule: Rescue) -> str:
    """The rule and its parameters, in a few words."""
    r = rule.relax
    if r is not None:       # a rival's relaxed rule
        p = r.params
        return {LOSSY: f"lossy SD at τ = {math.exp(r.log_tau):.3g}", TOPK: f"top-k at k = {p.topk}, δ = {p.delta:g}",
                TYPICAL: f"typical acceptance at threshold {p.posterior_threshold:g}, α = {p.posterior_alpha:g}",
                FLY: f"FLy at window {p.win_len}, entropy gate {p.entropy_thre:g}" + ("" if r.needs else " (off)")
                }[r.method]
    tau = f"τ = {math.exp(rule.log_tau):.3g} (log τ = {num(rule.log_tau)})"
    return {(True, True): f"CSD at λ = {rule.lam:g}, {tau}", (False, False): "SD (no relaxation: top-1 matches only)",
            (True, False): f"the memory alone at λ = {rule.lam:g}", (False, True): f"the gate alone at {tau}",
            }[(rule.use_ocm, rule.use_scg)]     # CSD and SD, or an ablation: (memory, gate)


def logged(ev: TokenEvent) -> dict:
    """What a rival reads, from an event (``Relax.keeps``'s keywords)."""
    return dict(gap=ev.gap, p_x=ev.target_prob, target_rank=ev.target_rank, entropy=ev.entropy,
                top3_entropy=ev.top3_entropy, index=ev.index_in_block, block_len=ev.block_len,
                matches_after=ev.matches_after)


def would_keep(ev: TokenEvent, rule) -> bool | None:
    """Whether ``rule`` keeps this logged divergence; None for other events, special tokens, missing scores."""
    rule = as_rule(rule)
    if ev.status not in DIVERGENCE_STATUSES or ev.rule == RULE_SPECIAL:
        return None
    if rule.relax is not None:
        values = logged(ev)
        if any(values[k] is None for k in rule.relax.reads):
            return None
        return bool(rule.keeps_logged(**values))
    if (rule.use_ocm and ev.memory_count is None) or (rule.use_scg and ev.gap is None):
        return None
    return bool(rule.keeps_logged(count=ev.memory_count, gap=ev.gap))


def relax_sentence(ev: TokenEvent, relax: Relax | None) -> str:
    """Why a rival's rule kept or refused this divergence, with its numbers (plain text)."""
    if relax is None:
        return "the run's relaxed rule decided"
    m, p = relax.method, relax.params
    if m == LOSSY:
        ratio = math.exp(ev.gap) if ev.gap is not None else None
        ok = ratio is not None and ev.gap >= relax.log_tau
        return (f"lossy SD: p(x~)/p(t*) = {num(ratio, 3)} {'≥' if ok else '<'} τ = {math.exp(relax.log_tau):.3g}")
    if m == TOPK:
        rank = "–" if ev.target_rank is None else f"#{ev.target_rank + 1}"
        diff = ev.target_prob * math.expm1(-ev.gap) if None not in (ev.target_prob, ev.gap) and ev.gap > -700 else None
        return (f"top-k: x~ is the target's {rank} (k = {p.topk}) and p(t*) − p(x~) = {num(diff, 3)} "
                f"(δ = {p.delta:g})")
    if m == TYPICAL:
        thr = min(p.posterior_threshold, p.posterior_alpha * math.exp(-ev.entropy)) if ev.entropy is not None else None
        return (f"typical acceptance: p(x~) = {num(ev.target_prob, 3)} against min({p.posterior_threshold:g}, "
                f"{p.posterior_alpha:g}·e^−H) = {num(thr, 3)} (H = {num(ev.entropy)} nats)")
    if m == FLY:
        gate = (f"top-3 entropy {num(ev.top3_entropy)} against {p.entropy_thre:g}" if relax.needs
                else "entropy gate off")
        return (f"FLy: {num(ev.matches_after, 0) if ev.matches_after is not None else '–'} of the next draft tokens "
                f"match the target (the window needs {p.win_len - 1}); position {ev.index_in_block + 1} of "
                f"{ev.block_len or '–'}, forgivable only before the block's last {p.win_len}; {gate}")
    return f"rule {m}"
