"""HTML pieces of the app, pure functions of events and numbers; all model or user text is escaped here.
A token's fate is explained once (``plain_sentence``, ``token_detail``): Generate's details, Teach's "why" and
the what-if marks all read it; decisions come from ``csd.rule`` through ``csd.ui.rules``."""
from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from csd.config import CSDConfig
from csd.events import (
    ACCEPTED,
    BONUS,
    CORRECTED,
    DIVERGENCE_STATUSES,
    KEPT_DIVERGENCES,
    REJECTED,
    RELAXED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_NOT_RELAXED,
    RULE_SAMPLED,
    RULE_SPECIAL,
    TARGET,
    TokenEvent,
)
from csd.rule import Relax, log_tau

from . import rules

PAPER_URL = "https://arxiv.org/abs/2604.13634"

# status -> (CSS class, legend label, one plain sentence)
STATUS_STYLE = {
    ACCEPTED: ("tok-accepted", "accepted", "the draft's token is what the target would have written: kept."),
    RESCUED: ("tok-rescued", "rescued ★", "boxed, with a star: the target preferred another token, but CSD kept "
              "the draft's because the memory knows this swap and the gate found it close enough."),
    RELAXED: ("tok-relaxed", "relaxed ≈", "dotted box, with ≈: the target preferred another token, but the run's "
              "relaxed rule (lossy, top-k, typical or FLy) found the draft's close enough and kept it; no memory."),
    REJECTED: ("tok-rejected", "rejected", "struck through: the draft's token was thrown away (with the rest of "
               "its block), not part of the answer."),
    CORRECTED: ("tok-corrected", "correction", "solid underline: the target's own token, written where it "
                "rejected the draft's."),
    BONUS: ("tok-bonus", "bonus +", "dotted underline and a plus: a free token from the target after it kept the "
            "whole block."),
    TARGET: ("tok-target", "target (AR)", "written by the target alone, one pass per token."),
}
WHATIF_RESCUE, WHATIF_REJECT = "wi-rescue", "wi-reject"
WHATIF_STYLE = {
    WHATIF_RESCUE: ("would be rescued", "dashed box: under the λ/τ sliders (Analyse: the what-if rule) this rejected "
                    "token would be kept."),
    WHATIF_REJECT: ("would be rejected", "double box: under the λ/τ sliders (Analyse: the what-if rule) this kept "
                    "token would be rejected."),
}
SPECIAL_SENTENCE = "a tag such as ⟨end of turn⟩: a special token, shown as a marker, never part of the text."
DIFF_SENTENCE = "wavy magenta underline: this method's text departs from AR's here."
EMPTY_ANSWER = "The answer appears here, one verify pass at a time."
SPECIAL_LABELS = {"<|endoftext|>": "⟨end of text⟩", "<|im_start|>": "⟨turn start⟩",
                  **dict.fromkeys(("<|im_end|>", "</s>", "<|eot_id|>", "<|end|>"), "⟨end of turn⟩")}
PROMPT_FOLD_CHARS = 240      # a longer prompt is echoed folded (click to unfold)


def static_text(name: str) -> str:
    """Package data: the page's style sheet, script and texts."""
    return (Path(__file__).resolve().parent / "static" / name).read_text(encoding="utf-8")


CSS = static_text("app.css")      # launch(css=...), and inlined in an exported answer
# launch(head=...): details on click, nav, Teach's keys, and the number boxes taken as typed
JS = "".join(f"<script>\n{static_text(name)}</script>\n" for name in ("app.js", "numbers.js"))
# the presentation-mode switch (gradio runs this in the browser; nothing goes to the server)
PRESENT_JS = "(on) => { document.body.classList.toggle('csd-present', !!on); return []; }"
READING_JS = "(on) => { document.body.classList.toggle('csd-reading', !!on); return []; }"


def esc(s: object) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def esc_message(s: object) -> str:
    """Text for a gradio toast (rendered as HTML): markup escaped, quotes kept readable."""
    return html.escape("" if s is None else str(s), quote=False)


