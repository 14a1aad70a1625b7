"""The Generate tab: one answer, streamed one verify pass at a time and coloured by each token's fate;
recoloured under other λ/τ without the model; exported as HTML and JSON."""
from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

import gradio as gr

from csd.config import DEFAULT_LOOKUP, METHODS
from csd.events import RunMetrics

from .. import export, render
from ..rules import METHOD_SHORT
from ..state import RunSettings, RunView, Services, Session
from . import analyse
from .common import (
    MAX_NEW_BOX,
    SEED_BOX,
    TEMPERATURE_BOX,
    ensure_session,
    error,
    page_config,
    remember_ar,
    tau_from_log10,
    tokens_html,
)
from .inputs import dropdown, number, slider
from .jobs import done_sentence, in_lane, run_recorded, speculation_sentence, status_line, stop, take_job
from .page import EXAMPLES, HIDE_PRESENT, Page

LOOKUP_TOKENS = DEFAULT_LOOKUP   # the Generate tab's copy length when copying is on (the CLI's default --lookup)


def _pass_sentence(view: RunView) -> str:
    """What the pass that just arrived did (the burst on the page)."""
    last = view.events[-1].block
    evs = [e for e in view.events if e.block == last]
    if view.cfg.method == "ar":
        return f"Verify pass {last + 1}: one token (autoregressive)."
    drafted = sum(1 for e in evs if e.draft_id is not None)
    kept = sum(1 for e in evs if e.draft_id is not None and e.in_output)
    tail = "a free bonus token" if evs[-1].status == "bonus" else "the target's correction"
    n = evs[0].block_len or drafted
    return f"Verify pass {last + 1}: {kept} of {render.plural(n, 'drafted token')} kept, then {tail}."


def _metrics_html(sess: Session, view: RunView) -> str:
    ar = sess.ar_speed.get((view.prompt, view.chat)) if view.cfg.method != "ar" else None
    return export.render_metrics(view.metrics, running=not view.done, ar=ar, first_token_s=view.first_token_s,
                                 method=view.cfg.method)


def _metrics_json(m: RunMetrics | None) -> dict | None:
    """The one border where metrics become a dict: the JSON component."""
    return None if m is None else m.to_dict()


def generate(services: Services, prompt: str, s: RunSettings, sess: Session | None):
    """Stream one generation (every rule's scores logged, for Analyse), one burst per verify pass. Yields (tokens,
    rescue summary, metrics html, metrics json, what-if line, status line, session)."""
    sess, job = take_job(services, sess, "generate")
    if job.cancel:
        yield (gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), status_line(services, sess, "generate"), sess)
        return
    with in_lane(services, job):
        cfg = page_config(s, score_all=True)
        rule, hide = (cfg.lam, cfg.tau), s.hide_rejected
        views = run_recorded(services, sess, job, prompt, s.chat, cfg, sess.memory, "generate")
        view = sess.last = next(views)
        yield (tokens_html(view, rule, hide,
                           empty=f"Reading the prompt ({render.plural(view.prompt_tokens, 'token')}), "
                                 f"then the first draft block and its verify pass…"),
               "", export.render_metrics(None), None, "", status_line(services, sess, "generate"), sess)
        for _ in views:    # the same view, one pass further each time (done: answered below)
            if not view.done:
                yield (tokens_html(view, rule, hide), render.run_summary(view.events, cfg=cfg),
                       _metrics_html(sess, view), gr.skip(), render.esc_md(_pass_sentence(view)),
                       status_line(services, sess, "generate"), sess)
        remember_ar(sess, view)
        sentences = (done_sentence(view), speculation_sentence(view, s.gamma, (job.decoder or services.decoder).costs))
        job.summary = " ".join(filter(None, sentences))
    yield (tokens_html(view, rule, hide), render.run_summary(view.events, cfg=cfg), _metrics_html(sess, view),
           _metrics_json(view.metrics), render.esc_md(render.whatif_summary(view.events, cfg.lam, cfg.tau)),
           status_line(services, sess, "generate"), sess)


