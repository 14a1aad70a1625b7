"""The Teach tab: a short run with explanations (draft and target top-k), stepped through one speculative
iteration at a time, by hand or by the autoplay timer."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import gradio as gr

from csd.config import METHODS, CSDConfig
from csd.events import REJECTED, TokenEvent

from .. import render, rules
from ..render import STATUS_STYLE, esc, plain_sentence, plural, show_token, token_text_html
from ..state import RunSettings, Services, Session
from .common import error, exactness_note, page_config
from .inputs import dropdown, slider
from .jobs import done_sentence, in_lane, run_recorded, status_line, stop, take_job
from .page import EXAMPLES, HIDE_PRESENT, Page


# -- the view of one iteration -----------------------------------------------------------------
def _top_list(top: list | None) -> str:
    return "<br>".join(f"<code>{esc(show_token(t))}</code> {p:.3f}" for t, p in top) if top else "–"


def _chip(text: str, cls: str, title: str = "") -> str:
    return f'<span class="tok {cls}" title="{esc(title)}">{esc(show_token(text))}</span>'


def render_teach_step(block: Sequence[TokenEvent], *, step: int, n_steps: int, text_before: str, cfg: CSDConfig,
                      discarded_texts: Sequence[str] = ()) -> str:
    """One speculative iteration of a run under ``cfg``: every token the draft proposed (kept, rejected, and
    the ones thrown away unchecked after a rejection), the target's top 5, each decision and its rule."""
    lam, tau, method, relax = cfg.lam, cfg.tau, cfg.method, cfg.relax
    evs = list(block)
    kept = "".join(f'<span class="tok {STATUS_STYLE[e.status][0]}">{token_text_html(e)[0]}</span>'
                   for e in evs if e.in_output)
    drafted = [e for e in evs if e.draft_id is not None]
    rejected = [e for e in evs if e.status == REJECTED]
    chips = [_chip(e.draft_text, STATUS_STYLE[e.status][0], STATUS_STYLE[e.status][1]) for e in drafted]
    chips += [_chip(t, "tok-discarded", "discarded unchecked: after a rejection the rest of the block is thrown away")
              for t in discarded_texts]
    block_len = evs[0].block_len if evs and evs[0].block_len else len(drafted) + len(discarded_texts)
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
        cls, label = STATUS_STYLE.get(e.status, ("", e.status))[:2]
        decision = f'<span class="tok {cls}">{esc(label)}</span>'
        rows.append(
            f"<tr><td>{e.index_in_block + 1}</td><td>{proposal}</td><td>{_top_list(e.draft_top)}</td>"
            f"<td>{target}</td><td>{_top_list(e.target_top)}</td>"
            f"<td>{decision}<br><small>{esc(e.rule or '')}</small></td>"
            f'<td class="why">{esc(plain_sentence(e, lam, tau, method=method, relax=relax))}</td></tr>')
        if e.status == REJECTED:   # the discarded draft tokens come right after the rejected one
            for k, t in enumerate(discarded_texts, start=e.index_in_block + 2):
                rows.append(f'<tr class="discarded"><td>{k}</td><td><code>{esc(show_token(t))}</code></td>'
                            f'<td>–</td><td>–</td><td>–</td><td><span class="tok tok-discarded">discarded</span></td>'
                            f'<td class="why">Never checked: once a draft token is rejected, the rest of the block '
                            f'is thrown away.</td></tr>')
    params = esc(rules.describe(cfg.rule())) if relax else f"λ = {lam:g}, τ = {tau:.3g}"
    summary = (f"Iteration {step + 1} of {n_steps} ({esc(method)}, {params}): the draft proposed "
               f"{plural(block_len, 'token')}, {len(drafted)} checked, "
               f"{plural(sum(1 for e in evs if e.in_output), 'token')} emitted, one target pass"
               + (f"; 1 draft token rejected and {len(discarded_texts)} discarded unchecked." if rejected else "."))
    return (f'<div class="csd-teach"><p>{summary}</p>'
            f'<div class="csd-block"><span class="lbl">drafted block:</span>{"".join(chips) or "–"}</div>'
            f'<div class="csd-tokens">{esc(text_before)}{kept}</div>'
            f'<div class="csd-scroll-box"><div class="csd-scroll-hint">more columns: scroll the table sideways →'
            f'</div><div class="csd-scroll"><table><thead><tr><th>i</th><th>the draft\'s token (x~)</th>'
            f"<th>draft top 5</th><th>the target's choice (t*)</th><th>target top 5 (p)</th><th>decision / rule</th>"
            f"<th>why</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div></div></div>")


TEACH_EXPLANATION = render.static_text("teach.md")   # the steps of an iteration, beside the view


# -- stepping through a run --------------------------------------------------------------------
def _blocks(events: list[TokenEvent]) -> list[list[TokenEvent]]:
    out: dict[int, list[TokenEvent]] = {}
    for e in events:
        out.setdefault(e.block, []).append(e)
    return [out[k] for k in sorted(out)]


