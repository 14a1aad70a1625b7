"""HTML pieces of the app, as pure functions of events and numbers (no gradio, no models).

Every piece of model or user text goes through ``html.escape`` before it enters HTML:
``gr.HTML`` renders what it is given, so a prompt or an answer containing markup must be
shown as text here. Tooltips are ``title`` attributes (escaped with quotes).
"""
from __future__ import annotations

import html
import math
from typing import Iterable, Sequence

from csd.events import (ACCEPTED, BONUS, CORRECTED, DIVERGENCE_STATUSES, REJECTED, RESCUED, RULE_GAP_LOW,
                        RULE_MATCH, RULE_MEMORY_RARE, RULE_NO_RESCUE, RULE_RESCUE, RULE_SAMPLED, TARGET,
                        TokenEvent)

# status -> (CSS class, legend label, legend explanation)
STATUS_STYLE = {
    ACCEPTED: ("tok-accepted", "accepted", "draft token equal to the target's top-1, kept"),
    RESCUED: ("tok-rescued", "rescued", "draft token differs from the target's top-1, kept by CSD (memory and gate passed)"),
    REJECTED: ("tok-rejected", "rejected", "draft token discarded (not part of the answer)"),
    CORRECTED: ("tok-corrected", "correction", "the target's token emitted in place of a rejected draft token"),
    BONUS: ("tok-bonus", "bonus", "the target's next token after a fully kept block (free)"),
    TARGET: ("tok-target", "target (AR)", "a token of the target alone, autoregressive"),
}
WHATIF_RESCUE, WHATIF_REJECT = "wi-rescue", "wi-reject"

CSS = """
.csd-tokens { font-family: ui-monospace, 'SFMono-Regular', Menlo, Consolas, 'Liberation Mono', monospace;
  white-space: pre-wrap; word-break: break-word; line-height: 1.9; font-size: 14px;
  padding: 10px; border: 1px solid #d0d4da; border-radius: 6px; min-height: 3em; background: #fff; color: #111; }
.csd-prompt { font-size: 13px; color: #444; margin-bottom: 6px; white-space: pre-wrap; word-break: break-word; }
.csd-prompt b { color: #222; }
.tok { border-radius: 3px; padding: 1px 0; cursor: help; color: #111; }
.tok-accepted { background: #c8efc9; }
.tok-rescued { background: #ffd27a; border-bottom: 2px solid #c77700; }
.tok-rejected { background: #fde0e0; color: #a12020; text-decoration: line-through; opacity: 0.85; }
.tok-corrected { background: #bcd7ff; }
.tok-bonus { background: #e2cff7; }
.tok-target { background: #e8e8e8; }
.tok.diff { box-shadow: inset 0 -3px 0 #e0007a; }
.tok.wi-rescue { outline: 2px dashed #1b8a2f; outline-offset: 1px; }
.tok.wi-reject { outline: 2px dashed #c62828; outline-offset: 1px; }
.csd-hide-rejected .tok-rejected:not(.wi-rescue) { display: none; }
.csd-legend { font-size: 12px; display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 4px 0; color: inherit; }
.csd-legend .tok { padding: 1px 4px; }
.csd-metrics { display: grid; grid-template-columns: repeat(auto-fill, minmax(130px, 1fr)); gap: 6px; }
.csd-metric { border: 1px solid #d0d4da; border-radius: 6px; padding: 6px 8px; }
.csd-metric .v { font-size: 20px; font-weight: 600; }
.csd-metric .k { font-size: 11px; opacity: 0.75; }
.csd-status { font-size: 12px; opacity: 0.8; margin-top: 4px; }
.csd-error { border: 1px solid #c62828; background: #fdecea; color: #7f1010; padding: 8px 10px; border-radius: 6px; }
.csd-note { font-size: 12px; opacity: 0.85; }
.csd-teach table { border-collapse: collapse; font-size: 13px; width: 100%; }
.csd-teach th, .csd-teach td { border: 1px solid #d0d4da; padding: 4px 6px; vertical-align: top; text-align: left; }
.csd-teach code { white-space: pre; }
.csd-teach .why { font-size: 12px; }
"""


def _ev(e) -> TokenEvent:
    return e if isinstance(e, TokenEvent) else TokenEvent.from_dict(e)


def esc(s: object) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def esc_message(s: object) -> str:
    """Text for a gradio toast (rendered as HTML): markup escaped, quotes kept readable."""
    return html.escape("" if s is None else str(s), quote=False)


def show_token(s: str | None) -> str:
    """A token's text made visible (spaces and newlines drawn), for tables and tooltips."""
    if s is None:
        return "–"
    return repr(s)[1:-1].replace(" ", "␣") if s else "''"


