"""``build_demo(services) -> gr.Blocks``: the page's frame (title, the bar of γ, λ, τ above the tabs, presentation
mode) with the tabs of ``csd.ui.tabs`` composed in it, and the launch options (docs/design.md, "The web app")."""
from __future__ import annotations

import logging
import re
from functools import partial

import anyio
import gradio as gr

from csd.config import GAMMA_RANGE, RIVAL_RANGES, CSDConfig
from csd.representation import Representation

from . import render
from .render import plural
from .rules import RIVAL_FIELDS
from .state import Services
from .tabs import analyse, compare, explore, generate, teach
from .tabs.common import GAMMA_BOX, LAM_BOX, LOG10_TAU_BOX, SHOW_SPECULATION, describe_tau
from .tabs.inputs import number, slider
from .tabs.jobs import poll_status
from .tabs.page import HIDE_PRESENT, LIGHT_GROUP, MODEL_GROUP, Page

log = logging.getLogger(__name__)

# a rival's parameter -> (label, hint, the number box's range and step), in the bar's folded panel
RIVAL_INPUTS = {
    "tau_lossy": ("lossy: τ", "keep p(x) ≥ τ·p(top-1)", dict(minimum=0.001, maximum=1, step=0.05)),
    "topk": ("top-k: k", "TensorRT-LLM's example", dict(minimum=1, step=1, precision=0)),
    "delta": ("top-k: δ", "p(x) ≥ p(top-1) − δ", dict(minimum=0, step=0.05)),
    "posterior_threshold": ("typical: threshold", "p(x) > min(thr, α·e^−H)", dict(minimum=0.001, maximum=1, step=0.01)),
    "posterior_alpha": ("typical: α", "vLLM's 0.3", dict(minimum=0.001, step=0.05)),
    "win_len": ("FLy: window", "needs γ above it", dict(minimum=2, maximum=32, step=1, precision=0)),
    "entropy_thre": ("FLy: entropy gate", "top-3; ≤ 0.01: off", dict(minimum=0, step=0.05)),
}


def launch_kwargs() -> dict:
    """What gradio 6 takes at ``launch()``, plus the privacy options; system fonts only (nothing is fetched)."""
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial",
              "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"])
    return dict(theme=theme, css=render.CSS, head=render.JS, share=False, ssr_mode=False, enable_monitoring=False,
                run_history=False, footer_links=["api", "settings"], max_file_size="64mb")


# a representation in a student's words
REPR_WORDS = {"int8": "8-bit integers", "int4": "4-bit integers", "ort4": "4-bit integers (ONNX Runtime)",
              "ov4": "4-bit integers (OpenVINO)", "gguf": "the GGUF file's own 4-, 5-, 6- and 8-bit blocks",
              "q4_0": "4-bit blocks (Q4_0) rounded from the GGUF file's",
              "float32": "32-bit floats", "bfloat16": "16-bit floats (bfloat16)", "float16": "16-bit floats"}


def plain_name(name: str) -> str:
    """A model's file name as a person says it: 'qwen2.5-coder-0.5b-instruct-q4_k_m' -> 'Qwen2.5-Coder 0.5B'
    (the quantisation of its source file and "instruct" dropped: the header's fold names them)."""
    base = re.sub(r"[-_.](q\d[\w]*|f16|f32|bf16|gguf)$", "", name.strip().split("/")[-1], flags=re.I)
    base = re.sub(r"-(instruct|chat|it)$", "", base, flags=re.I)
    parts = [p for p in base.split("-") if p]
    sizes = [p.upper() for p in parts if re.fullmatch(r"\d+(\.\d+)?[bmk]", p, re.I)]
    words = [p[:1].upper() + p[1:] for p in parts if not re.fullmatch(r"\d+(\.\d+)?[bmk]", p, re.I)]
    return " ".join(filter(None, ("-".join(words), *sizes))) or name


