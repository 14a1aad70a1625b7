"""``build_demo(services) -> gr.Blocks``: the layout and the declarative wiring of the handlers.

Every endpoint has an ``api_name`` so that ``gradio_client`` can drive the app step by step.
Model work (generate, compare, teach, calibrate) shares one concurrency group whose limit is
``settings.concurrency``; the chart and table handlers run beside it without touching a model.
"""
from __future__ import annotations

from functools import partial

import gradio as gr

from csd.config import METHOD_HELP, METHODS
from csd.events import REJECTED, RESCUED, STATUSES

from . import figures, handlers as H, render
from .state import Services

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


def theme() -> gr.themes.Base:
    """Gradio's default look with system fonts only (nothing is fetched from a font server)."""
    return gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial",
              "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"])


def launch_kwargs() -> dict:
    """What gradio 6 takes at ``launch()`` rather than in ``Blocks()``, plus the privacy options."""
    return dict(theme=theme(), css=render.CSS, share=False, ssr_mode=False, enable_monitoring=False,
                run_history=False, footer_links=["api", "settings"], max_file_size="64mb")


def build_demo(services: Services) -> gr.Blocks:
    s = services.settings
    p = services.pair
    light = dict(concurrency_limit=8, concurrency_id="light")
    model = dict(concurrency_limit=s.concurrency, concurrency_id=MODEL_GROUP)

    with gr.Blocks(title="CSD Explorer", analytics_enabled=False) as demo:
        sess = gr.State(None)   # a Session, made by the first handler that needs it (ensure_session)
        gr.Markdown(f"## CSD Explorer — Calibrated Speculative Decoding, token by token\n"
                    f"Draft **{p.draft_name or '–'}** → target **{p.target_name}** · "
                    f"target {p.target_repr}, draft {p.draft_dtype or '–'}, on {p.device}")
        with gr.Row(equal_height=True):
            gamma = gr.Slider(1, 32, value=6, step=1, label="γ (draft block length)", elem_id="gamma")
            lam = gr.Slider(0, 64, value=6, step=1, label="λ (memory count threshold)", elem_id="lam")
            log10_tau = gr.Slider(-4, 0, value=-2, step=0.05, label="log₁₀ τ (gate threshold, τ up to 1)",
                                  elem_id="log10-tau")
            tau_text = gr.Markdown(H.describe_tau(-2), elem_id="tau-text")

        with gr.Tabs(elem_id="tabs"):
            # -- Generate -------------------------------------------------------------------------
            with gr.Tab("Generate", id="generate", elem_id="tab-generate"):
                with gr.Row():
                    with gr.Column(scale=2):
                        prompt = gr.Textbox(label="Prompt", lines=4, max_lines=14, value=EXAMPLES[0],
                                            elem_id="prompt")
                        gr.Examples([[e] for e in EXAMPLES], inputs=[prompt], label="Examples (GSM8K, HumanEval, prose)")
                    with gr.Column(scale=1):
                        method = gr.Dropdown([(f"{m} — {METHOD_HELP[m]}", m) for m in METHODS], value="csd",
                                             label="Method", elem_id="method")
                        chat = gr.Checkbox(True, label="Chat template (instruct models)")
                        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                        max_new = gr.Slider(1, s.max_new_tokens_limit, value=s.max_new_tokens, step=1,
                                            label="Max new tokens", elem_id="max-new")
                        seed = gr.Number(0, precision=0, minimum=0, label="Seed (sampling only)")
                        with gr.Row():
                            gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                gr.HTML(render.render_legend())
                hide_rejected = gr.Checkbox(False, label="Hide rejected draft tokens", elem_id="hide-rejected")
                tokens = gr.HTML(render.render_tokens([]), elem_id="tokens")
                whatif_md = gr.Markdown(elem_id="whatif-line")
                metrics = gr.HTML(render.render_metrics(None), elem_id="metrics")
                with gr.Accordion("Metrics as JSON", open=False):
                    metrics_json = gr.JSON(elem_id="metrics-json")
                stop_note = gr.Markdown(visible=False)

            # -- Compare --------------------------------------------------------------------------
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                gr.Markdown("The same prompt with AR, SD and CSD, one after another (greedy, γ/λ/τ from the bar "
                            "above). Tokens where a method's text departs from AR's are underlined in magenta.")
                with gr.Row():
                    c_prompt = gr.Textbox(label="Prompt", lines=3, value=EXAMPLES[1], scale=3, elem_id="c-prompt")
                    with gr.Column(scale=1):
                        c_chat = gr.Checkbox(True, label="Chat template")
                        c_max = gr.Slider(1, s.max_new_tokens_limit, value=s.compare_tokens, step=1,
                                          label="Max new tokens", elem_id="c-max-new")
                        with gr.Row():
                            c_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                            c_stop = gr.Button("Stop", variant="stop")
                with gr.Row(equal_height=False):
                    panes, caps = [], []
                    for m in H.COMPARE_METHODS:
                        with gr.Column():
                            caps.append(gr.Markdown(f"**{m.upper()}**"))
                            panes.append(gr.HTML(render.render_tokens([], empty="not run yet"), elem_id=f"pane-{m}"))
                c_fig = gr.Plot(figures.make_compare_figure({}), label="Wall time, target passes, tokens/s", show_label=False,
                                elem_id="compare-plot")

            # -- Analyse --------------------------------------------------------------------------
            with gr.Tab("Analyse", id="analyse", elem_id="tab-analyse") as analyse_tab:
                with gr.Row():
                    scope = gr.Radio(list(H.SCOPES), value="this session", label="Scope", elem_id="scope")
                    a_refresh = gr.Button("Refresh", scale=0)
                a_summary = gr.Markdown(elem_id="analyse-summary")
                with gr.Row():
                    pareto = gr.Plot(label="Pareto chart", show_label=False, elem_id="pareto-plot")
                    gaps = gr.Plot(label="Logit gaps", show_label=False, elem_id="gap-plot")
                with gr.Row():
                    positions = gr.Plot(label="Acceptance by position", show_label=False, elem_id="position-plot")
                    heat = gr.Plot(label="What-if heatmap", show_label=False, elem_id="whatif-plot")
                gr.Markdown("**Last answer under the λ/τ sliders** (changed decisions outlined)")
                a_tokens = gr.HTML(render.render_tokens([]), elem_id="analyse-tokens")

            # -- Explore & memory -----------------------------------------------------------------
            with gr.Tab("Explore & memory", id="explore", elem_id="tab-explore") as explore_tab:
                gr.Markdown("### Divergence events")
                with gr.Row():
                    e_scope = gr.Radio(list(H.SCOPES), value="this session", label="Scope")
                    e_run = gr.Number(0, precision=0, label="Run id (0 = the scope)", minimum=0)
                    e_status = gr.CheckboxGroup(list(STATUSES), value=[RESCUED, REJECTED], label="Status")
                with gr.Row():
                    e_pattern = gr.Dropdown([("any", "any")], value="any", label="Pattern (x~ → t*)",
                                            allow_custom_value=True)
                    e_text = gr.Textbox(label="Text contains", placeholder="token, draft, target or context text")
                    with gr.Column(scale=0, min_width=160):
                        e_btn = gr.Button("Show events", variant="primary", elem_id="events-btn")
                        e_csv_btn = gr.Button("Export CSV")
                e_caption = gr.Markdown()
                e_table = gr.Dataframe(headers=H.EVENT_COLUMNS, interactive=False, wrap=True, max_height=420,
                                       elem_id="events-table")
                e_csv = gr.DownloadButton("Download CSV", visible=False, elem_id="events-csv")

                gr.Markdown("### Correction memory (this session's copy)")
                m_summary = gr.Markdown(elem_id="memory-summary")
                with gr.Row():
                    with gr.Column(scale=2):
                        m_table = gr.Dataframe(headers=H.MEMORY_COLUMNS, interactive=False, max_height=360,
                                               elem_id="memory-table")
                    with gr.Column(scale=1):
                        m_source = gr.Radio(["default corpus", "uploaded file"], value="default corpus",
                                            label="Calibrate from")
                        m_corpus = gr.File(label="Corpus (.txt or .jsonl)", file_types=[".txt", ".jsonl", ".md", ".py"],
                                           type="filepath")
                        m_positions = gr.Number(s.calibrate_positions, precision=0, minimum=1,
                                                label="Positions to count (≈190/s on 2 CPU cores)")
                        with gr.Row():
                            m_cal = gr.Button("Calibrate", variant="primary")
                            m_stop = gr.Button("Stop", variant="stop")
                        with gr.Row():
                            m_reset = gr.Button("Reset to default")
                            m_clear = gr.Button("Clear")
                        m_dl_btn = gr.Button("Save memory to a file")
                        m_upload = gr.UploadButton("Upload memory file (.json / .json.gz)", type="filepath",
                                                   file_types=[".json", ".gz"], elem_id="memory-upload")
                        m_file = gr.DownloadButton("Download csd-memory.json.gz", visible=False)
                        m_error = gr.HTML()

            # -- Teach ----------------------------------------------------------------------------
            with gr.Tab("Teach", id="teach", elem_id="tab-teach"):
                with gr.Row():
                    with gr.Column(scale=3):
                        with gr.Row():
                            t_prompt = gr.Textbox(label="Prompt", lines=2, value=EXAMPLES[2], scale=3)
                            with gr.Column(scale=1):
                                t_method = gr.Dropdown([m for m in METHODS if m != "ar"], value="csd", label="Method")
                                t_max = gr.Slider(4, 128, value=s.teach_tokens, step=1, label="Max new tokens",
                                                  elem_id="teach-max")
                        with gr.Row():
                            t_run = gr.Button("Run and step through", variant="primary", elem_id="teach-run")
                            t_prev = gr.Button("◀ Previous iteration", elem_id="teach-prev")
                            t_next = gr.Button("Next iteration ▶", elem_id="teach-next")
                        t_view = gr.HTML(H.teach_view(None, 0), elem_id="teach-view")
                    with gr.Column(scale=2):
                        gr.Markdown(render.TEACH_EXPLANATION)

        # -- wiring -------------------------------------------------------------------------------
        log10_tau.change(H.describe_tau, log10_tau, tau_text, api_visibility="private", show_progress="hidden",
                         **light)

        gen = gen_btn.click(partial(H.generate, services),
                            [prompt, chat, method, gamma, lam, log10_tau, temperature, max_new, seed, hide_rejected, sess],
                            [tokens, metrics, metrics_json, whatif_md, sess], api_name="generate",
                            show_progress="minimal", show_progress_on=[metrics], **model)
        analyse_inputs = [scope, lam, log10_tau, hide_rejected, sess]
        analyse_outputs = [pareto, gaps, positions, heat, a_summary, a_tokens, sess]
        gen.then(partial(H.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private",
                 show_progress="hidden", **light)
        stop_btn.click(H.stop, sess, stop_note, queue=False, api_name="stop")
        for btn in (c_stop, m_stop):
            btn.click(H.stop, sess, stop_note, queue=False, api_visibility="private")

        recolour_io = ([lam, log10_tau, hide_rejected, sess], [tokens, whatif_md, sess])
        for ctl in (lam, log10_tau, hide_rejected):
            named = dict(api_name="recolour") if ctl is log10_tau else dict(api_visibility="private")
            ev = ctl.change(partial(H.recolour, services), *recolour_io, show_progress="hidden", **named, **light)
            ev.then(partial(H.analyse, services), analyse_inputs, analyse_outputs, show_progress="hidden",
                    api_visibility="private", **light)

        cmp = c_btn.click(partial(H.compare, services), [c_prompt, c_chat, gamma, lam, log10_tau, c_max, sess],
                          [*panes, *caps, c_fig, sess], api_name="compare", show_progress="minimal",
                          show_progress_on=[c_fig], **model)
        cmp.then(partial(H.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private",
                 show_progress="hidden", **light)

        a_refresh.click(partial(H.analyse, services), analyse_inputs, analyse_outputs, api_name="analyse", **light)
        for trigger in (scope.change, analyse_tab.select):
            trigger(partial(H.analyse, services), analyse_inputs, analyse_outputs, api_visibility="private", **light)

        ev_inputs = [e_scope, e_run, e_status, e_pattern, e_text, sess]
        e_btn.click(partial(H.explore_events, services), ev_inputs, [e_table, e_caption, e_pattern, sess],
                    api_name="explore_events", **light)
        e_csv_btn.click(partial(H.export_events_csv, services), ev_inputs, [e_csv, sess], api_name="export_csv",
                        **light)
        mem_out = [m_summary, m_table, sess]
        explore_tab.select(partial(H.memory_view, services), [lam, sess], mem_out, api_name="memory_view", **light)
        explore_tab.select(partial(H.explore_events, services), ev_inputs, [e_table, e_caption, e_pattern, sess],
                           api_visibility="private", **light)
        m_cal.click(partial(H.calibrate_memory, services), [m_source, m_corpus, m_positions, lam, sess], mem_out,
                    api_name="calibrate", show_progress="full", show_progress_on=[m_summary], **model)
        m_reset.click(partial(H.memory_reset, services, "default"), [lam, sess], mem_out, api_name="memory_reset",
                      **light)
        m_clear.click(partial(H.memory_reset, services, "clear"), [lam, sess], mem_out, api_name="memory_clear",
                      **light)
        m_dl_btn.click(partial(H.memory_download, services), [sess], [m_file, sess], api_name="memory_download",
                       **light)
        m_upload.upload(partial(H.memory_upload, services), [m_upload, lam, sess], [m_summary, m_table, m_error, sess],
                        api_name="memory_upload", **light)

        t_run.click(partial(H.teach_run, services), [t_prompt, t_method, gamma, lam, log10_tau, t_max, sess],
                    [t_view, sess], api_name="teach_run", show_progress="full", show_progress_on=[t_view], **model)
        t_prev.click(partial(H.teach_step, -1), [sess], [t_view, sess], api_name="teach_prev", **light)
        t_next.click(partial(H.teach_step, 1), [sess], [t_view, sess], api_name="teach_next", **light)

    demo.queue(max_size=s.queue_size, default_concurrency_limit=s.concurrency)
    return demo