def show_text(s: str | None) -> str:
    """Running text on one line (newlines drawn as ⏎), for table cells."""
    return (s or "").replace("\r", "").replace("\n", "⏎")


def log_tau(tau: float) -> float:
    return math.log(tau) if tau > 0 else -math.inf


def would_rescue(ev: TokenEvent, lam: float, tau: float) -> bool | None:
    """The CSD rule replayed on a logged divergence: rescued iff count >= lam and gap >= log tau.
    None for events that are not divergences or lack the logged values."""
    if ev.status not in DIVERGENCE_STATUSES or ev.memory_count is None or ev.gap is None:
        return None
    return ev.memory_count >= lam and ev.gap >= log_tau(tau)


def whatif_class(ev: TokenEvent, lam: float, tau: float) -> str | None:
    """``wi-rescue`` for a rejected token these thresholds would rescue, ``wi-reject`` for a
    rescued token they would not; None when the decision would not change."""
    w = would_rescue(ev, lam, tau)
    if w is None:
        return None
    if w and ev.status == REJECTED:
        return WHATIF_RESCUE
    if not w and ev.status == RESCUED:
        return WHATIF_REJECT
    return None


def _fmt(x: float | None, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.{nd}f}"


def token_title(ev: TokenEvent, lam: float | None = None, tau: float | None = None,
                whatif: tuple[float, float] | None = None) -> str:
    """The hover text of one token (plain text; escaped by the caller)."""
    label = STATUS_STYLE.get(ev.status, ("", ev.status, ""))[1]
    lines = [f"{label} · position {ev.position} · block {ev.block}, index {ev.index_in_block}",
             f"token: {show_token(ev.text)}"]
    if ev.draft_id is not None:
        lines.append(f"draft x~: {show_token(ev.draft_text)}   target top-1 t*: {show_token(ev.target_text)}")
    elif ev.target_text is not None:
        lines.append(f"target top-1: {show_token(ev.target_text)}")
    if ev.gap is not None:
        lt = f" vs log τ = {_fmt(log_tau(tau))}" + (" ✓" if ev.gap >= log_tau(tau) else " ✗") if tau else ""
        lines.append(f"logit gap z(x~) − z(t*) = {_fmt(ev.gap)}{lt}")
    if ev.memory_count is not None and ev.status in DIVERGENCE_STATUSES:
        lc = f" vs λ = {lam:g}" + (" ✓" if ev.memory_count >= lam else " ✗") if lam is not None else ""
        lines.append(f"memory count(x~ → t*) = {ev.memory_count}{lc}")
    if ev.target_prob is not None:
        lines.append(f"p_target(token) = {ev.target_prob:.3f}")
    if ev.rule:
        lines.append(f"rule: {ev.rule}")
    if whatif is not None:
        w = would_rescue(ev, *whatif)
        if w is not None:
            lines.append(f"what-if λ = {whatif[0]:g}, τ = {whatif[1]:.3g}: " + ("rescued" if w else "rejected"))
    return "\n".join(lines)


def render_tokens(events: Iterable, *, lam: float | None = None, tau: float | None = None,
                  hide_rejected: bool = False, whatif: tuple[float, float] | None = None,
                  diff_positions: set[int] | None = None, prompt: str | None = None,
                  empty: str = "The answer appears here, token by token.") -> str:
    """The coloured answer: one escaped ``<span>`` per event, a tooltip each.

    lam/tau: the thresholds the run used (for the tooltips); whatif: other (lam, tau) under which
    changed decisions are outlined; diff_positions: output positions to mark as departures.
    """
    parts = []
    for e in events:
        ev = _ev(e)
        cls = ["tok", STATUS_STYLE.get(ev.status, ("tok-other",))[0]]
        if whatif is not None:
            w = whatif_class(ev, *whatif)
            if w:
                cls.append(w)
        if diff_positions and ev.in_output and ev.position in diff_positions:
            cls.append("diff")
        parts.append(f'<span class="{" ".join(cls)}" data-status="{esc(ev.status)}" data-pos="{ev.position}" '
                     f'title="{esc(token_title(ev, lam, tau, whatif))}">{esc(ev.text)}</span>')
    body = "".join(parts) or f'<span class="csd-note">{esc(empty)}</span>'
    wrap = "csd-tokens csd-hide-rejected" if hide_rejected else "csd-tokens"
    head = f'<div class="csd-prompt"><b>Prompt:</b> {esc(prompt)}</div>' if prompt else ""
    return f'{head}<div class="{wrap}">{body}</div>'