def plain_words(d: dict) -> str:
    """What runs, in a student's words: which model drafts for which, the weights' numbers, and whether SD gives
    the target's own answer here (docs/exactness.md)."""
    target = plain_name(d["target"])
    head = f"{plain_name(d['draft'])} drafts for {target}" if d.get("draft") else f"{target} alone (no draft)"
    rep = Representation.of(d)
    tw, dw = (REPR_WORDS.get(r, r) for r in (rep.target, rep.draft or rep.target))
    weights = f"weights in {tw}" if tw == dw else f"the target's weights in {tw}, the draft's in {dw}"
    exact = ("exact: SD gives the target's own answer" if rep.exact_rows
             else "not exact: SD can differ from the target's own answer where two tokens nearly tie"
             if rep.target == "int8" else "not exact in this representation: SD can differ from the target's own "
             "answer")
    return f"{head}; {weights}; {exact}"


def header(services: Services, mode: str = "") -> str:
    """What runs in plain words (``plain_words``), then, folded, how the models run (``pair.describe()``; ``mode``:
    this user's int8 activation scales, default the app's; threads: the model's passes', not the page's), the paper."""
    d = services.pair.describe()
    d["representation"] = (rep := Representation.of(d).with_activations(mode or services.default_activations)).as_dict()
    md = render.esc_md
    detail = (f"Draft **{md(d['draft'] or '–')}** → target **{md(d['target'])}** · target {md(rep.target)}"
              + (f" ({md(d['target_impl'])} path)" if d.get("target_impl") else "")
              + (f", activations smoothed ({md(d['target_smoothing'])})" if d.get("target_smoothing") else "")
              + ({"row": ", scaled per token (exact)", "pass": ", scaled per pass"}.get(rep.activations, ""))
              + f", draft {md(rep.draft or '–')}" + (f" ({md(d['draft_impl'])} path)" if d.get("draft_impl") else "")
              + (f"; {md(b.solo.rep.draft)} for a run that starts alone" if (b := services.batcher) and b.solo else "")
              + f" · {md(d['device'])}, {plural(services.model_threads or d['threads'], 'model thread')}")
    return (f'<details><summary title="How it runs here (technical)">{render.esc(plain_words(d))} · paper: '
            f'<a href="{render.PAPER_URL}">arXiv 2604.13634</a></summary>\n\n{detail}\n\n</details>')


def rival_controls() -> list:
    """The rivals' parameters in ``RIVAL_FIELDS`` order, folded in the bar (read when a rival is chosen)."""
    d = CSDConfig()
    what = {name: r[2].capitalize() for name, r in RIVAL_RANGES.items()}   # as refusals name them
    with gr.Accordion("Rivals' parameters (lossy, top-k, typical, FLy)", open=False, elem_id="rivals-panel",
                      elem_classes=HIDE_PRESENT):
        gr.Markdown("Relaxed acceptance rules, greedy only; their definitions and sources: docs/rivals.md.",
                    elem_id="rivals-note")
        with gr.Row(equal_height=True):    # compact numbers, two to a line in the bar's narrow column
            return [number(what[f], value=getattr(d.rivals, f), label=label, info=info, min_width=100,
                           elem_id=f.replace("_", "-"), **box)
                    for f in RIVAL_FIELDS for label, info, box in [RIVAL_INPUTS[f]]]