def esc_md(s: object) -> str:
    """Text for gr.Markdown: HTML escaped, Markdown's emphasis made literal (``t*`` must not italicise)."""
    out = esc_message(s)
    for ch in "\\*_`[]":
        out = out.replace(ch, "\\" + ch)
    return out


def show_token(s: str | None) -> str:
    """A token's text made visible (spaces and newlines drawn), for tables and details."""
    if s is None:
        return "–"
    s = s.replace("\ufffd", "⟨byte⟩")
    return repr(s)[1:-1].replace(" ", "␣") if s else "''"


def show_text(s: str | None) -> str:
    """Running text on one line (newlines drawn as ⏎), for table cells."""
    return (s or "").replace("\r", "").replace("\n", "⏎").replace("\ufffd", "⟨byte⟩")


def special_label(text: str | None) -> str:
    """A special token's marker: ``<|im_end|>`` -> ``⟨end of turn⟩``, others by name."""
    t = (text or "").strip()
    return SPECIAL_LABELS.get(t) or f"⟨{t.strip('<|>') or 'special'}⟩"


def whatif_class(ev: TokenEvent, lam, tau: float | None = None) -> str | None:
    """``wi-rescue`` for a rejected token the rule (CSD's (lam, tau), or a ``csd.rule.Rescue`` as ``lam``) would
    keep, ``wi-reject`` for a kept token it would not; None when the decision would not change."""
    w = rules.would_keep(ev, lam if tau is None else (lam, tau))
    if w and ev.status == REJECTED:
        return WHATIF_RESCUE
    if w is False and ev.status in KEPT_DIVERGENCES:
        return WHATIF_REJECT
    return None