def render_legend(whatif: bool = True) -> str:
    items = [f'<span class="tok {cls}" title="{esc(expl)}">{esc(label)}</span>'
             for cls, label, expl in STATUS_STYLE.values()]
    if whatif:
        items.append(f'<span class="tok tok-rejected {WHATIF_RESCUE}" title="what-if: rescued under the '
                     f'λ/τ sliders">would be rescued</span>')
        items.append(f'<span class="tok tok-rescued {WHATIF_REJECT}" title="what-if: rejected under the '
                     f'λ/τ sliders">would be rejected</span>')
    return f'<div class="csd-legend">{"".join(items)}</div>'


def whatif_summary(events: Sequence, lam: float, tau: float, run_lam: float | None = None,
                   run_tau: float | None = None) -> str:
    """One line: how many of the answer's divergences (lam, tau) would rescue, against the run."""
    evs = [_ev(e) for e in events]
    div = [e for e in evs if e.status in DIVERGENCE_STATUSES]
    if not div:
        return "No divergences in the last answer: nothing for λ and τ to change."
    would = sum(1 for e in div if would_rescue(e, lam, tau))
    now = sum(1 for e in div if e.status == RESCUED)
    return (f"At λ = {lam:g}, τ = {tau:.3g} (log τ = {log_tau(tau):.2f}): {would} of {len(div)} divergences in the "
            f"last answer would be rescued; the run rescued {now}. Changed decisions are outlined; the text after "
            f"the first changed one would differ.")