def build_demo(services: Services) -> gr.Blocks:
    s = services.settings
    with gr.Blocks(title="CSD Explorer", analytics_enabled=False) as demo:
        sess = gr.State(None)   # a Session, made by the first handler that needs it (ensure_session)
        status_timer = gr.Timer(s.status_interval_s, active=False)
        with gr.Row(equal_height=True):
            with gr.Column(scale=4, min_width=300):
                gr.Markdown("## CSD Explorer — Calibrated Speculative Decoding, token by token", elem_id="title")
                head = gr.Markdown(header(services), elem_id="header", elem_classes=HIDE_PRESENT)
            with gr.Column(scale=1, min_width=200):
                present = gr.Checkbox(False, label="Presentation mode (large answer, settings hidden)",
                                      elem_id="present")
        # the bar, folded on a phone by the page's script (the prompt and Generate on the first screen)
        with gr.Accordion("Settings: γ, λ, τ and the rivals' parameters", open=True, elem_id="bar",
                          elem_classes=HIDE_PRESENT), gr.Row(equal_height=True):
            gamma = slider(GAMMA_BOX, *GAMMA_RANGE, value=6, step=1, label="γ (draft block length)",
                           elem_id="gamma")
            with gr.Column(min_width=200):
                auto_gamma = gr.Checkbox(True, label="γ = auto (per block, from this machine's measured costs; "
                                         "Generate and Compare; Teach keeps the number)", elem_id="auto-gamma")
                show_spec = gr.Checkbox(True, label=f"Show speculation: auto drafts at least {SHOW_SPECULATION} "
                                        "tokens a block (off: only what pays here)", elem_id="show-spec")
            lam = slider(LAM_BOX, 0, 64, value=6, step=1,
                         label="λ (memory count threshold)", elem_id="lam")
            # τ moves in powers of ten; the one logarithm the page writes is the paper's, natural (log τ, the gap's)
            log10_tau = slider(LOG10_TAU_BOX, -4, 0, note="(τ from 0.0001 to 1)", value=-2,
                               step=0.05, label="τ's power of ten (gate threshold: -2 is τ = 0.01)",
                               elem_id="log10-tau")
            with gr.Column(min_width=220):
                tau_text = gr.Markdown(describe_tau(-2), elem_id="tau-text")
                rivals = rival_controls()          # folded: it adds no height to the bar until opened

        page = Page(services, sess, status_timer, gamma, auto_gamma, show_spec, lam, log10_tau, rivals=rivals)
        page.exactness.append((head, partial(header, services)))       # it names this user's int8 activations
        with gr.Tabs(elem_id="tabs", overflow_behavior="wrap"):    # a narrow screen wraps the tabs, in order
            wires = [tab.build(page) for tab in (generate, compare, analyse, explore, teach)]

        # -- wiring: the bar's own events first, then each tab's (once every tab is laid out) -----
        log10_tau.change(describe_tau, log10_tau, tau_text, api_visibility="private", show_progress="hidden",
                         **page.light)
        present.change(None, present, None, js=render.PRESENT_JS, api_visibility="private")
        status_timer.tick(partial(poll_status, services), *page.status_io, queue=False,
                          show_progress="hidden", api_visibility="private")
        for wire in wires:
            wire()

    demo.queue(max_size=s.queue_size, default_concurrency_limit=s.concurrency)
    services.lane.queue = partial(model_queue, demo)
    services.lane.withdraw = partial(withdraw, demo)
    return demo


def model_queue(demo: gr.Blocks) -> list[tuple[str, str]]:
    """Gradio's queue of model work, oldest first: (session hash, api_name) of each event waiting in it, from
    pages and API clients alike (the lane counts them ahead of a page's request: ``Lane.position``)."""
    q = getattr(demo, "_queue", None)
    events = q.event_queue_per_concurrency_id.get(MODEL_GROUP) if q is not None else None
    return [(e.session_hash, e.fn.api_name or "") for e in list(events.queue)] if events is not None else []


def withdraw(demo: gr.Blocks, session_hash: str, api_name: str, n: int) -> int:
    """Move the first ``n`` events of a page's session and api_name from gradio's queue of model work to the light
    group's, whose handler ends each stopped request at once (``jobs.take_back``), on the event loop. -> how many."""
    def move() -> int:
        q = getattr(demo, "_queue", None)
        groups = q.event_queue_per_concurrency_id if q is not None else {}
        model, light = groups.get(MODEL_GROUP), groups.get(LIGHT_GROUP)
        if model is None or light is None:
            return 0
        events = [e for e in list(model.queue) if (e.session_hash, e.fn.api_name or "") == (session_hash, api_name)]
        for e in events[:n]:
            model.queue.remove(e)
            e.concurrency_id = LIGHT_GROUP
            light.queue.append(e)
        return len(events[:n])
    try:
        return anyio.from_thread.run_sync(move)     # from a handler's worker thread: on the event loop
    except RuntimeError:                            # already on the event loop (or no loop: nothing queued)
        log.debug("withdrawing %d queued %s event(s) from the event loop's thread", n, api_name)
        return move()