# -- one token ---------------------------------------------------------------------------------
def plural(n: int, word: str, many: str | None = None) -> str:
    """"1 token", "2 tokens", "1,024 tokens" ("pass" -> "passes" with ``many``)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def rescue_modules(method: str | None) -> tuple[bool, bool]:
    """(memory, gate): the rescue modules ``method`` uses; no method (None) is read as CSD (both)."""
    cfg = CSDConfig(method=method or "csd")
    return cfg.use_ocm, cfg.use_scg


def decision_reasons(ev: TokenEvent, lam: float | None = None, tau: float | None = None,
                     method: str | None = None) -> str:
    """Every reason that rescued or rejected a divergence, from its memory count and logit gap against the λ and τ
    in force (each half of ``csd.rule.rescues``), else its logged rule; '' for other events."""
    if ev.status not in DIVERGENCE_STATUSES:
        return ""
    x = show_token(ev.draft_text)
    if ev.rule == RULE_SPECIAL:
        return "a special token (end of turn, chat template) is never rescued, whatever the memory and the gate say"
    if ev.rule == RULE_NO_RESCUE:
        if ev.draft_id is not None and ev.draft_id == ev.target_id:
            return "rejection sampling did not keep it (the draft gave it more probability than the target)"
        return ("this method has no rescue: it keeps a draft token only where the target agrees with it (SD checks "
                "the target's top-1)")
    use_mem, use_gate = rescue_modules(method)
    c, gap = ev.memory_count, ev.gap
    lt = log_tau(tau) if tau is not None else None
    mem_ok = rules.memory_knows(c, lam) if use_mem and lam is not None and c is not None else None
    gate_ok = rules.gate_passes(gap, tau) if use_gate and lt is not None and gap is not None else None
    if ev.status == REJECTED and mem_ok is not False and gate_ok is not False:   # thresholds unknown: the rule
        mem_ok = False if ev.rule == RULE_MEMORY_RARE else mem_ok
        gate_ok = False if ev.rule == RULE_GAP_LOW else gate_ok
    lam_s = f"λ = {lam:g}" if lam is not None else "λ"
    lt_s = f"log τ = {rules.num(lt)}" if lt is not None else "log τ"
    seen = "had never seen this swap" if c == 0 else f"had seen this swap {plural(c or 0, 'time')}"
    mem = f"the memory {seen} (at least {lam_s})" if mem_ok is not False else \
        f"the memory {seen}, fewer than {lam_s}" if c is not None else "the memory did not know this swap"
    gate_no = f"the target found {x} too unlikely (logit gap {rules.num(gap)}, below {lt_s})"
    gate_yes = f"the target found {x} close enough (logit gap {rules.num(gap)}, at or above {lt_s})"
    if ev.status == RESCUED:
        if use_mem and use_gate:
            return f"{mem} and {gate_yes}"
        return f"{mem}; this method has no gate" if use_mem else f"{gate_yes}; this method uses no memory"
    failed = [r for r, ok in ((mem, mem_ok), (gate_no, gate_ok)) if ok is False]
    if not failed:
        return f"of the rule {ev.rule or 'none'}"
    why = " and ".join(failed)
    if mem_ok is False and gate_ok and use_gate:
        why += f", although the gate would have let it through (logit gap {rules.num(gap)}, at or above {lt_s})"
    elif gate_ok is False and mem_ok and use_mem:
        why += f", although the memory knew the swap ({plural(c, 'time')}, {lam_s})"
    return why


def plain_sentence(ev: TokenEvent, lam: float | None = None, tau: float | None = None,
                   discarded: int | None = None, method: str | None = None, relax: Relax | None = None) -> str:
    """What happened at this token, in one plain sentence (the first line of its details); ``discarded``: the
    block's later draft tokens thrown away (default: the event's); ``relax``: the run's rival rule, if any."""
    x, t = show_token(ev.draft_text), show_token(ev.target_text)
    discarded = len(ev.discarded or ()) if discarded is None else discarded
    wrote = f"The draft wrote {x}, the target preferred {t}"
    rest = "" if not discarded else f" and the block's {plural(discarded, 'later draft token')} " \
                                    f"{'were' if discarded > 1 else 'was'} discarded unchecked"
    if ev.special and ev.in_output:
        return (f"A special token ({special_label(ev.text)}): "
                f"it ends the turn or frames the chat; it is not answer text.")
    if ev.status == TARGET:
        return f"The target wrote {show_token(ev.text)} by itself (autoregressive: one target pass for this token)."
    if ev.status == BONUS:
        return (f"A free token: the target kept the whole block, and its own next token {show_token(ev.text)} "
                f"comes with the same pass.")
    if ev.status == CORRECTED:
        return (f"The target's own token {show_token(ev.text)}, written in place of the draft token it rejected; "
                f"this verify pass ends here.")
    if ev.status == ACCEPTED and ev.source == "lookup":
        return ("Copied from earlier in the prompt or the answer (the tokens before it occurred there too), "
                "not drafted; the target agreed: kept.")
    if ev.status == ACCEPTED:
        if ev.rule == RULE_SAMPLED:
            return f"The draft wrote {x}; rejection sampling kept it (the target gives it enough probability)."
        return f"The draft wrote {x}, and the target agreed: kept."
    if ev.status == RESCUED:
        return f"{wrote}; kept because {decision_reasons(ev, lam, tau, method)}."
    if ev.status == RELAXED:
        return f"{wrote}; kept by the run's relaxed rule, not by a memory: {rules.relax_sentence(ev, relax)}."
    if ev.status == REJECTED:
        why = (f"thrown away because the run's relaxed rule refused it ({rules.relax_sentence(ev, relax)})"
               if ev.rule == RULE_NOT_RELAXED else f"rejected because {decision_reasons(ev, lam, tau, method)}")
        return f"{wrote}; {why}. The target's {t} was written instead{rest}."
    return f"{ev.status} ({ev.rule or 'no rule'})"


def block_place(ev: TokenEvent) -> str:
    """Where a token stands in its pass's block: ", draft position 3 of 4"; past the drafts (a bonus, or the target's
    correction after all were kept): ", after the 4 drafted tokens"; none in a run without drafts (AR)."""
    n = ev.block_len or 0
    if ev.status == BONUS or (n and ev.index_in_block >= n):
        return f", after the {plural(n, 'drafted token')}" if n else ", the target's own token"
    if ev.status == CORRECTED:
        return f", in place of draft position {ev.index_in_block + 1}" + (f" of {n}" if n else "")
    if ev.draft_id is None and not n:
        return ""
    return f", draft position {ev.index_in_block + 1}" + (f" of {n}" if n else "")


