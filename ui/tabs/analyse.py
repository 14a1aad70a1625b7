"""The Analyse tab: four charts of the logged divergences for a scope (Pareto, logit gaps,
acceptance by position, what-if heatmap), the benchmark's frontier, and the last answer recoloured
under the λ/τ sliders. Nothing here runs the model.
"""
from __future__ import annotations

import logging

import numpy as np

from db import analytics as A

from .. import figures, render
from ..state import Services, Session
from .common import NO_STORE, ensure_session, error, scope_filter, tau_from_log10, tokens_html

log = logging.getLogger(__name__)

WHATIF_LAMS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
WHATIF_LOG10_TAUS = tuple(np.round(np.linspace(-4, 0, 17), 2))


def analyse(services: Services, scope: str, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """The four charts for a scope and thresholds, from the store (no model runs).
    -> (pareto, gaps, positions, what-if heatmap, summary, heading, last answer recoloured, session)."""
    sess = ensure_session(services, sess)
    lam, tau = float(lam), tau_from_log10(log10_tau)
    tokens = tokens_html(sess.last, lam, tau, hide_rejected, view_id="analyse-tokens")
    changed = render.changed_decisions(sess.last.events, lam, tau) if sess.last else 0
    heading = ("**Last answer under the λ/τ sliders**"
               + (f": {changed} changed decision{'s' if changed != 1 else ''} outlined (dashed: would be rescued, "
                  f"double: would be rejected)" if changed else (": no decision changes" if sess.last else "")))
    if services.store is None:
        e = figures.empty_figure(NO_STORE)
        return e, e, e, e, NO_STORE, heading, tokens, sess
    f, why = scope_filter(services, sess, scope)
    if f is None:
        e = figures.empty_figure(why)
        return e, e, e, e, why, heading, tokens, sess
    try:
        rows = A.pareto_table(services.store, f)
        div = A.cached_divergences(services.store, f)
        pos = A.acceptance_by_position(services.store, f)
        grid = A.what_if_grid(services.store, WHATIF_LAMS, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], f)
        wi = A.what_if(services.store, lam, tau, f)
        kinds = A.rescued_by_kind(services.store, f)
    except Exception as e:
        log.exception("the store could not answer the analysis")
        raise error(f"The store could not answer: {e}") from None
    summary = (f"**{render.esc_md(scope)}**: {wi.total} divergences logged; at λ = {lam:g}, τ = {tau:.3g} the rule "
               f"would rescue **{wi.rescued}** ({100 * wi.rate:.1f}%). Top 20% of patterns cover "
               f"{100 * A.top_share(rows):.0f}% of divergences. Rescued tokens by kind: "
               + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ".")
    return (figures.make_pareto_figure(rows), figures.make_gap_figure(div.gap, div.count, lam, tau),
            figures.make_position_figure(pos),
            figures.make_whatif_figure(grid.lams, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], grid.rate, lam, tau,
                                       grid.total),
            summary, heading, tokens, sess)
