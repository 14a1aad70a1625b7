"""``build_demo(services) -> gr.Blocks``: the layout and the declarative wiring of the handlers.

Every endpoint has an ``api_name`` so that ``gradio_client`` can drive the app step by step.
Model work (generate, compare, teach, calibrate) shares one concurrency group whose limit is
``settings.concurrency``; a click first registers the request in the model lane (in the light
group, at once), so that its status line, beside the button, can say what is ahead of it and
Stop can cancel it before it starts. The chart and table handlers run beside the model group.
"""
from __future__ import annotations

from functools import partial

import gradio as gr

from csd.config import METHOD_HELP, METHODS
from csd.events import REJECTED, RESCUED, STATUSES

from . import figures, render
from .state import Services
from .tabs import analyse, common, compare, explore, generate, jobs, teach

EXAMPLES = [
    # GSM8K test set, item 1
    "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
    "How much in dollars does she make every day at the farmers' market?",
    # HumanEval/0
    'Complete this Python function.\n\nfrom typing import List\n\n\ndef has_close_elements(numbers: List[float], '
    'threshold: float) -> bool:\n    """ Check if in given list of numbers, are any two numbers closer to each other '
    'than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> '
    'has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n',
    # prose
    "Write a short paragraph about why people enjoy walking in the mountains.",
]

MODEL_GROUP = "model"
HIDE_PRESENT = ["csd-hide-present"]


def theme() -> gr.themes.Base:
    """Gradio's default look with system fonts only (nothing is fetched from a font server)."""
    return gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial",
              "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"])


def launch_kwargs() -> dict:
    """What gradio 6 takes at ``launch()`` rather than in ``Blocks()``, plus the privacy options."""
    return dict(theme=theme(), css=render.CSS, head=render.JS, share=False, ssr_mode=False, enable_monitoring=False,
                run_history=False, footer_links=["api", "settings"], max_file_size="64mb")


def header(services: Services) -> str:
    """The models and how they run here (``pair.describe()``), and the paper."""
    d = services.pair.describe()
    md = render.esc_md
    return (f"Draft **{md(d['draft'] or '–')}** → target **{md(d['target'])}** · target {md(d['target_repr'])}"
            + (f" ({md(d['target_impl'])} path)" if d.get("target_impl") else "")
            + (f", activations smoothed ({md(d['target_smoothing'])})" if d.get("target_smoothing") else "") + ", "
            f"draft {md(d['draft_repr'] or '–')}" + (f" ({md(d['draft_impl'])} path)" if d.get("draft_impl") else "")
            + f" · {md(d['device'])}, {d['threads']} threads · paper: [arXiv 2604.13634]({render.PAPER_URL})")


