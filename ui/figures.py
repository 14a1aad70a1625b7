"""Plotly figure builders, ``make_*_figure(data) -> go.Figure``, pure functions of plain data; the rule's numbers
come from ``csd.rule``, and token text in labels is HTML-escaped (Plotly reads a subset of HTML there)."""
from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from itertools import accumulate

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from csd.bench import frontier
from csd.events import RunMetrics
from csd.rule import log_tau, top_share

from .render import plural, show_token
from .rules import memory_knows, whatif_rule

COLORS = {"ar": "#7f7f7f", "sd": "#1f77b4", "csd": "#e07b00", "ocm-only": "#2ca02c", "scg-only": "#9467bd",
          "lossy": "#8c564b", "topk": "#17becf", "typical": "#bcbd22", "fly": "#e377c2"}
LAYOUT = dict(template="plotly_white", margin=dict(l=50, r=20, t=50, b=50), height=360,
              font=dict(family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size=12))


def _get(row, name, default=None):
    return row.get(name, default) if isinstance(row, Mapping) else getattr(row, name, default)


def _tok(s) -> str:
    return html.escape(show_token(s), quote=False)


def empty_figure(message: str, title: str = "") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=html.escape(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14))
    fig.update_layout(**LAYOUT, title=title)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def make_pareto_figure(rows: Sequence, max_bars: int = 30, top_fraction: float = 0.2) -> go.Figure:
    """Divergence patterns by count (bars), the cumulative share over all rows (line) and the top-20% mark.
    rows: most frequent first (``csd.db.analytics.ParetoRow`` or dicts)."""
    title = ("Pareto chart of divergence patterns (the draft's token x~ → the target's choice t*)<br><sup>every "
             "logged divergence, whatever λ and τ: the sliders do not change it</sup>")
    if not rows:
        return empty_figure("No divergences logged in this scope yet.", title)
    total = sum(_get(r, "count") for r in rows)
    shown = list(rows[:max_bars])
    x = list(range(1, len(shown) + 1))
    labels = [f"{_tok(_get(r, 'draft_text'))}→{_tok(_get(r, 'target_text'))}" for r in shown]
    counts = [_get(r, "count") for r in shown]
    cum = [_get(r, "cumulative_share", acc / total) for r, acc in zip(shown, accumulate(counts))]
    hover = [f"<b>{_tok(_get(r, 'draft_text'))} → {_tok(_get(r, 'target_text'))}</b>"
             f"<br>ids {_get(r, 'draft_id')} → {_get(r, 'target_id')}<br>count {_get(r, 'count')} "
             f"({100 * _get(r, 'count') / total:.1f}%)<br>example: "
             f"…{html.escape(str(_get(r, 'example_context') or '')[-40:])}"
             for r in shown]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=counts, name="count", marker_color="#e07b00", hovertext=hover,
                         hovertemplate="%{hovertext}<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=x, y=cum, name="cumulative share", mode="lines+markers", line_color="#1f3b73",
                             hovertemplate="cumulative %{y:.0%}<extra></extra>"), secondary_y=True)
    k = max(1, round(len(rows) * top_fraction))
    share = top_share([_get(r, "count") for r in rows], top_fraction)
    if k <= len(shown):
        fig.add_vline(x=k + 0.5, line_dash="dash", line_color="#c62828")
    # the share is the title's second line, the legend under it: clear of each other and of the slanted labels
    fig.update_layout(**dict(LAYOUT, margin=dict(l=55, r=55, t=100, b=110), height=440), bargap=0.15,
                      title=dict(text=title, y=0.97, subtitle=dict(
                          text=f"top {top_fraction:.0%} of patterns ({k} of {len(rows)}) = {share:.0%} of divergences",
                          font=dict(color="#c62828"))),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"))
    fig.update_xaxes(tickmode="array", tickvals=x, ticktext=labels, tickangle=-45, title="", automargin=True)
    fig.update_yaxes(title_text="count", secondary_y=False, rangemode="tozero", tickformat="d",
                     **(dict(dtick=1) if max(counts) <= 10 else {}))
    fig.update_yaxes(title_text="cumulative share", range=[0, 1.05], tickformat=".0%", secondary_y=True)
    return fig


def make_gap_figure(gaps: Sequence[float], counts: Sequence[float] | None, lam: float, tau: float,
                    bins: int = 40) -> go.Figure:
    """Histogram of the logit gaps z(x~) − z(t*) of divergences, split by memory count ≥ λ, with a
    vertical line at log τ and the rescue region (gap ≥ log τ) shaded."""
    title = "Logit gaps of divergences"
    g = np.asarray(gaps, dtype=float)
    c = np.asarray(counts if counts is not None else np.full(len(g), np.nan), dtype=float)
    ok = np.isfinite(g)
    g, c = g[ok], c[ok]
    lt = log_tau(tau)
    if g.size == 0:
        return empty_figure("No divergences with logged gaps in this scope yet.", title)
    lo = float(min(g.min(), lt)) - 0.5
    edges = dict(start=lo, end=0.0, size=max((0.0 - lo) / bins, 0.05))
    known = memory_knows(c, lam)    # the memory half of the rule
    fig = go.Figure()
    fig.add_trace(go.Histogram(x=g[known], xbins=edges, name=f"memory count ≥ λ ({lam:g})", marker_color="#e07b00"))
    fig.add_trace(go.Histogram(x=g[~known], xbins=edges, name="memory count < λ", marker_color="#9aa5b1"))
    fig.add_vrect(x0=lt, x1=0.0, fillcolor="#2e7d32", opacity=0.12, line_width=0)
    fig.add_vline(x=lt, line_color="#2e7d32", line_width=2)
    n_rescue = int(np.sum(whatif_rule("csd", lam, tau).keeps_logged(count=c, gap=g)))
    fig.add_annotation(text=f"log τ = {lt:.2f} · rescue region: {n_rescue} of {plural(g.size, 'divergence')}",
                       x=lt, y=1.02, xref="x", yref="paper", showarrow=False, xanchor="left", yanchor="bottom",
                       font=dict(color="#2e7d32"))
    fig.update_layout(**LAYOUT, title=dict(text=title, y=0.98), barmode="stack",
                      legend=dict(orientation="h", y=-0.25), xaxis_title="gap z(x~) − z(t*)  (≤ 0)",
                      yaxis_title="divergences")
    return fig


def make_position_figure(by_method: Mapping[str, Sequence]) -> go.Figure:
    """Acceptance (kept / decided) by position in the draft block, one line per method (``PositionRate`` rows)."""
    title = "Acceptance by position in the draft block"
    series = {m: rows for m, rows in by_method.items() if rows}
    if not series:
        return empty_figure("No speculative runs in this scope yet.", title)
    fig = go.Figure()
    for method, rows in sorted(series.items()):
        rows = sorted(rows, key=lambda r: _get(r, "index_in_block"))
        xs = [_get(r, "index_in_block") + 1 for r in rows]
        ys = [(_get(r, "kept") / _get(r, "decided")) if _get(r, "decided") else 0.0 for r in rows]
        hover = [f"{method} position {x}: {_get(r, 'kept')} kept of {_get(r, 'decided')}" for x, r in zip(xs, rows)]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=method, hovertext=hover,
                                 hovertemplate="%{hovertext}<extra></extra>", line_color=COLORS.get(method)))
    fig.update_layout(**LAYOUT, title=dict(text=title, y=0.98), xaxis_title="draft position i in the block",
                      yaxis_title="kept / decided", legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return fig


def make_whatif_figure(lams: Sequence[float], taus: Sequence[float], rate, lam: float, tau: float,
                       total: int | None = None) -> go.Figure:
    """Heatmap of the what-if rescue rate, (len(lams), len(taus)), the current thresholds marked. Its colours span the
    rates it holds (0 to the largest), so that a few percent are not all drawn as the palest; τ on a log axis, its
    ticks written as τ's values."""
    title = "What-if: share of divergences rescued at λ × τ"
    if total == 0:
        return empty_figure("No divergences logged in this scope yet.", title)
    z = np.asarray(rate, dtype=float)
    top = max(0.01, float(np.nanmax(z))) if z.size and np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=[math.log10(t) for t in taus], y=[float(v) for v in lams], zmin=0, zmax=top,
        customdata=np.broadcast_to(np.asarray(taus, dtype=float), z.shape), colorscale="YlOrBr",
        colorbar=dict(title=f"rescued<br>(of divergences;<br>0 to {top:.0%})", tickformat=".0%"),
        hovertemplate="λ = %{y:g}<br>τ = %{customdata:.3g}<br>rescued: %{z:.1%} of divergences<extra></extra>"))
    fig.add_trace(go.Scatter(x=[math.log10(tau)], y=[lam], mode="markers", name="current", customdata=[tau],
                             marker=dict(symbol="x", size=14, color="#1f3b73", line=dict(width=2)),
                             hovertemplate="current λ = %{y:g}, τ = %{customdata:.3g}<extra></extra>"))
    sub = f" ({plural(total, 'divergence')})" if total else ""
    fig.update_layout(**LAYOUT, title=dict(text=title + sub, y=0.98), xaxis_title="τ (gate threshold, log scale)",
                      yaxis_title="λ (memory count threshold)", showlegend=False)
    fig.update_xaxes(tickvals=[-4, -3, -2, -1, 0], ticktext=["0.0001", "0.001", "0.01", "0.1", "1"])
    return fig


