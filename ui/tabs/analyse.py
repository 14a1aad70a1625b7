"""The Analyse tab: four charts of the logged divergences for a scope or of the session's memory, the
benchmark's frontier, and the last answer recoloured under a what-if rule. Nothing here runs the model."""
from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial

import gradio as gr
import numpy as np

from csd.config import ConfigError
from csd.db import analytics as A
from csd.memory import CorrectionMemory
from csd.numbers import CAPACITY

from .. import figures, render, rules
from ..state import RunSettings, Services, Session
from .common import (
    NO_STORE,
    SCOPE_MEMORY,
    SCOPE_SESSION,
    ensure_session,
    error,
    read_number,
    rival_params,
    scope_filter,
    scopes,
    target_choices,
    target_dropdown,
    tau_from_log10,
    tokens_html,
)
from .inputs import number
from .page import Page

log = logging.getLogger(__name__)

WHATIF_LAMS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
WHATIF_TAUS = [tau_from_log10(x) for x in np.round(np.linspace(-4, 0, 17), 2)]    # log10 τ from -4 to 0 by 0.25


def analyse(services: Services, scope: str, s: RunSettings, sess: Session | None, target=None):
    """The four charts for a scope (``target``: a recorded target representation; None or "any": all), and the
    last answer recoloured under the what-if rule (``s.method`` at the λ/τ sliders and the rivals' parameters).
    -> (pareto, gaps, positions, what-if heatmap, summary, heading, answer, target dropdown update, session)."""
    sess = ensure_session(services, sess)
    lam, tau = float(s.lam), tau_from_log10(s.log10_tau)
    try:
        rule = rules.whatif_rule(s.method or "csd", lam, tau, rival_params(s.rivals))
    except ConfigError as e:
        raise error(str(e)) from None
    csd = s.method in (None, "", "csd")
    tokens = tokens_html(sess.last, (lam, tau) if csd else rule, s.hide_rejected, view="analyse-tokens")
    heading = _heading(sess, rule, csd)
    if scope == SCOPE_MEMORY:
        return (*memory_charts(services, sess, lam, tau), heading, tokens, gr.update(), sess)
    f, why = scope_filter(services, sess, scope, target=target)
    if f is None:
        e = figures.empty_figure(why)
        return e, e, e, e, why, heading, tokens, target_choices(services, sess), sess
    try:
        rows = A.pareto_table(services.store, f)
        div = A.cached_divergences(services.store, f)
        pos = A.acceptance_by_position(services.store, f)
        grid = A.what_if_grid(services.store, WHATIF_LAMS, WHATIF_TAUS, f)
        wi = A.what_if(services.store, lam, tau, f)
        kinds = A.rescued_by_kind(services.store, f)
        other = None if csd else (A.what_if_rule(services.store, rule, f), A.unscored(services.store, rule, f))
        targets = target_choices(services, sess)
    except Exception as e:
        log.exception("the store could not answer the analysis")
        raise error(f"The store could not answer: {e}", expected=False) from None
    where = render.esc_md(scope) + (f", target {render.esc_md(str(target))}" if f.representations else "")
    summary = (f"**{where}**: {render.plural(wi.total, 'divergence')} logged; at λ = {lam:g}, τ = {tau:.3g} the rule "
               f"would rescue **{wi.rescued}** ({100 * wi.rate:.1f}% of them rescued). Top 20% of patterns cover "
               f"{100 * A.top_share(rows):.0f}% of divergences. Rescued tokens by kind: "
               + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ".")
    if other is not None:
        (kept, missing), label = other, render.esc_md(rules.describe(rule))
        summary += (f" Under **{label}** the logged divergences would keep **{kept.rescued}** "
                    f"({100 * kept.rate:.1f}% of them kept)"
                    + (f"; {missing} lack a score it reads (older runs, or runs that did not log it)" if missing
                       else "") + ".")
    return (figures.make_pareto_figure(rows), figures.make_gap_figure(div.gap, div.count, lam, tau),
            figures.make_position_figure(pos),
            figures.make_whatif_figure(grid.lams, WHATIF_TAUS, grid.rate, lam, tau, grid.total),
            summary, heading, tokens, targets, sess)


def memory_pareto_rows(memory: CorrectionMemory, tokenizer, limit: int | None = None) -> list[dict]:
    """The memory's patterns as Pareto rows (``csd.db.analytics.ParetoRow``'s names), most counted first;
    shares over all its counts. Only the first ``limit`` rows are decoded (the chart shows 30)."""
    top = memory.top()
    total = sum(c for _, c in top) or 1
    rows, cum = [], 0
    for i, ((d, t), c) in enumerate(top):
        cum += c
        shown = limit is None or i < limit
        rows.append({"draft_id": d, "target_id": t, "count": c, "share": c / total, "cumulative_share": cum / total,
                     "draft_text": tokenizer.decode([d]) if shown else "",
                     "target_text": tokenizer.decode([t]) if shown else "",
                     "example_context": "(a memory holds counts, no contexts)"})
    return rows


