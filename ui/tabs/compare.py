"""The Compare tab: two or three methods on one prompt, one after another: where they part, what a pass costs."""
from __future__ import annotations

import difflib
import html
from dataclasses import replace
from functools import partial

import gradio as gr

from csd.config import METHODS
from csd.events import KEPT_DIVERGENCES, REJECTED, RELAXED, common_prefix

from .. import figures, render
from ..render import plural
from ..rules import METHOD_SHORT
from ..state import RunSettings, RunView, Services, Session
from . import analyse
from .common import (
    EXACT_MODE_LABEL,
    can_switch_exactness,
    error,
    exactness_note,
    page_config,
    remember_ar,
    set_exact_mode,
    tau_from_log10,
    tokens_html,
)
from .inputs import slider
from .jobs import in_lane, run_recorded, speculation_sentence, status_line, stop, take_job
from .page import EXAMPLES, Page

COMPARE_METHODS = ("ar", "sd", "csd")   # the default panes; their names are also the panes' element ids
NONE = "none"                            # a pane left empty (two methods side by side)


def chosen_methods(*picked: str | None) -> tuple[list[str], str | None]:
    """(the panes' methods, what is wrong with them or None): two or three different ones; ``NONE``: an empty pane."""
    out = [m for m in picked if m and m != NONE]
    bad = [m for m in out if m not in METHODS]
    if bad:
        return out, f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}"
    if len(set(out)) != len(out):
        return out, "Pick each method once: the same method twice would show the same answer."
    if len(out) < 2:
        return out, "Pick two or three methods to compare."
    return out, None


def departures(base_ids: list[int], other_ids: list[int]) -> set[int]:
    """Output positions of ``other_ids`` that differ from ``base_ids`` (replaced or inserted)."""
    ops = difflib.SequenceMatcher(a=base_ids, b=other_ids, autojunk=False).get_opcodes()
    return {j for tag, _i1, _i2, j1, j2 in ops if tag in ("replace", "insert") for j in range(j1, j2)}


def _code(text: str) -> str:
    """A token's text as inline code in a Markdown caption, escaped (it reaches the page as HTML)."""
    return f"<code>{html.escape(repr(text)[1:-1])}</code>"


def leaves_sd(csd: RunView, sd: RunView, name: str = "CSD") -> str:
    """Where the answer of CSD (or of relaxing method ``name``) first leaves SD's (the target's top-1) and why: a
    rescue (with the memory's count), a rival's relaxed keep, or nothing said (passes that round differently)."""
    a, b = sd.token_ids, csd.token_ids
    if a == b:
        return " · same tokens as SD"
    i = common_prefix(a, b)
    if i >= len(a) or i >= len(b):
        return f" · leaves SD's answer at token {i}, where {'SD' if i >= len(a) else name} ended"
    ev, sd_ev = (next((e for e in v.events if e.position == i and e.status != REJECTED), None) for v in (csd, sd))
    head = (f" · leaves SD's answer at token {i}: SD (the target's top-1) wrote {_code(sd_ev.text if sd_ev else '')}, "
            f"{name} kept {_code(ev.text if ev else '')}")
    if ev is not None and ev.status == RELAXED:
        return head + f", a relaxed keep (the {name.lower()} rule); everything after it follows from that token"
    if ev is not None and ev.status in KEPT_DIVERGENCES:
        seen = (f"the memory had seen this divergence {plural(ev.memory_count, 'time')}" if ev.memory_count
                else "the gate let it through")
        return head + f", a rescue ({seen}); everything after it follows from that token"
    return head