def token_detail(ev: TokenEvent, lam: float | None = None, tau: float | None = None,
                 whatif=None, method: str | None = None, relax: Relax | None = None) -> str:
    """A token's details, plain text (the caller escapes), ``plain_sentence`` first. ``whatif``: CSD's (lam, tau)
    or a ``csd.rule.Rescue``; ``method``: the run's (None: CSD's); ``relax``: the run's rival rule, if any."""
    label = STATUS_STYLE.get(ev.status, ("", ev.status, ""))[1]
    lines = [plain_sentence(ev, lam, tau, method=method, relax=relax),
             f"{label} · token {ev.position} of the answer · verify pass {ev.block + 1}{block_place(ev)}"]
    if ev.draft_id is not None:
        lines.append(f"the draft's token (x~) = {show_token(ev.draft_text)} · the target's choice (t*) = "
                     f"{show_token(ev.target_text)}")
    elif ev.target_text is not None:
        lines.append(f"the target's choice (t*): {show_token(ev.target_text)}")
    use_mem, use_gate = rescue_modules(method)
    if ev.gap is not None and ev.status in DIVERGENCE_STATUSES and ev.rule != RULE_SPECIAL:
        lt = log_tau(tau) if tau and relax is None else None
        ok = lt is not None and rules.gate_passes(ev.gap, tau)
        lines.append(f"gate: how close (logit gap z(x~) − z(t*)) = {rules.num(ev.gap)}"
                     + (f" vs log τ = {rules.num(lt)} {'✓' if ok else '✗'}" if lt is not None else "")
                     + ("" if use_gate or relax is not None else " (this method has no gate)"))
    if ev.memory_count is not None and ev.status in DIVERGENCE_STATUSES:
        show = lam is not None and relax is None
        ok = show and rules.memory_knows(ev.memory_count, lam)
        lines.append(f"memory: count(x~ → t*) = {ev.memory_count}"
                     + (f" vs λ = {lam:g} {'✓' if ok else '✗'}" if show else "")
                     + ("" if use_mem or relax is not None else " (this method uses no memory)"))
    if ev.target_prob is not None:
        lines.append(f"p_target(token) = {ev.target_prob:.3f}")
    named = (("the draft's token's rank for the target", ev.target_rank), ("entropy H", ev.entropy),
             ("top-3 entropy", ev.top3_entropy), ("draft tokens that matched after it", ev.matches_after))
    scores = [f"{name} = {v:.3f}" if isinstance(v, float) else f"{name} = {v}" for name, v in named
              if v is not None and ev.status in DIVERGENCE_STATUSES]
    if scores:
        lines.append(" · ".join(scores))
    w = rules.would_keep(ev, whatif) if whatif is not None else None
    if w is not None:
        rule = rules.as_rule(whatif)
        head = (f"what-if λ = {rule.lam:g}, τ = {whatif[1]:.3g}" if isinstance(whatif, tuple)
                else f"what-if {rules.describe(rule)}")
        lines.append(f"{head}: " + (("rescued" if rule.relax is None else "kept") if w else "rejected"))
    return "\n".join(lines)


NEWLINE_MARK = '<span class="tok-nl">⏎</span>'
NEWLINE_SENTENCE = "a newline in a token, drawn in the token's colours"


def token_text_html(ev: TokenEvent) -> tuple[str, list[str], str]:
    """(escaped visible text, extra classes, what follows the token's span) of a token: a special token is a
    labelled marker, an incomplete character (text "") a thin mark, a lone byte ⟨byte⟩. Every newline is drawn as
    ⏎ inside the span, in the token's colours; a token in the answer ending in newlines breaks the line after its
    span, one not in the answer breaks no line (the answer has no such blank lines)."""
    if ev.special:
        return esc(special_label(ev.text)), ["tok-special"], ""
    if ev.text == "":
        return "", ["partial"], ""
    text = ev.text.replace("\r", "")
    if "\n" not in text:
        return _bytes_html(text), [], ""
    lines = text.split("\n")
    if not ev.in_output:
        return NEWLINE_MARK.join(map(_bytes_html, lines)), ["tok-has-nl"], ""
    if lines[-1] == "":            # ends in newlines: the marks in the span, the breaks after it
        head = text.rstrip("\n")
        newlines = len(text) - len(head)
        return _bytes_html(head) + NEWLINE_MARK * newlines, ["tok-has-nl"], "\n" * newlines
    return (NEWLINE_MARK + "\n").join(map(_bytes_html, lines)), [], ""