def memory_charts(services: Services, sess: Session, lam: float, tau: float):
    """The charts of the session's memory (an uploaded SGLang table, say): its patterns by count, and this
    session's logged divergences decided with its counts. -> (pareto, gaps, positions, what-if, summary)."""
    mem = sess.memory
    rows = memory_pareto_rows(mem, services.pair.tokenizer, limit=30)
    sg = mem.meta.get("sglang")
    where = (f"the SGLang table {sg.get('source')}" if isinstance(sg, dict) and sg.get("source")
             else "this session's memory")
    summary = (f"**{render.esc_md(where)}**: {render.plural(len(mem), 'pattern')}, "
               f"{render.plural(round(mem.total), 'divergence')} counted, {mem.n_candidates(lam):,} at or above "
               f"λ = {lam:g}; the top 20% of patterns hold {100 * mem.top_share(0.2):.0f}% of the counts.")
    positions = figures.empty_figure("Acceptance by position comes from runs: pick a run scope.")
    if services.store is None:
        e = figures.empty_figure(NO_STORE)
        return figures.make_pareto_figure(rows), e, positions, e, summary + " " + NO_STORE
    f, _ = scope_filter(services, sess, SCOPE_SESSION)
    try:
        d = A.cached_divergences(services.store, f)
        per_pattern = np.array([mem.count(a, b) for a, b in d.patterns], dtype=float)   # each divergence decided
        d = replace(d, count=per_pattern[d.pattern] if len(d) else np.zeros(0))          # with this memory's count
    except Exception as e:
        log.exception("the store could not answer the analysis")
        raise error(f"The store could not answer: {e}", expected=False) from None
    grid, rescued = A.grid_of(d, WHATIF_LAMS, WHATIF_TAUS), int(d.rescued_mask(lam, tau).sum())
    summary += (f" A memory holds counts, not logit gaps: the gap and what-if charts take this session's "
                f"{render.plural(len(d), 'logged divergence')} and decide them with this memory's counts; at "
                f"λ = {lam:g}, τ = {tau:.3g} the rule would rescue **{rescued}**"
                + (f" ({100 * rescued / len(d):.1f}% of them rescued)." if len(d)
                   else ". Generate answers to see them."))
    return (figures.make_pareto_figure(rows), figures.make_gap_figure(d.gap, d.count, lam, tau), positions,
            figures.make_whatif_figure(grid.lams, WHATIF_TAUS, grid.rate, lam, tau, grid.total), summary)


def capacity_what_if(services: Services, scope: str, capacity, lam, log10_tau, sess: Session | None, target=None):
    """What a memory of ``capacity`` patterns would have rescued on the scope's logged divergences at the λ/τ
    sliders, beside the unbounded memory (``csd.db.analytics.capacity_what_if``). -> (markdown, session)."""
    sess = ensure_session(services, sess)
    capacity = read_number(replace(CAPACITY, name="Memory of N patterns", optional=False), capacity)
    f, why = scope_filter(services, sess, scope if scope != SCOPE_MEMORY else SCOPE_SESSION, target=target)
    if f is None:
        return why, sess
    lam, tau = float(lam), tau_from_log10(log10_tau)
    d = A.cached_divergences(services.store, f)
    kept, full = A.capacity_what_if(d, int(capacity), lam, tau)
    n = len(d.patterns)
    return (f"A memory of **{int(capacity):,}** {'pattern' if int(capacity) == 1 else 'patterns'} (of the "
            f"{n:,} logged) would have rescued **{kept}** of the {render.plural(full, 'divergence')} the unbounded "
            f"memory rescues at λ = {lam:g}, τ = {tau:.3g}" + (f" ({100 * kept / full:.0f}%)." if full else ".")
            + " It keeps the patterns with the largest logged counts."), sess


def _heading(sess: Session, rule, csd: bool) -> str:
    """The heading of the recoloured answer: the rule, and how many of its decisions it changes."""
    changed = render.changed_decisions(sess.last.events, rule) if sess.last else 0
    heading = ("**Last answer under the λ/τ sliders**" if csd else f"**Last answer under {rules.describe(rule)}**") \
        + (f": {render.plural(changed, 'changed decision')} outlined (dashed: would be "
           f"{'rescued' if csd else 'kept'}, double: would be rejected)" if changed
           else (": no decision changes" if sess.last else ""))
    if sess.last and not csd:      # the count, and what the rule lacks (the outline sentence is above)
        heading += "  \n" + render.esc_md(render.whatif_summary(sess.last.events, rule, outline=False))
    return heading