def _compare_caption(method: str, view: RunView | None, ar: RunView | None, diff: set[int] | None,
                     sd: RunView | None = None, ref: str = "ar", busy: int = 0) -> str:
    """A pane's caption: its passes and time, where it departs from the ``ref`` pane's answer ``ar`` (AR's, else the
    first pane's), for a relaxing method where it leaves SD's, and ``busy``: the most other runs that shared the
    machine while it ran (its times then are not the method's alone)."""
    if view is None:
        return f"**{method.upper()}**: waiting"
    m = view.metrics
    if m is None:
        return f"**{method.upper()}**: reading the prompt…"
    saved = m.new_tokens - m.target_forwards
    head = f"**{method.upper()}**: {plural(m.target_forwards, 'target pass', 'target passes')}"
    head += (f" (**{saved} saved**)" if method != "ar" and saved > 0 else "") \
        + f" for {plural(m.new_tokens, 'token')}, {m.wall_s:.2f} s"
    if not view.done:
        return head + " (running…)"
    r = ref.upper()
    if method != ref and ar is not None and ar.done and diff is not None:
        head += f" · same tokens as {r}" if not diff else \
            f" · departs from {r} at token {min(diff)}; {plural(len(diff), 'token')} " \
            f"{'differs' if len(diff) == 1 else 'differ'} (wavy underline)"
        if ar.metrics and ar.metrics.tokens_per_s and m.tokens_per_s:
            head += f" · {m.tokens_per_s / ar.metrics.tokens_per_s:.2f}× {r} tokens/s"
    if method not in ("ar", "sd") and sd is not None and sd.done:
        head += leaves_sd(view, sd, method.upper())
    if busy:
        head += (f" · **the machine was busy**: {plural(busy, 'other run')} shared it while this ran, so its time "
                 "and tokens/s are not this method's alone")
    return head


def compare_note(views: dict[str, RunView | None]) -> str:
    """The target passes saved, then the wall time from a verify pass's measured cost against an AR step."""
    done = {k: v.metrics for k, v in views.items() if v is not None and v.done and v.metrics}
    if "ar" not in done or len(done) < 2:
        return ("Speculative decoding saves **target passes**: one pass checks a whole block of draft tokens. "
                "Whether that saves **time** depends on what a pass costs on this machine; the comparison "
                "measures both.")
    a = done["ar"]
    step = a.verify_s / a.target_forwards if a.target_forwards else 0.0
    lines = []
    for k, m in done.items():
        if k == "ar":
            continue
        saved = a.target_forwards - m.target_forwards
        per = m.verify_s / m.target_forwards if m.target_forwards else 0.0
        ratio = per / step if step else 0.0
        lines.append(f"**{k.upper()}** used {plural(m.target_forwards, 'target pass', 'target passes')} instead of "
                     f"AR's {a.target_forwards} (**{saved} saved**, {m.mean_accepted_length:.2f} tokens per pass); "
                     f"one of its verify passes (a block of about {m.mean_block_len:.1f} draft tokens + 1) took "
                     f"{per:.3f} s against {step:.3f} s for an AR step (**{ratio:.1f}×**); drafting took "
                     f"{m.draft_s:.2f} s in all, and reading the prompt {m.prefill_s:.2f} s (the target, and the draft "
                     f"if it drafted at all: it reads the prompt when it first drafts; AR: {a.prefill_s:.2f} s, the "
                     f"target alone).")
    faster = [k for k in done if k != "ar" and done[k].wall_s < a.wall_s]
    why = ("**Why speculative decoding can be slower than AR here.** On a GPU a verify pass over γ + 1 tokens costs "
           "about as much as one AR step, so every kept draft token is time saved. On a CPU, and more so a busy "
           "one or a float32 model, the work of a pass grows with the tokens in it: when a verify pass costs "
           "nearly as many AR steps as the tokens it yields, the passes saved no longer save time, and the draft's "
           "own time comes on top. A shorter block (γ) or γ = auto (chosen from this machine's measured costs) "
           "helps.")
    verdict = ("Here " + " and ".join(k.upper() for k in faster) + " also finished sooner than AR."
               if faster else "Here neither finished sooner than AR.")
    return "\n\n".join(lines + [verdict, why])