def make_compare_figure(results: Mapping[str, RunMetrics]) -> go.Figure:
    """Target passes, wall time and tokens per second of each method (``RunMetrics``), side by side."""
    if not results:
        return empty_figure("Run a comparison to see the chart.", "AR vs SD vs CSD on the same prompt")
    methods = list(results)
    title = " vs ".join(m.upper() for m in methods) + " on the same prompt"
    panels = [("target passes", lambda m: m.target_forwards, "d"), ("wall time (s)", lambda m: m.wall_s, ".2f"),
              ("tokens / s", lambda m: m.tokens_per_s, ".2f")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[0] for p in panels])
    for col, (name, get, fmt) in enumerate(panels, start=1):
        ys = [float(get(results[m]) or 0) for m in methods]
        fig.add_trace(go.Bar(x=methods, y=ys, name=name, marker_color=[COLORS.get(m, "#555") for m in methods],
                             text=[format(int(y) if fmt == "d" else y, fmt) for y in ys], textposition="auto",
                             hovertemplate="%{x}: %{y:.3g}<extra>" + name + "</extra>", showlegend=False),
                      row=1, col=col)
    fig.update_layout(**LAYOUT, title=dict(text=title, y=0.98))
    return fig


load_frontier = frontier.load     # a frontier file's data, or None if absent or unreadable