def teach_view(services: Services, sess: Session | None, step: int) -> str:
    view = sess.teach if isinstance(sess, Session) else None
    if view is None or not view.events:
        return '<div class="csd-note">Run a teaching example to step through it (← and → keys step, Play steps ' \
               'by itself).</div>'
    blocks = _blocks(view.events)
    step = max(0, min(step, len(blocks) - 1))
    sess.teach_step = step
    before = "".join(e.text for b in blocks[:step] for e in b if e.in_output and not e.special)
    block = blocks[step]
    discarded = [e.discarded for e in block if e.status == REJECTED and e.discarded]
    texts = [services.pair.tokenizer.decode([i]) for i in (discarded[0] if discarded else [])]
    return render_teach_step(block, step=step, n_steps=len(blocks), text_before=before, cfg=view.cfg,
                             discarded_texts=texts)


def teach_run(services: Services, prompt: str, s: RunSettings, sess: Session | None):
    """A short greedy run with explanations at a fixed γ, then iteration 1. Yields (view, status line, session)."""
    sess, job = take_job(services, sess, "teach")
    if job.cancel:
        yield gr.skip(), status_line(services, sess, "teach"), sess
        return
    if s.method == "ar":
        services.lane.finish(job, "Not run: Teach needs a speculative method.")
        raise error("Teach steps through speculative iterations: pick sd, csd, an ablation or a rival, not ar.")
    with in_lane(services, job):
        # greedy, in a chat, at the γ of the slider (Teach keeps the number even with γ = auto)
        cfg = page_config(replace(s, chat=True, temperature=0.0, seed=None, lookup=False, auto_gamma=False),
                          explain=True, score_all=True)
        views = run_recorded(services, sess, job, prompt, True, cfg, sess.memory, "teach")
        view = next(views)      # started: the status line follows the passes
        for _ in views:
            if not view.done:
                yield gr.skip(), status_line(services, sess, "teach"), sess
        sess.teach, sess.teach_step = view, 0
        job.summary = done_sentence(view) + " Step through the iterations below."
    yield teach_view(services, sess, 0), status_line(services, sess, "teach"), sess


def teach_step(services: Services, delta: int, sess: Session | None):
    return teach_view(services, sess, sess.teach_step + int(delta) if isinstance(sess, Session) else 0), sess


def teach_play(services: Services, sess: Session | None):
    """Play, and each tick of the autoplay timer: one iteration further, until the last. -> (view, timer, session)"""
    view, sess = teach_step(services, 1, sess)
    more = (isinstance(sess, Session) and sess.teach is not None
            and sess.teach_step < len(_blocks(sess.teach.events)) - 1)
    return view, gr.Timer(active=more), sess


# -- the tab -----------------------------------------------------------------------------------
def build(page: Page):
    services, s, sess, light = page.services, page.settings, page.sess, page.light
    with gr.Tab("Teach", id="teach", elem_id="tab-teach"):
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Row():
                    t_prompt = gr.Textbox(label="Prompt", lines=2, value=EXAMPLES[2], scale=3, elem_id="t-prompt")
                    with gr.Column(scale=1, min_width=160, elem_classes=HIDE_PRESENT):
                        t_method = dropdown("Teach's method", [m for m in METHODS if m != "ar"], value="csd",
                                            label="Method", elem_id="t-method")
                        t_max = slider("Teach's max new tokens", 4, 128, note="(a short run, to step through)",
                                       value=s.teach_tokens, step=1, label="Max new tokens", elem_id="teach-max")
                with gr.Row(equal_height=False):
                    t_run = gr.Button("Run", variant="primary", elem_id="teach-run", min_width=80)
                    t_prev = gr.Button("◀ Previous", elem_id="teach-prev", min_width=90)
                    t_next = gr.Button("Next ▶", elem_id="teach-next", min_width=90)
                    t_play = gr.Button("Play", elem_id="teach-play", min_width=70)
                    t_stop = gr.Button("Stop", variant="stop", elem_id="teach-stop", min_width=70)
                t_status = gr.HTML(render.render_status("Ready."), elem_id="teach-status")
                t_view = gr.HTML(teach_view(services, None, 0), elem_id="teach-view")
            with gr.Column(scale=2, min_width=280):
                def explanation(mode: str = "") -> str:
                    return TEACH_EXPLANATION.replace("{exactness}", exactness_note(
                        services.pair.rep.target, mode or services.default_activations))
                page.exactness.append((gr.Markdown(explanation(), elem_id="teach-explanation"), explanation))
        teach_timer = gr.Timer(2.0, active=False)
    page.status["teach"] = t_status

    def wire():
        page.model_job(t_run, "teach", page.handler(teach_run),
                       page.named(("prompt", "method", "gamma", "lam", "log10_tau", "max_new_tokens"), prompt=t_prompt,
                                  method=t_method, max_new_tokens=t_max), [t_view, t_status, sess],
                       "teach_run", check_in=(t_method, page.gamma, page.lam, page.log10_tau, t_max))
        t_prev.click(partial(teach_step, services, -1), [sess], [t_view, sess], api_name="teach_prev", **light)
        t_next.click(partial(teach_step, services, 1), [sess], [t_view, sess], api_name="teach_next", **light)
        t_play.click(partial(teach_play, services), [sess], [t_view, teach_timer, sess], api_name="teach_play", **light)
        teach_timer.tick(partial(teach_play, services), [sess], [t_view, teach_timer, sess],
                         api_visibility="private", show_progress="hidden", **light)
        t_stop.click(lambda: gr.Timer(active=False), None, teach_timer, queue=False, api_visibility="private")
        t_stop.click(partial(stop, services, "teach"), sess, t_status, queue=False, api_name="stop_teach",
                     show_progress="hidden")
    return wire