def _compare_out(views: dict, slots: list, ref: str, whatif: tuple, final: bool = False, busy=None) -> tuple:
    """The panes (marked where they depart from ``ref``'s), their captions, and once ``final`` the chart and note."""
    base = views[ref]
    diffs = {m: (departures(base.token_ids, v.token_ids) if (base and base.done and v and v.done and m != ref)
                 else None) for m, v in views.items()}
    panes = [tokens_html(views[m], whatif, show_prompt=False, diff_positions=diffs[m], view=f"pane-{slot}",
                         panel="compare")
             if m and views[m] else render.render_tokens([], empty="waiting…" if m else "no method picked",
                                                         view=f"pane-{slot}", panel="compare")
             for slot, m in zip(COMPARE_METHODS, slots)]
    caps = [_compare_caption(m, views[m], base, diffs[m], views.get("sd"), ref, (busy or {}).get(m, 0)) if m
            else "*(no method)*" for m in slots]
    if not final:
        return (*panes, *caps, gr.skip(), gr.skip())
    fig = figures.make_compare_figure({m: v.metrics for m, v in views.items() if v and v.done and v.metrics})
    return (*panes, *caps, fig, compare_note(views))


def compare(services: Services, prompt: str, s: RunSettings, sess: Session | None):
    """Run the methods of ``s.panes`` on one prompt, one after another (greedy), one burst per verify pass.
    Yields the three panes, their captions, the chart, the note, the status line, the session."""
    sess, job = take_job(services, sess, "compare")
    picked, problem = chosen_methods(*s.panes)
    if problem:
        services.lane.finish(job, "Not run: pick two or three different methods.")
        raise error(problem)
    views: dict[str, RunView | None] = dict.fromkeys(picked)
    slots = [*picked, None][:len(COMPARE_METHODS)]
    ref = "ar" if "ar" in views else picked[0]        # the answer the others are compared with
    busy: dict[str, int] = {}                        # the most other runs on the model during each method's run

    def out(final: bool = False):
        return (*_compare_out(views, slots, ref, (float(s.lam), tau_from_log10(s.log10_tau)), final, busy),
                status_line(services, sess, "compare"), sess)

    if job.cancel:
        yield (*[gr.skip()] * 8, status_line(services, sess, "compare"), sess)
        return
    with in_lane(services, job):
        cfgs = {m: page_config(replace(s, method=m, temperature=0.0, seed=None, lookup=False,
                                       auto_gamma=s.auto_gamma and m != "ar")) for m in picked}
        for m in picked:
            if job.cancel:
                break
            # the others get a throwaway copy of the memory, so that CSD does not learn from their runs of this prompt
            memory = sess.memory if m == "csd" else sess.memory.copy()
            for view in run_recorded(services, sess, job, prompt, s.chat, cfgs[m], memory, "compare", m.upper()):
                views[m] = view
                busy[m] = max(busy.get(m, 0), services.lane.beside(job))
                yield out()     # once started, then after every target pass
            remember_ar(sess, views[m])
        sess.last = views.get("csd") or next((v for m, v in reversed(views.items()) if m != "ar" and v is not None),
                                             sess.last)
        done, csd = [v for v in views.values() if v is not None and v.done], views.get("csd")
        note = speculation_sentence(csd, s.gamma, (job.decoder or services.decoder).costs) if csd and csd.done else ""
        job.summary = (f"{'Stopped' if job.cancel else 'Done'}: {len(done)} of {len(views)} methods ran, "
                       f"{plural(sum(v.metrics.new_tokens for v in done), 'token')} in all."
                       + (f" CSD: {note}" if note else ""))
    yield out(final=True)


# the /compare API's values by position; the rivals' parameters follow
API_ORDER = ("prompt", "chat", "gamma", "auto_gamma", "lam", "log10_tau", "max_new_tokens", "show_spec",
             "method_1", "method_2", "method_3")