def make_frontier_figure(data: dict | None) -> go.Figure:
    """One point per setting of the benchmark's lambda/tau sweep: tokens per second against accuracy."""
    if not data or not data.get("points"):
        return empty_figure("No frontier yet: run python -m csd bench ... --sweep 'lam=L,tau=T;...' and copy its "
                            "frontier.json to bench/data/.", "Speed / quality frontier")
    return frontier.frontier_figure(data).update_layout(height=420)


def frontier_table(data: dict | None) -> str:
    """The frontier's figures as a Markdown table, the data's text HTML-escaped."""
    return frontier.frontier_table(data, escape=html.escape) if data and data.get("points") else ""


def make_rivals_figure(data: dict | None) -> go.Figure:
    """Every acceptance rule's speed-up over AR against its graded accuracy, beside the paper's table."""
    if not data or not data.get("points"):
        return empty_figure("No rivals' frontier yet: python -m csd.bench.rivals RUN_DIR ... --out DIR and copy its "
                            "rivals.json to bench/data/.", "Acceptance rules: speed against quality")
    return frontier.rivals_figure(data)


def rivals_table(data: dict | None) -> str:
    """The rivals' frontier as Markdown, the data's text HTML-escaped."""
    return frontier.rivals_table(data, escape=html.escape) if data and data.get("points") else ""