def build_demo(services: Services) -> gr.Blocks:
    s = services.settings
    light = dict(concurrency_limit=8, concurrency_id="light")
    model = dict(concurrency_limit=s.concurrency, concurrency_id=MODEL_GROUP)
    scope_choices = common.scopes(services)

    with gr.Blocks(title="CSD Explorer", analytics_enabled=False) as demo:
        sess = gr.State(None)   # a Session, made by the first handler that needs it (ensure_session)
        status_timer = gr.Timer(s.status_interval_s, active=False)
        with gr.Row(equal_height=True):
            with gr.Column(scale=4, min_width=300):
                gr.Markdown("## CSD Explorer — Calibrated Speculative Decoding, token by token", elem_id="title")
                gr.Markdown(header(services), elem_id="header", elem_classes=HIDE_PRESENT)
            with gr.Column(scale=1, min_width=200):
                present = gr.Checkbox(False, label="Presentation mode (large answer, settings hidden)",
                                      elem_id="present")
        with gr.Row(equal_height=True, elem_classes=HIDE_PRESENT):
            gamma = gr.Slider(1, 32, value=6, step=1, label="γ (draft block length)", elem_id="gamma")
            auto_gamma = gr.Checkbox(True, label="γ = auto (per block, from this machine's measured costs; "
                                     "Generate and Compare; Teach keeps the number)", elem_id="auto-gamma")
            lam = gr.Slider(0, 64, value=6, step=1, label="λ (memory count threshold)", elem_id="lam")
            log10_tau = gr.Slider(-4, 0, value=-2, step=0.05, label="log₁₀ τ (gate threshold, τ up to 1)",
                                  elem_id="log10-tau")
            tau_text = gr.Markdown(common.describe_tau(-2), elem_id="tau-text")

        with gr.Tabs(elem_id="tabs"):
            # -- Generate -------------------------------------------------------------------------
            with gr.Tab("Generate", id="generate", elem_id="tab-generate"):
                with gr.Row():
                    with gr.Column(scale=2):
                        prompt = gr.Textbox(label=f"Prompt (at most {s.max_prompt_tokens:,} tokens)", lines=3,
                                            max_lines=14, value=EXAMPLES[0], elem_id="prompt")
                        with gr.Row(equal_height=False):
                            gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", scale=0,
                                                min_width=120)
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=0, min_width=90)
                            with gr.Column(scale=3, min_width=220):
                                gen_status = gr.HTML(render.render_status("Ready."), elem_id="gen-status")
                        gr.Examples([[e] for e in EXAMPLES], inputs=[prompt], label="Examples (GSM8K, HumanEval, prose)",
                                    elem_id="examples")
                    with gr.Column(scale=1, elem_classes=HIDE_PRESENT):
                        method = gr.Dropdown([(f"{m} — {METHOD_HELP[m]}", m) for m in METHODS], value="csd",
                                             label="Method", elem_id="method")
                        chat = gr.Checkbox(True, label="Chat template (instruct models)")
                        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                        max_new = gr.Slider(1, s.max_new_tokens_limit, value=s.max_new_tokens, step=1,
                                            label="Max new tokens", elem_id="max-new")
                        seed = gr.Number(0, precision=0, minimum=0, label="Seed (sampling only)")
                        lookup = gr.Checkbox(True, label=f"Copy from the context: propose up to {generate.LOOKUP_TOKENS} "
                                             "tokens that followed the last few earlier, where the costs say it "
                                             "pays (sd and csd; underlined)", elem_id="lookup")
                gr.HTML(render.render_legend(), elem_id="legend")
                tokens = gr.HTML(render.render_tokens([]), elem_id="tokens")
                gr.HTML(render.detail_panel(), elem_id="tokens-detail")
                summary = gr.HTML("", elem_id="summary")
                whatif_md = gr.Markdown(elem_id="whatif-line")
                with gr.Row(elem_classes=HIDE_PRESENT):
                    hide_rejected = gr.Checkbox(False, label="Hide rejected draft tokens", elem_id="hide-rejected")
                    export_btn = gr.Button("Export the coloured answer (HTML + JSON)", elem_id="export-btn")
                export_files = gr.File(label="Coloured answer", file_count="multiple", visible=False,
                                       elem_id="export-files")
                metrics = gr.HTML(render.render_metrics(None), elem_id="metrics")
                with gr.Accordion("Metrics as JSON", open=False, elem_classes=HIDE_PRESENT):
                    metrics_json = gr.JSON(elem_id="metrics-json")

            # -- Compare --------------------------------------------------------------------------
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                gr.Markdown("The same prompt with AR, SD and CSD, one after another (greedy, γ/λ/τ from the bar "
                            "above). Speculative decoding saves **target passes**; whether it also saves time "
                            "depends on what a pass costs on this machine (explained below the answers).")
                gr.HTML(render.render_legend(whatif=False, diff=True), elem_id="compare-legend")
                with gr.Row():
                    with gr.Column(scale=3):
                        c_prompt = gr.Textbox(label=f"Prompt (at most {s.max_prompt_tokens:,} tokens)", lines=3,
                                              value=EXAMPLES[1], elem_id="c-prompt")
                        with gr.Row(equal_height=False):
                            c_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=0,
                                              min_width=120)
                            c_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop", scale=0, min_width=90)
                            with gr.Column(scale=3, min_width=220):
                                c_status = gr.HTML(render.render_status("Ready."), elem_id="compare-status")
                    with gr.Column(scale=1):
                        c_chat = gr.Checkbox(True, label="Chat template")
                        c_max = gr.Slider(1, s.max_new_tokens_limit, value=s.compare_tokens, step=1,
                                          label="Max new tokens", elem_id="c-max-new")
                with gr.Row(equal_height=False):
                    panes, caps = [], []
                    for m in compare.COMPARE_METHODS:
                        with gr.Column(min_width=240):
                            caps.append(gr.Markdown(f"**{m.upper()}**", elem_id=f"cap-{m}"))
                            panes.append(gr.HTML(render.render_tokens([], empty="not run yet", view=f"pane-{m}",
                                                                      panel="compare"),
                                                 elem_id=f"pane-{m}"))
                gr.HTML(render.detail_panel(), elem_id="compare-detail")
                c_note = gr.Markdown(compare.compare_note({}), elem_id="compare-note")
                c_fig = gr.Plot(figures.make_compare_figure({}), label="Target passes, wall time, tokens/s",
                                show_label=False, elem_id="compare-plot")

            # -- Analyse --------------------------------------------------------------------------
            with gr.Tab("Analyse", id="analyse", elem_id="tab-analyse") as analyse_tab:
                gr.HTML(render.render_legend(), elem_id="analyse-legend")
                with gr.Row():
                    scope = gr.Radio(scope_choices, value=common.SCOPE_SESSION, label="Scope", elem_id="scope",
                                     info="'all runs' is shared: it shows every user's answers" if s.shared_scope
                                     else "Only your own runs are shown in this app.")
                    a_refresh = gr.Button("Refresh", scale=0)
                a_summary = gr.Markdown(elem_id="analyse-summary")
                with gr.Row():
                    pareto = gr.Plot(label="Pareto chart", show_label=False, elem_id="pareto-plot")
                    gaps = gr.Plot(label="Logit gaps", show_label=False, elem_id="gap-plot")
                with gr.Row():
                    positions = gr.Plot(label="Acceptance by position", show_label=False, elem_id="position-plot")
                    heat = gr.Plot(label="What-if heatmap", show_label=False, elem_id="whatif-plot")
                with gr.Accordion("Speed / quality frontier of the shipped benchmark (λ/τ settings)", open=False,
                                  elem_id="frontier-panel"):
                    frontier_data = figures.load_frontier(s.frontier_file)
                    gr.Plot(figures.make_frontier_figure(frontier_data), show_label=False, elem_id="frontier-plot")
                    gr.Markdown(figures.frontier_table(frontier_data), elem_id="frontier-table")
                a_heading = gr.Markdown("**Last answer under the λ/τ sliders**", elem_id="analyse-heading")
                a_tokens = gr.HTML(render.render_tokens([], view="analyse-tokens"), elem_id="analyse-tokens")
                gr.HTML(render.detail_panel(), elem_id="analyse-tokens-detail")

            # -- Explore & memory -----------------------------------------------------------------
            with gr.Tab("Explore & memory", id="explore", elem_id="tab-explore") as explore_tab:
                gr.Markdown("### Divergence events")
                with gr.Row():
                    e_scope = gr.Radio(scope_choices, value=common.SCOPE_SESSION, label="Scope", elem_id="e-scope",
                                       info="'all runs' is shared: it shows every user's answers" if s.shared_scope
                                       else None)
                    e_run = gr.Number(0, precision=0, label="Run id (0 = the scope)", minimum=0)
                    e_status = gr.CheckboxGroup(list(STATUSES), value=[RESCUED, REJECTED], label="Status",
                                                elem_id="e-status")
                with gr.Row():
                    e_pattern = gr.Dropdown([("any", "any")], value="any", label="Pattern (x~ → t*)",
                                            allow_custom_value=True)
                    e_text = gr.Textbox(label="Text contains", placeholder="token, draft, target or context text",
                                        elem_id="e-text")
                    with gr.Column(scale=0, min_width=160):
                        e_btn = gr.Button("Show events", variant="primary", elem_id="events-btn")
                        e_csv_btn = gr.Button("Export these events as CSV", elem_id="export-csv-btn")
                e_caption = gr.Markdown(elem_id="events-caption")
                e_csv = gr.DownloadButton("Download CSV", visible=False, elem_id="events-csv")
                e_table = gr.Dataframe(headers=explore.EVENT_COLUMNS, interactive=False, wrap=True, max_height=420,
                                       elem_id="events-table")

                gr.Markdown("### Correction memory (this session's copy)")
                m_summary = gr.Markdown(elem_id="memory-summary")
                with gr.Row():
                    with gr.Column(scale=2):
                        m_table = gr.Dataframe(headers=explore.MEMORY_COLUMNS, interactive=False, max_height=360,
                                               elem_id="memory-table")
                    with gr.Column(scale=1):
                        m_mode = gr.Radio([explore.CAL_PROMPTS, explore.CAL_TEXT], value=explore.CAL_PROMPTS, label="Calibrate on",
                                          elem_id="cal-mode")
                        m_source = gr.Radio([explore.SRC_SHIPPED, explore.SRC_UPLOAD], value=explore.SRC_SHIPPED, label="From",
                                            elem_id="cal-source")
                        m_corpus = gr.File(label="Prompts (.jsonl: a 'prompt' per line, or .txt: one per line) or "
                                           "text (.txt, .jsonl 'text')", file_types=[".txt", ".jsonl", ".md", ".py"],
                                           type="filepath")
                        with gr.Row():
                            m_prompts = gr.Number(s.calibrate_prompts, precision=0, minimum=1, label="Prompts",
                                                  elem_id="cal-prompts")
                            m_answer = gr.Number(s.calibrate_answer_tokens, precision=0, minimum=1,
                                                 label="Answer tokens each", elem_id="cal-answer")
                            m_positions = gr.Number(s.calibrate_positions, precision=0, minimum=1,
                                                    label="Text positions", elem_id="cal-positions")
                        with gr.Row(equal_height=True):
                            m_cal = gr.Button("Calibrate", variant="primary", elem_id="calibrate-btn", scale=0,
                                              min_width=110)
                            m_stop = gr.Button("Stop", variant="stop", elem_id="calibrate-stop", scale=0, min_width=80)
                        m_status = gr.HTML(render.render_status("Ready."), elem_id="calibrate-status")
                        with gr.Row():
                            m_reset = gr.Button("Reset to default")
                            m_clear = gr.Button("Clear")
                        m_dl_btn = gr.Button("Save memory to a file")
                        m_upload = gr.UploadButton("Upload memory file (.json / .json.gz)", type="filepath",
                                                   file_types=[".json", ".gz"], elem_id="memory-upload")
                        m_file = gr.DownloadButton("Download csd-memory.json.gz", visible=False)
                        m_error = gr.HTML(elem_id="memory-error")

            # -- Teach ----------------------------------------------------------------------------
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
                        t_view = gr.HTML(teach.teach_view(services, None, 0), elem_id="teach-view")
                    with gr.Column(scale=2, min_width=280):
                        gr.Markdown(render.TEACH_EXPLANATION, elem_id="teach-explanation")
                teach_timer = gr.Timer(2.0, active=False)

        # -- wiring -------------------------------------------------------------------------------
        log10_tau.change(common.describe_tau, log10_tau, tau_text, api_visibility="private", show_progress="hidden",
                         **light)
        present.change(None, present, None, js=render.PRESENT_JS, api_visibility="private")
        status_io = ([sess], [gen_status, c_status, t_status, m_status, status_timer])
        status_timer.tick(partial(jobs.poll_status, services), *status_io, queue=False,
                          show_progress="hidden", api_visibility="private")

        def model_job(btn, kind: str, status, fn, inputs, outputs, api_name: str, prompt_in=()):
            """A click: the request is checked and joins the lane at once (in the light group, which
            no model work holds up; a refusal is a toast), then, if it was not refused, the model's
            queued handler runs."""
            ask = btn.click(partial(jobs.request_job, services, kind), [sess, *prompt_in], [sess, status, status_timer],
                            show_progress="hidden", api_visibility="private", **light)
            run = ask.success(fn, inputs, outputs, api_name=api_name, show_progress="hidden", **model)
            # the last word on the status lines: a timer tick computed just before the run ended can land
            # after the run's last update and show it still running; this poll is sent after the run ends
            run.then(partial(jobs.poll_status, services), *status_io, queue=False, show_progress="hidden",
                     api_visibility="private")
            return run

        gen = model_job(gen_btn, "generate", gen_status, partial(generate.generate, services),
                        [prompt, chat, method, gamma, auto_gamma, lam, log10_tau, temperature, max_new, seed,
                         hide_rejected, lookup, sess],
                        [tokens, summary, metrics, metrics_json, whatif_md, gen_status, sess], "generate",
                        prompt_in=(prompt, chat))
        analyse_inputs = [scope, lam, log10_tau, hide_rejected, sess]
        analyse_outputs = [pareto, gaps, positions, heat, a_summary, a_heading, a_tokens, sess]
        gen.then(partial(analyse.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private",
                 show_progress="hidden", **light)
        stop_btn.click(partial(jobs.stop, services, "generate"), sess, gen_status, queue=False, api_name="stop")
        c_stop.click(partial(jobs.stop, services, "compare"), sess, c_status, queue=False, api_name="stop_compare")
        m_stop.click(partial(jobs.stop, services, "calibrate"), sess, m_status, queue=False, api_name="stop_calibrate")

        recolour_io = ([lam, log10_tau, hide_rejected, sess], [tokens, whatif_md, sess])
        for ctl in (lam, log10_tau, hide_rejected):
            named = dict(api_name="recolour") if ctl is log10_tau else dict(api_visibility="private")
            ev = ctl.change(partial(generate.recolour, services), *recolour_io, show_progress="hidden", **named, **light)
            ev.then(partial(analyse.analyse, services), analyse_inputs, analyse_outputs, show_progress="hidden",
                    api_visibility="private", **light)
        export_btn.click(partial(generate.export_answer, services), [lam, log10_tau, sess], [export_files, sess],
                         api_name="export_answer", **light)

        cmp = model_job(c_btn, "compare", c_status, partial(compare.compare, services),
                        [c_prompt, c_chat, gamma, auto_gamma, lam, log10_tau, c_max, sess],
                        [*panes, *caps, c_fig, c_note, c_status, sess], "compare", prompt_in=(c_prompt, c_chat))
        cmp.then(partial(analyse.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private",
                 show_progress="hidden", **light)

        a_refresh.click(partial(analyse.analyse, services), analyse_inputs, analyse_outputs, api_name="analyse", **light)
        for trigger in (scope.change, analyse_tab.select):
            trigger(partial(analyse.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private", **light)

        ev_inputs = [e_scope, e_run, e_status, e_pattern, e_text, sess]
        e_btn.click(partial(explore.explore_events, services), ev_inputs, [e_table, e_caption, e_pattern, e_csv, sess],
                    api_name="explore_events", **light)
        e_csv_btn.click(partial(explore.export_events_csv, services), ev_inputs, [e_csv, sess], api_name="export_csv",
                        **light)
        for ctl in (e_scope, e_run, e_status, e_pattern, e_text):   # a prepared file must match the filters
            ctl.change(explore.hide_download, None, e_csv, queue=False, show_progress="hidden", api_visibility="private")
        mem_out = [m_summary, m_table, sess]
        explore_tab.select(partial(explore.memory_view, services), [lam, sess], mem_out, api_name="memory_view", **light)
        explore_tab.select(partial(explore.explore_events, services), ev_inputs, [e_table, e_caption, e_pattern, e_csv, sess],
                           api_visibility="private", **light)
        model_job(m_cal, "calibrate", m_status, partial(explore.calibrate_memory, services),
                  [m_mode, m_source, m_corpus, m_prompts, m_answer, m_positions, lam, sess],
                  [m_summary, m_table, m_status, sess], "calibrate")
        m_reset.click(partial(explore.memory_reset, services, "default"), [lam, sess], mem_out, api_name="memory_reset",
                      **light)
        m_clear.click(partial(explore.memory_reset, services, "clear"), [lam, sess], mem_out, api_name="memory_clear",
                      **light)
        m_dl_btn.click(partial(explore.memory_download, services), [sess], [m_file, sess], api_name="memory_download",
                       **light)
        m_upload.upload(partial(explore.memory_upload, services), [m_upload, lam, sess], [m_summary, m_table, m_error, sess],
                        api_name="memory_upload", **light)

        model_job(t_run, "teach", t_status, partial(teach.teach_run, services),
                  [t_prompt, t_method, gamma, lam, log10_tau, t_max, sess], [t_view, t_status, sess], "teach_run",
                  prompt_in=(t_prompt,))
        t_prev.click(partial(teach.teach_step, services, -1), [sess], [t_view, sess], api_name="teach_prev", **light)
        t_next.click(partial(teach.teach_step, services, 1), [sess], [t_view, sess], api_name="teach_next", **light)
        t_play.click(partial(teach.teach_play, services), [sess], [t_view, teach_timer, sess], api_name="teach_play",
                     **light)
        teach_timer.tick(partial(teach.teach_tick, services), [sess], [t_view, teach_timer, sess],
                         api_visibility="private", show_progress="hidden", **light)
        t_stop.click(teach.teach_pause, None, teach_timer, queue=False, api_visibility="private")
        t_stop.click(partial(jobs.stop, services, "teach"), sess, t_status, queue=False, api_name="stop_teach")

    demo.queue(max_size=s.queue_size, default_concurrency_limit=s.concurrency)
    return demo