def _bytes_html(text: str) -> str:
    """Escaped text, a lone byte (U+FFFD after decoding) drawn as ⟨byte⟩."""
    return esc(text).replace("\ufffd", '<span class="tok-bytes">⟨byte⟩</span>')


def _prompt_html(prompt: str | None) -> str:
    if not prompt:
        return ""
    if len(prompt) <= PROMPT_FOLD_CHARS and prompt.count("\n") < 4:
        return f'<div class="csd-prompt"><b>Prompt:</b> {esc(prompt)}</div>'
    head = " ".join(prompt[:100].split())
    return (f'<details class="csd-prompt"><summary><b>Prompt</b> ({len(prompt):,} characters, click to unfold): '
            f"{esc(head)}…</summary>{esc(prompt)}</details>")


def _token_span(i: int, ev: TokenEvent, cfg: CSDConfig | None, whatif, marks: tuple) -> str:
    """One token: its classes (status, what-if, ``marks``: departures, the latest pass) and ``data-detail``."""
    if not isinstance(ev, TokenEvent):
        raise TypeError(f"render_tokens takes TokenEvent, not {type(ev).__name__}")
    diff_positions, latest_block = marks
    text, extra, after = token_text_html(ev)
    flags = {"diff": bool(diff_positions) and ev.in_output and ev.position in diff_positions,
             "latest": latest_block is not None and ev.block == latest_block, "copied": ev.source == "lookup"}
    cls = " ".join(filter(None, ["tok", STATUS_STYLE.get(ev.status, ("tok-other",))[0], *extra,
                                 whatif_class(ev, whatif) if whatif is not None else None,
                                 *(c for c, on in flags.items() if on)]))
    attrs = (f'data-i="{i}" data-status="{esc(ev.status)}" data-pos="{ev.position}" data-block="{ev.block}"'
             + (' data-pass-end="1"' if ev.pass_end else ""))
    run = (cfg.lam, cfg.tau, whatif, cfg.method, cfg.relax) if cfg is not None else (None, None, whatif)
    return f'<span class="{cls}" {attrs} data-detail="{esc(token_detail(ev, *run))}">{text}</span>{after}'


def _fold(spans: list[str]) -> str:
    """Rejected draft tokens in a row, folded in the reading view behind a marker that opens them on a click."""
    if not spans:
        return ""
    what = f"{plural(len(spans), 'rejected draft token')}: click to show or fold"
    return (f'<span class="csd-fold"><button type="button" class="csd-fold-mark" aria-expanded="false" '
            f'title="{esc(what)}" aria-label="{esc(what)}">⋯</button><span class="csd-fold-body">{"".join(spans)}'
            '</span></span>')


def _nav_bar(n: dict) -> str:
    """Next rescued / rejected (/ relaxed) and the counts above an answer."""
    return (f'<div class="csd-nav"><button type="button" data-nav="rescued"{"" if n[RESCUED] else " disabled"}>'
            f'Next rescued ▸</button><button type="button" data-nav="rejected"'
            f'{"" if n[REJECTED] else " disabled"}>Next rejected ▸</button>'
            + ('<button type="button" data-nav="relaxed">Next relaxed ▸</button>' if n[RELAXED] else "")
            + f'<span>{n[RESCUED]} rescued · ' + (f"{n[RELAXED]} relaxed · " if n[RELAXED] else "")
            + f'{n[REJECTED]} rejected · click any token for its details</span></div>')