def build(page: Page):
    services, s, sess = page.services, page.settings, page.sess
    with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
        gr.Markdown("The same prompt with two or three methods, one after another (greedy, γ/λ/τ and the rivals' "
                    "parameters from the bar above): AR, SD and CSD unless you pick others, an ablation or a rival. "
                    "Speculative decoding saves **target passes**; whether it also saves time "
                    "depends on what a pass costs on this machine (explained below the answers).")
        gr.HTML(render.render_legend(whatif=False, diff=True), elem_id="compare-legend")
        note = gr.Markdown(exactness_note(services.pair.rep.target, services.default_activations),
                           elem_id="compare-exactness")
        page.exactness.append((note, partial(exactness_note, services.pair.rep.target)))
        one_at_a_time = s.concurrency == 1 or services.batcher is not None
        exact = gr.Checkbox(services.default_activations == "row", label=EXACT_MODE_LABEL, elem_id="exact-mode",
                            visible=can_switch_exactness(services.pair), interactive=one_at_a_time,
                            info=None if one_at_a_time else "fixed while several generations may run at once "
                                                            "(--concurrency > 1)")
        with gr.Row():
            with gr.Column(scale=3):
                c_prompt = gr.Textbox(label=f"Prompt (at most {s.max_prompt_tokens:,} tokens)", lines=3,
                                      value=EXAMPLES[1], elem_id="c-prompt")
                with gr.Row(equal_height=False):
                    c_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=0, min_width=120)
                    c_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop", scale=0, min_width=90)
                    with gr.Column(scale=3, min_width=220):
                        c_status = gr.HTML(render.render_status("Ready."), elem_id="compare-status")
            with gr.Column(scale=1):      # Compare's own settings, by name
                choices = [(f"{m} — {METHOD_SHORT[m]}", m) for m in METHODS]
                own = {f"method_{i + 1}": gr.Dropdown(choices + ([("— none —", NONE)] if i == 2 else []), value=m,
                                                      label=f"Pane {i + 1}", elem_id=f"c-method-{i + 1}")
                       for i, m in enumerate(COMPARE_METHODS)}
                own["chat"] = gr.Checkbox(True, label="Chat template")
                own["max_new_tokens"] = slider("Max new tokens", 1, s.max_new_tokens_limit, note="(this app's limit)",
                                               value=s.compare_tokens, step=1, label="Max new tokens",
                                               elem_id="c-max-new")
        with gr.Row(equal_height=False):
            panes, caps = [], []
            for m in COMPARE_METHODS:    # each pane above its caption, so that the three answers start level
                with gr.Column(min_width=240):
                    panes.append(gr.HTML(render.render_tokens([], empty="not run yet", view=f"pane-{m}",
                                                              panel="compare"), elem_id=f"pane-{m}"))
                    caps.append(gr.Markdown(f"**{m.upper()}**", elem_id=f"cap-{m}"))
        gr.HTML(render.detail_panel(), elem_id="compare-detail")
        c_note = gr.Markdown(compare_note({}), elem_id="compare-note")
        c_fig = gr.Plot(figures.make_compare_figure({}), label="Target passes, wall time, tokens/s",
                        show_label=False, elem_id="compare-plot")
    page.status["compare"] = c_status

    def wire():
        cmp = page.model_job(c_btn, "compare", page.handler(compare),
                             page.named(API_ORDER, prompt=c_prompt, **own),
                             [*panes, *caps, c_fig, c_note, c_status, sess], "compare",
                             check_in=(page.gamma, page.lam, page.log10_tau, own["max_new_tokens"]))
        analyse.refresh_after(page, cmp)
        c_stop.click(partial(stop, services, "compare"), sess, c_status, queue=False, api_name="stop_compare",
                     show_progress="hidden")
        exact.change(partial(set_exact_mode, services, [fn for _, fn in page.exactness]), [exact, sess],
                     [*(c for c, _ in page.exactness), sess], api_name="exact_mode", show_progress="minimal",
                     **page.light)      # this user's choice only: the model takes it at their next run
    return wire