# -- metrics ---------------------------------------------------------------------------------
def render_metrics(m: dict | None, *, running: bool = False, ar_tokens_per_s: float | None = None,
                   first_token_s: float | None = None, method: str | None = None, note: str = "") -> str:
    if not m:
        return '<div class="csd-note">Metrics appear here while the answer streams.</div>'
    speed = m.get("tokens_per_s") or 0.0
    cells = [
        ("tokens / s", f"{speed:.2f}"),
        ("new tokens", f"{m.get('new_tokens', 0)}"),
        ("acceptance rate", f"{100 * (m.get('acceptance_rate') or 0):.1f}%" if method != "ar" else "–"),
        ("mean acceptance length", f"{m.get('mean_accepted_length') or 0:.2f}"),
        ("rescued", f"{m.get('rescued', 0)}"),
        ("target passes", f"{m.get('target_forwards', 0)}"),
        ("wall time", f"{m.get('wall_s') or 0:.2f} s"),
    ]
    if first_token_s is not None:
        cells.append(("first token after", f"{first_token_s:.2f} s"))
    if ar_tokens_per_s:
        cells.append(("speed-up over AR (tokens/s)", f"{speed / ar_tokens_per_s:.2f}×" if speed else "–"))
    elif method != "ar":
        cells.append(("speed-up over AR: run AR on this prompt first", "–"))
    body = "".join(f'<div class="csd-metric"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                   for k, v in cells)
    state = "running…" if running else f"finished ({esc(m.get('stopped_by') or 'done')})"
    extra = f" · {esc(note)}" if note else ""
    return (f'<div class="csd-metrics" data-state="{"running" if running else "done"}">{body}</div>'
            f'<div class="csd-status">{state}{extra}</div>')


def render_error(msg: str) -> str:
    return f'<div class="csd-error" role="alert">{esc(msg)}</div>'


# -- teach -----------------------------------------------------------------------------------
def explain_decision(ev: TokenEvent, lam: float, tau: float) -> str:
    """A sentence saying why this position was decided as it was (plain text)."""
    x, t = show_token(ev.draft_text), show_token(ev.target_text)
    c, g, lt = ev.memory_count, ev.gap, log_tau(tau)
    if ev.status == CORRECTED:
        return f"The draft was rejected here, so the target's own top-1 {show_token(ev.text)} is emitted; this target pass ends."
    if ev.status == BONUS:
        return f"Every draft token was kept, so the target's prediction after the block, {show_token(ev.text)}, comes free."
    if ev.status == TARGET:
        return "Autoregressive: one target pass per token."
    if ev.rule == RULE_MATCH:
        return f"x~ = t* = {x}: the target agrees, accepted."
    if ev.rule == RULE_SAMPLED:
        return f"Rejection sampling accepted {x} (u ≤ p(x~)/q(x~))."
    if ev.rule == RULE_NO_RESCUE:
        return f"x~ = {x} ≠ t* = {t} and this method has no rescue: rejected, {t} is emitted, the rest of the block is discarded."
    if ev.rule == RULE_MEMORY_RARE:
        return (f"x~ = {x} ≠ t* = {t}; memory count({x} → {t}) = {c} < λ = {lam:g}: not a known pattern, rejected; "
                f"{t} is emitted and the rest of the block is discarded. The pattern's count goes up by one.")
    if ev.rule == RULE_GAP_LOW:
        return (f"x~ = {x} ≠ t* = {t}; count {c} ≥ λ = {lam:g} but gap {_fmt(g)} < log τ = {_fmt(lt)}: the target finds "
                f"{x} too unlikely, rejected.")
    if ev.rule == RULE_RESCUE:
        return (f"x~ = {x} ≠ t* = {t}; count {c} ≥ λ = {lam:g} and gap {_fmt(g)} ≥ log τ = {_fmt(lt)}: rescued, {x} is kept "
                f"and verification goes on with the next draft position.")
    return f"{ev.status} ({ev.rule or 'no rule'})"


def _top_list(top: list | None) -> str:
    if not top:
        return "–"
    return "<br>".join(f"<code>{esc(show_token(t))}</code> {p:.3f}" for t, p in top)


def render_teach_step(block: Sequence, *, step: int, n_steps: int, text_before: str, lam: float, tau: float,
                      method: str) -> str:
    """One speculative iteration: the draft's proposals, the target's top 5, each decision and its rule."""
    evs = [_ev(e) for e in block]
    kept = "".join(f'<span class="tok {STATUS_STYLE[e.status][0]}">{esc(e.text)}</span>'
                   for e in evs if e.in_output)
    rejected = [e for e in evs if e.status == REJECTED]
    rows = []
    for e in evs:
        if e.draft_id is not None:
            q = e.draft_prob
            if q is None and e.draft_top and e.draft_top[0][0] == e.draft_text:
                q = e.draft_top[0][1]
            proposal = f"<code>{esc(show_token(e.draft_text))}</code>" + (f" q = {q:.3f}" if q is not None else "")
        else:
            proposal = "— (target's own token)"
        target = f"<code>{esc(show_token(e.target_text))}</code>" if e.target_text is not None else "–"
        decision = f'<span class="tok {STATUS_STYLE.get(e.status, ("",))[0]}">{esc(STATUS_STYLE.get(e.status, ("", e.status))[1])}</span>'
        rows.append(
            f"<tr><td>{e.index_in_block}</td><td>{proposal}</td><td>{_top_list(e.draft_top)}</td>"
            f"<td>{target}</td><td>{_top_list(e.target_top)}</td><td>{decision}<br><small>{esc(e.rule or '')}</small></td>"
            f'<td class="why">{esc(explain_decision(e, lam, tau))}</td></tr>')
    summary = (f"Iteration {step + 1} of {n_steps} ({esc(method)}, λ = {lam:g}, τ = {tau:.3g}): "
               f"{sum(1 for e in evs if e.draft_id is not None)} draft positions decided, "
               f"{sum(1 for e in evs if e.in_output)} tokens emitted, one target pass"
               + (f", {len(rejected)} draft token rejected." if rejected else "."))
    return (f'<div class="csd-teach"><p>{summary}</p>'
            f'<div class="csd-tokens">{esc(text_before)}{kept}</div>'
            f"<table><thead><tr><th>i</th><th>draft proposes x~</th><th>draft top 5</th><th>target t*</th>"
            f"<th>target top 5 (p)</th><th>decision / rule</th><th>why</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


TEACH_EXPLANATION = """
### How one speculative iteration works
1. **Draft.** The small model proposes γ tokens x̃₁ … x̃_γ, one after the other (cheap).
2. **Verify.** The large target model scores the whole block in **one** forward pass: at each
   position i it has its own top-1 token t*ᵢ and logits z.
3. **Decide, left to right** (CSD, greedy):
   - x̃ᵢ = t*ᵢ → **accepted**.
   - else, if the Online Correction Memory has seen the pattern x̃ᵢ → t*ᵢ at least **λ** times
     *and* the Semantic Consistency Gate passes, z(x̃ᵢ) − z(t*ᵢ) ≥ **log τ** → **rescued**: the
     draft token is kept and verification continues.
   - else → **rejected**: t*ᵢ is emitted instead (the *correction*) and the rest of the block is thrown away.
4. **Learn.** Every divergence (rescued or rejected) adds one to its pattern's count, after its own decision.
5. If every draft token was kept, the target's prediction after the block is a free **bonus** token.

Standard speculative decoding (SD) is the same loop without step 3's rescue: its output equals
the target's alone. CSD trades that exactness for fewer target passes on harmless differences
(`' the'` → `' a'`, `','` → `'.'`).
"""