def recolour(services: Services, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """Recolour the last answer under other thresholds (no model runs). -> (tokens html, what-if line, session)"""
    sess = ensure_session(services, sess)
    lam, tau = float(lam), tau_from_log10(log10_tau)
    line = render.esc_md(render.whatif_summary(sess.last.events, lam, tau)) if sess.last is not None else ""
    return tokens_html(sess.last, (lam, tau), hide_rejected), line, sess


def export_answer(services: Services, lam, log10_tau, sess: Session | None):
    """The last answer as a self-contained coloured HTML page and as JSON. -> (files, session)."""
    sess = ensure_session(services, sess)
    view = sess.last
    if view is None or not view.events:
        raise error("Nothing to export yet: generate an answer first.")
    d = view.pair or services.pair.describe()       # the run's own: its draft may be the batcher's solo one
    facts = {"method": view.cfg.method, "γ": view.cfg.gamma, "λ": f"{view.cfg.lam:g}", "τ": f"{view.cfg.tau:.3g}",
             "draft": d["draft"], "target": d["target"], "representations": f"target {d['representation']['target']}, "
             f"draft {d['representation']['draft']}", "device": d["device"], **(view.cfg.rule_params() or {})}
    out = Path(tempfile.mkdtemp(prefix="csd-answer-"))
    page = export.render_export_html(view.events, prompt=view.prompt, title="CSD Explorer answer", facts=facts,
                                     metrics=view.metrics, cfg=view.cfg)
    (out / "csd-answer.html").write_text(page, encoding="utf-8")
    (out / "csd-answer.json").write_text(export.export_json(
        view.events, prompt=view.prompt, chat=view.chat, text=view.text, config=vars(view.cfg), pair=d,
        metrics=_metrics_json(view.metrics)), encoding="utf-8")
    return gr.update(value=[str(out / "csd-answer.html"), str(out / "csd-answer.json")], visible=True), sess


# the /generate API's values by position (scripts written before a switch existed leave it out: the later
# values have defaults); the rivals' parameters follow
API_ORDER = ("prompt", "chat", "method", "gamma", "auto_gamma", "lam", "log10_tau", "temperature", "max_new_tokens",
             "seed", "hide_rejected", "lookup", "show_spec")


def build(page: Page):
    services, s, sess, light = page.services, page.settings, page.sess, page.light
    lam, log10_tau = page.lam, page.log10_tau
    with gr.Tab("Generate", id="generate", elem_id="tab-generate"):
        with gr.Row():
            with gr.Column(scale=2):      # the prompt, the buttons and the answer right under them: in view
                prompt = gr.Textbox(label=f"Prompt (at most {s.max_prompt_tokens:,} tokens)", lines=3,
                                    max_lines=14, value=EXAMPLES[0], elem_id="prompt")
                with gr.Row(equal_height=False):
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", scale=0, min_width=120)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=0, min_width=90)
                    with gr.Column(scale=3, min_width=220):
                        gen_status = gr.HTML(render.render_status("Ready."), elem_id="gen-status")
                tokens = gr.HTML(render.render_tokens([]), elem_id="tokens")
                gr.HTML(render.detail_panel(), elem_id="tokens-detail")
                summary = gr.HTML("", elem_id="summary")
                whatif_md = gr.Markdown(elem_id="whatif-line")
            with gr.Column(scale=1, elem_classes=HIDE_PRESENT):
                # the colours' key at the column's top: in view beside the answer as it streams (1440x900)
                gr.HTML(render.render_legend(key=True, whatif=False), elem_id="legend-key")
                own = dict(     # Generate's own settings, by ``RunSettings`` field
                    method=dropdown("Method", [(f"{m} — {METHOD_SHORT[m]}", m) for m in METHODS], value="csd",
                                    label="Method", elem_id="method"),
                    chat=gr.Checkbox(True, label="Chat template (instruct models)"),
                    temperature=slider(TEMPERATURE_BOX, 0, 2, note="(0 = greedy)", value=0, step=0.05,
                                       label="Temperature (0 = greedy)", elem_id="temperature"),
                    max_new_tokens=slider(MAX_NEW_BOX, 1, s.max_new_tokens_limit, note="(this app's limit)",
                                          value=s.max_new_tokens, step=1, label="Max new tokens", elem_id="max-new"),
                    seed=number(SEED_BOX, optional=True, value=0, precision=0, minimum=0, label="Seed (sampling only)",
                                elem_id="seed"),
                    lookup=gr.Checkbox(True, label=f"Copy from the context: propose up to {LOOKUP_TOKENS} tokens "
                                       "that followed the last few earlier, where the costs say it pays (sd and csd; "
                                       "underlined)", elem_id="lookup"))
        gr.Examples([[e] for e in EXAMPLES], inputs=[prompt], label="Examples (GSM8K, HumanEval, prose)",
                    elem_id="examples")
        gr.HTML(render.render_legend(), elem_id="legend")
        with gr.Row(elem_classes=HIDE_PRESENT):
            hide_rejected = gr.Checkbox(False, label="Hide rejected draft tokens", elem_id="hide-rejected")
            reading = gr.Checkbox(False, label="Reading view: rejected draft tokens folded behind ⋯, a click opens "
                                  "them (on in presentation mode)", elem_id="reading-view")
            reading.change(None, reading, None, js=render.READING_JS, api_visibility="private")
            export_btn = gr.Button("Export the coloured answer (HTML + JSON)", elem_id="export-btn")
        export_files = gr.File(label="Coloured answer", file_count="multiple", visible=False, elem_id="export-files")
        metrics = gr.HTML(export.render_metrics(None), elem_id="metrics")
        with gr.Accordion("Metrics as JSON", open=False, elem_classes=HIDE_PRESENT):
            metrics_json = gr.JSON(elem_id="metrics-json")
    page.status["generate"], page.hide_rejected = gen_status, hide_rejected

    def wire():
        run_in = page.named(API_ORDER, prompt=prompt, hide_rejected=hide_rejected, **own)
        gen = page.model_job(gen_btn, "generate", page.handler(generate), run_in,
                             [tokens, summary, metrics, metrics_json, whatif_md, gen_status, sess], "generate",
                             check_in=(page.gamma, lam, log10_tau, *(own[k] for k in ("temperature", "max_new_tokens",
                                                                                       "seed", "method"))))
        analyse.refresh_after(page, gen)
        stop_btn.click(partial(stop, services, "generate"), sess, gen_status, queue=False, api_name="stop",
                       show_progress="hidden")

        recolour_io = ([lam, log10_tau, hide_rejected, sess], [tokens, whatif_md, sess])
        for ctl in (lam, log10_tau, hide_rejected):
            named = dict(api_name="recolour") if ctl is log10_tau else dict(api_visibility="private")
            ev = ctl.change(partial(recolour, services), *recolour_io, show_progress="hidden", **named, **light)
            analyse.refresh_after(page, ev)
        export_btn.click(partial(export_answer, services), [lam, log10_tau, sess], [export_files, sess],
                         api_name="export_answer", **light)
    return wire