def refresh_after(page: Page, dep) -> None:
    """Analyse follows ``dep`` (a run, a move of a λ/τ slider): its charts and answer are refreshed after it."""
    named, outputs = page.analyse_io
    dep.then(page.handler(analyse, "scope", ("target",)), [page.sess], outputs, inputs_kwargs=named,
             api_visibility="private", show_progress="hidden", **page.light)


# -- the tab -----------------------------------------------------------------------------------
def build(page: Page):
    services, s, sess, light = page.services, page.settings, page.sess, page.light
    scope_choices = [*scopes(services), SCOPE_MEMORY]
    with gr.Tab("Analyse", id="analyse", elem_id="tab-analyse") as analyse_tab:
        # the answer the λ/τ sliders recolour and the what-if map they move over, side by side right under the
        # bar, so that a slider and what it changes are in view together; the full legend folded
        gr.HTML(render.render_legend(key=True), elem_id="analyse-key")
        with gr.Accordion("What the colours and marks mean", open=False, elem_id="analyse-legend-panel"):
            gr.HTML(render.render_legend(), elem_id="analyse-legend")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                a_rule = gr.Dropdown([(f"{m} — {rules.METHOD_SHORT[m]}", m) for m in rules.WHATIF_METHODS], value="csd",
                                     label="What-if rule for the last answer (csd: the λ/τ sliders; a rival: the "
                                           "folded panel's parameters)", elem_id="whatif-rule")
                a_heading = gr.Markdown("**Last answer under the λ/τ sliders**", elem_id="analyse-heading")
                a_tokens = gr.HTML(render.render_tokens([], view="analyse-tokens"), elem_id="analyse-tokens")
                gr.HTML(render.detail_panel(), elem_id="analyse-tokens-detail")
            with gr.Column(scale=1, min_width=320):
                heat = gr.Plot(label="What-if heatmap", show_label=False, elem_id="whatif-plot")
        with gr.Row():
            scope = gr.Radio(scope_choices, value=SCOPE_SESSION, label="Scope", elem_id="scope",
                             info="'all runs' is shared: it shows every user's answers" if s.shared_scope
                             else "Only your own runs are shown in this app.")
            target = target_dropdown("analyse-target")
            a_refresh = gr.Button("Refresh", scale=0)
        a_summary = gr.Markdown(elem_id="analyse-summary")
        with gr.Row():
            pareto = gr.Plot(label="Pareto chart", show_label=False, elem_id="pareto-plot")
            gaps = gr.Plot(label="Logit gaps", show_label=False, elem_id="gap-plot")
        positions = gr.Plot(label="Acceptance by position", show_label=False, elem_id="position-plot")
        with gr.Row(equal_height=True):
            cap = number("Memory of N patterns", precision=0, minimum=1, value=100, scale=0, min_width=200,
                         label="What-if: a memory of N patterns", elem_id="capacity-whatif")
            cap_btn = gr.Button("What would it rescue?", scale=0, elem_id="capacity-whatif-btn")
            cap_out = gr.Markdown(elem_id="capacity-whatif-out")
        for title, path, name, chart, table in (
                ("Speed / quality frontier of the shipped benchmark (λ/τ settings)", s.frontier_file, "frontier",
                 figures.make_frontier_figure, figures.frontier_table),
                ("Acceptance rules side by side: speed against quality, beside the paper's table", s.rivals_file,
                 "rivals-frontier", figures.make_rivals_figure, figures.rivals_table)):
            with gr.Accordion(title, open=False, elem_id=f"{name}-panel"):
                data = figures.load_frontier(path)
                gr.Plot(chart(data), show_label=False, elem_id=f"{name}-plot")
                gr.Markdown(table(data), elem_id=f"{name}-table")
    assert page.hide_rejected is not None, "Generate is laid out before Analyse: its switch is an input here"
    named = {**page.named(("scope", "lam", "log10_tau", "hide_rejected", "whatif_method"), scope=scope,
                          hide_rejected=page.hide_rejected, whatif_method=a_rule), "target": target}
    outputs = [pareto, gaps, positions, heat, a_summary, a_heading, a_tokens, target, sess]
    page.analyse_io = (named, outputs)

    def wire():
        run = page.handler(analyse, "scope", ("target",))
        a_refresh.click(run, [sess], outputs, inputs_kwargs=named, api_name="analyse", **light)
        cap_btn.click(partial(capacity_what_if, services), [scope, cap, page.lam, page.log10_tau, sess, target],
                      [cap_out, sess], api_name="capacity_what_if", **light)
        for trigger in (scope.change, target.input, analyse_tab.select, a_rule.change,
                        *(c.change for c in page.rivals)):
            trigger(run, [sess], outputs, inputs_kwargs=named, api_visibility="private", **light)
    return wire