def render_tokens(events: Iterable[TokenEvent], *, cfg: CSDConfig | None = None, whatif=None,
                  hide_rejected: bool = False, diff_positions: set[int] | None = None, prompt: str | None = None,
                  latest_block: int | None = None, **frame) -> str:
    """The coloured answer, one ``<span>`` per event. cfg: the run's (for the details); whatif: (lam, tau) or a
    ``Rescue`` whose changed decisions are outlined; diff_positions: departures; latest_block: marked while
    streaming; ``frame``: view (the answer's name), panel (the details panel a click fills; default: view's),
    nav (the bar of counts), empty (the text of an empty answer)."""
    view, panel = frame.get("view", "tokens"), frame.get("panel")
    events = list(events)
    parts, fold = [], []        # the reading view's folds: a run of rejected draft tokens behind one marker
    for i, ev in enumerate(events):
        span = _token_span(i, ev, cfg, whatif, (diff_positions, latest_block))
        if ev.status == REJECTED and (whatif is None or whatif_class(ev, whatif) is None):
            fold.append(span)
            continue
        parts.append(_fold(fold) + span)
        fold = []
    parts.append(_fold(fold))
    n = {st: sum(1 for e in events if e.status == st) for st in (RESCUED, RELAXED, REJECTED)}
    body = "".join(p for p in parts if p) or f'<span class="csd-note">{esc(frame.get("empty") or EMPTY_ANSWER)}</span>'
    wrap = "csd-tokens csd-hide-rejected" if hide_rejected else "csd-tokens"
    bar = _nav_bar(n) if frame.get("nav", True) and parts else ""
    return (f'<div data-csd-view="{esc(view)}" data-csd-panel="{esc(panel or view)}">{_prompt_html(prompt)}{bar}'
            f'<div class="{wrap}">{body}</div></div>')


def detail_panel() -> str:
    """The (initially hidden) panel where a clicked token's details are pinned; the script fills it."""
    return ('<div class="csd-detail" hidden role="status"><button type="button" data-csd-close '
            'aria-label="close">✕</button><div class="csd-detail-body"></div></div>')


def render_legend(*, whatif: bool = True, diff: bool = False, key: bool = False) -> str:
    """One plain sentence per colour and mark; ``key``: the marks alone (each sentence a tooltip), beside an answer."""
    def item(cls: str, label: str, sentence: str) -> str:
        return (f'<li><span class="tok {cls}" title="{esc(sentence)}">{esc(label)}</span>'
                f'<span class="s">{esc(sentence)}</span></li>')

    items = [item(*style) for style in STATUS_STYLE.values()]
    items.append(item("tok-accepted tok-special", "⟨end of turn⟩", SPECIAL_SENTENCE))
    if whatif:
        items.append(item(f"tok-rejected {WHATIF_RESCUE}", *WHATIF_STYLE[WHATIF_RESCUE]))
        items.append(item(f"tok-rescued {WHATIF_REJECT}", *WHATIF_STYLE[WHATIF_REJECT]))
    if diff:
        items.append(item("tok-accepted diff", "departs", DIFF_SENTENCE))
    if key:
        items.insert(0, '<li class="k">Colours:</li>')
        items.append(f'<li><span class="tok tok-accepted tok-has-nl" title="{esc(NEWLINE_SENTENCE)}">'
                     f'{NEWLINE_MARK}</span><span class="s">{esc(NEWLINE_SENTENCE)}</span></li>')
    return f'<div class="csd-legend{" csd-key" if key else ""}" role="note"><ul>{"".join(items)}</ul></div>'


def changed_decisions(events: Sequence[TokenEvent], rule) -> int:
    """Decisions that ``rule`` (CSD's (lam, tau), or a ``csd.rule.Rescue``) would change."""
    return sum(1 for e in events if whatif_class(e, rule) is not None)


