"""The Teach tab: a short run with explanations (draft and target top-k), stepped through one
speculative iteration at a time, by hand or by the autoplay timer.
"""
from __future__ import annotations

import time
from functools import partial

import gradio as gr

from csd.config import METHODS
from csd.events import REJECTED, TokenEvent

from .. import render
from ..state import Services, Session
from .common import ensure_session, error, page_config
from .jobs import done_sentence, follow_run, in_lane, recorded, start_run, status_line, stop, take_job
from .page import EXAMPLES, Page


def _blocks(events: list[TokenEvent]) -> list[list[TokenEvent]]:
    out: dict[int, list[TokenEvent]] = {}
    for e in events:
        out.setdefault(e.block, []).append(e)
    return [out[k] for k in sorted(out)]


def teach_view(services: Services | None, sess: Session | None, step: int) -> str:
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
    decode = services.pair.tokenizer.decode if services is not None else (lambda ids: "?")
    texts = [decode([i]) for i in (discarded[0] if discarded else [])]
    return render.render_teach_step(block, step=step, n_steps=len(blocks), text_before=before, lam=view.cfg.lam,
                                    tau=view.cfg.tau, method=view.cfg.method, discarded_texts=texts)


def teach_run(services: Services, prompt: str, method: str, gamma, lam, log10_tau, max_new_tokens,
              sess: Session | None):
    """Run a short generation with explanations (draft and target top-k, a fixed gamma), then
    show iteration 1. Yields (view, status line, session) as the passes arrive."""
    sess = ensure_session(services, sess)
    job = take_job(services, sess, "teach")
    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
        yield gr.skip(), status_line(services, sess, "teach"), sess
        return
    if method == "ar":
        services.lane.finish(job, "Not run: Teach needs a speculative method.")
        raise error("Teach steps through speculative iterations: pick sd, csd or an ablation, not ar.")
    with in_lane(services, job):
        cfg = page_config(method, gamma, lam, log10_tau, 0.0, max_new_tokens, explain=True)
        t0 = time.perf_counter()
        run, view = start_run(services, sess, job, prompt, True, cfg, sess.memory)
        with recorded(services, sess, prompt, cfg, "teach") as rec:
            for _ in follow_run(run, rec, view, t0):
                if not view.done:
                    yield gr.skip(), status_line(services, sess, "teach"), sess
        sess.teach, sess.teach_step = view, 0
        job.summary = done_sentence(view) + " Step through the iterations below."
    yield teach_view(services, sess, 0), status_line(services, sess, "teach"), sess


def teach_step(services: Services, delta: int, sess: Session | None):
    if not isinstance(sess, Session):
        return teach_view(services, None, 0), sess
    return teach_view(services, sess, sess.teach_step + int(delta)), sess


def teach_play(services: Services, sess: Session | None):
    """Play: step once now and let the autoplay timer go on. -> (view, timer, session)."""
    view, sess = teach_step(services, 1, sess)
    return view, gr.Timer(active=_teach_has_next(sess)), sess


def teach_tick(services: Services, sess: Session | None):
    """The autoplay timer: one iteration further; it stops itself at the last one."""
    view, sess = teach_step(services, 1, sess)
    return view, gr.Timer(active=_teach_has_next(sess)), sess


def teach_pause():
    return gr.Timer(active=False)


def _teach_has_next(sess: Session | None) -> bool:
    return isinstance(sess, Session) and sess.teach is not None and \
        sess.teach_step < len(_blocks(sess.teach.events)) - 1


# -- the tab ---------------------------------------------------------------------------------------
def build(page: Page):
    """Lay out the Teach tab; returns the function that wires its events."""
    services, s, sess, light = page.services, page.settings, page.sess, page.light
    gamma, lam, log10_tau = page.gamma, page.lam, page.log10_tau
    with gr.Tab("Teach", id="teach", elem_id="tab-teach"):
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Row():
                    t_prompt = gr.Textbox(label="Prompt", lines=2, value=EXAMPLES[2], scale=3,
                                          elem_id="t-prompt")
                    with gr.Column(scale=1, min_width=160):
                        t_method = gr.Dropdown([m for m in METHODS if m != "ar"], value="csd", label="Method",
                                               elem_id="t-method")
                        t_max = gr.Slider(4, 128, value=s.teach_tokens, step=1, label="Max new tokens",
                                          elem_id="teach-max")
                with gr.Row(equal_height=False):
                    t_run = gr.Button("Run", variant="primary", elem_id="teach-run", min_width=80)
                    t_prev = gr.Button("◀ Previous", elem_id="teach-prev", min_width=90)
                    t_next = gr.Button("Next ▶", elem_id="teach-next", min_width=90)
                    t_play = gr.Button("Play", elem_id="teach-play", min_width=70)
                    t_stop = gr.Button("Stop", variant="stop", elem_id="teach-stop", min_width=70)
                t_status = gr.HTML(render.render_status("Ready."), elem_id="teach-status")
                t_view = gr.HTML(teach_view(services, None, 0), elem_id="teach-view")
            with gr.Column(scale=2, min_width=280):
                gr.Markdown(render.TEACH_EXPLANATION, elem_id="teach-explanation")
        teach_timer = gr.Timer(2.0, active=False)
    page.status["teach"] = t_status

    def wire():
        page.model_job(t_run, "teach", partial(teach_run, services),
                       [t_prompt, t_method, gamma, lam, log10_tau, t_max, sess], [t_view, t_status, sess], "teach_run",
                       prompt_in=(t_prompt,))
        t_prev.click(partial(teach_step, services, -1), [sess], [t_view, sess], api_name="teach_prev", **light)
        t_next.click(partial(teach_step, services, 1), [sess], [t_view, sess], api_name="teach_next", **light)
        t_play.click(partial(teach_play, services), [sess], [t_view, teach_timer, sess], api_name="teach_play",
                     **light)
        teach_timer.tick(partial(teach_tick, services), [sess], [t_view, teach_timer, sess],
                         api_visibility="private", show_progress="hidden", **light)
        t_stop.click(teach_pause, None, teach_timer, queue=False, api_visibility="private")
        t_stop.click(partial(stop, services, "teach"), sess, t_status, queue=False, api_name="stop_teach")
    return wire