def whatif_summary(events: Sequence[TokenEvent], lam, tau: float | None = None, outline: bool = True) -> str:
    """How many divergences CSD's (lam, tau), or the rule given as ``lam``, would keep against the run, and (with
    ``outline``) the outline sentence when a decision changes."""
    div = [e for e in events if e.status in DIVERGENCE_STATUSES]
    rule = rules.as_rule(lam if tau is None else (lam, tau))
    if not div:
        return ("No divergences in the last answer: nothing for λ and τ to change." if tau is not None else
                "No divergences in the last answer: no rule has anything to change.")
    would = sum(1 for e in div if rules.would_keep(e, rule))
    now = sum(1 for e in div if e.status in KEPT_DIVERGENCES)
    changed = changed_decisions(div, rule)
    if tau is not None:
        ran = "the run's relaxed rule kept" if any(e.status == RELAXED for e in div) else "the run rescued"
        line = (f"At λ = {lam:g}, τ = {tau:.3g} (log τ = {rules.num(log_tau(tau))}): "
                f"{would} of {plural(len(div), 'divergence')} in the last answer would be rescued; {ran} {now}.")
    else:
        unknown = sum(1 for e in div if e.rule != RULE_SPECIAL and rules.would_keep(e, rule) is None)
        line = (f"Under {rules.describe(rule)}: {would} of {plural(len(div), 'divergence')} in the last answer "
                f"would be kept; the run kept {now}."
                + (f" {unknown} lack a score this rule reads (the Generate tab logs every rule's scores)." if unknown
                   else ""))
    if not outline or not changed:
        return line + ("" if not outline else " No decision changes.")
    return line + (f" {plural(changed, 'changed decision')} {'are' if changed > 1 else 'is'} outlined (dashed: would "
                   f"be {'rescued' if tau is not None else 'kept'}, double: would be rejected); the text after the "
                   f"first one would differ.")


def why_none(events: Sequence[TokenEvent], lam: float, tau: float) -> str:
    """Why CSD rescued none: how many swaps were seen fewer than λ times, how many failed the gate."""
    div = [e for e in events if e.status == REJECTED and not e.special]
    if not div:
        return ""
    known = [e for e in div if e.memory_count is not None]
    if not known:
        return " This method has no correction memory: it rescues nothing."
    rare = sum(1 for e in known if e.memory_count < lam)
    return (f" None rescued because {rare} of {plural(len(div), 'rejected swap')} had been seen fewer than "
            f"λ = {lam:g} times (the memory's count), and {len(known) - rare} passed λ but fell below the gate "
            f"(log τ = {rules.num(log_tau(tau))}); lower λ or τ in Analyse to see what they would rescue.")


def run_summary(events: Sequence[TokenEvent], view: str = "tokens", limit: int = 12, cfg=None) -> str:
    """The rescues and relaxed keeps of an answer, each a link to its token, or (given ``cfg``) why none."""
    rejected = sum(1 for e in events if e.status == REJECTED)
    rej = f"{plural(rejected, 'draft token')} rejected"
    parts = []
    for status in (RESCUED, RELAXED):
        kept = [(i, e) for i, e in enumerate(events) if e.status == status]
        if not kept:
            continue
        links = [f'<a data-goto="{i}" title="show token {e.position}">{esc(show_token(e.draft_text))} kept over '
                 f'{esc(show_token(e.target_text))} (token {e.position})</a>' for i, e in kept[:limit]]
        more = f", and {len(kept) - limit} more" if len(kept) > limit else ""
        parts.append(f"<b>{len(kept)} {status}:</b> " + "; ".join(links) + more)
    if not parts:
        body = "0 rescued" + (f"; {rej}." if rejected else ".")
        if cfg is not None and cfg.method == "csd":
            body += why_none(events, cfg.lam, cfg.tau)
    else:
        body = ". ".join(parts) + (f". {rej}." if rejected else ".")
    return f'<div class="csd-summary" data-csd-for="{esc(view)}">{body}</div>'


def render_status(text: str, state: str = "idle", n: int | None = None) -> str:
    """The status line beside a Run button (state: waiting, running, stopping, stopped, done, idle); ``n`` makes it
    differ from an earlier line of the same words, so that the page draws it again (a refusal after a refusal)."""
    mark = "" if n is None else f' data-n="{n}"'
    return (f'<div class="csd-status-line" data-state="{esc(state)}"{mark} role="status" aria-live="polite">'
            f'{esc(text)}</div>')


def render_error(msg: str) -> str:
    return f'<div class="csd-error" role="alert">{esc(msg)}</div>'
