"""The benchmark's outputs for people: the paper-style Markdown table and the Plotly charts."""
from __future__ import annotations

from pathlib import Path


def _fmt(x, spec=".2f", suffix="") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def render_markdown(results: dict) -> str:
    meta, summary = results["meta"], results.get("summary") or {}
    cfg = meta["config"]
    mem = meta["memory"]
    lines = [
        "# CSD Explorer benchmark", "",
        f"- Command: `{meta['command'] or '(python API)'}`",
        f"- Date: {meta['started_at']} (UTC); status: {results.get('status')}",
        f"- Machine: {meta['machine']['cpu']}, {meta['machine']['cpu_count']} cores, "
        f"{meta['machine']['torch_threads']} torch threads, torch {meta['machine']['torch']}, "
        f"transformers {meta['machine']['transformers']}; load average at start "
        f"{_fmt((meta.get('loadavg_start') or [None])[0], '.1f')}",
        f"- Pair: {meta['pair']['draft']} -> {meta['pair']['target']}, target dtype **{meta['dtype']}**, "
        f"draft dtype **{meta.get('draft_dtype') or '-'}**, greedy, "
        f"chat template, max_new_tokens {cfg['max_new_tokens']}, gamma {cfg['gamma']}, lambda {cfg['lam']:g}, "
        f"tau {cfg['tau']:g}, seed {cfg['seed']}",
        f"- Memory: start memory with {mem['patterns']} patterns ({mem['candidates_at_lambda']} at lambda), "
        f"{cfg['memory_mode']} updates, one copy per method",
        "- Speed-up: over AR on the same items; Σ wall = ratio of summed wall times, tok/s = mean of "
        "per-item tokens-per-second ratios. Target passes: total; mean acc. length = tokens per target pass.",
        "",
        "| Dataset | Method | N | Speed-up (Σ wall) | Speed-up (tok/s) | tok/s | Target passes | Mean acc. length "
        "| Acceptance | Rescued | Accuracy | Same as AR |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ds, per_method in summary.items():
        for m, s in per_method.items():
            acc = "–" if s["accuracy"] is None else f"{s['n_correct']}/{s['n_graded']} ({100 * s['accuracy']:.0f}%)"
            same = "–" if s.get("identical_to_ar") is None or m == "ar" else f"{s['identical_to_ar']}/{s['n']}"
            lines.append(
                f"| {ds} | {m} | {s['n']} | {_fmt(s.get('speedup_wall'), '.2f', 'x')} | "
                f"{_fmt(s.get('speedup_tps_mean'), '.2f', 'x')} | {_fmt(s['tokens_per_s'], '.2f')} | "
                f"{_fmt(s['target_passes'], 'd')} | {_fmt(s['mean_accepted_length'], '.2f')} | "
                f"{_fmt(None if s['acceptance_rate'] is None else 100 * s['acceptance_rate'], '.1f', '%')} | "
                f"{_fmt(s['rescued'], 'd')} | {acc} | {same} |")
    targets = results.get("targets") or {}
    if targets:
        lines += ["", "## Issue 5 figures (over all items)", ""]
        names = {"csd_over_ar": "CSD speed-up over AR (Σ wall)", "csd_over_hf": "CSD speed-up over hf-assisted",
                 "sd_over_hf": "SD speed-up over hf-assisted", "csd_passes_vs_sd": "CSD target passes / SD's",
                 "csd_bookkeeping_share": "CSD memory + gate time / wall time"}
        for k, label in names.items():
            t = targets.get(k) or {}
            if t.get("value") is None:
                lines.append(f"- {label}: not measured")
                continue
            op = "<=" if k in ("csd_passes_vs_sd", "csd_bookkeeping_share") else ">="
            val = f"{100 * t['value']:.3f}%" if k == "csd_bookkeeping_share" else f"{t['value']:.2f}"
            thr = f"{100 * t['threshold']:.1f}%" if k == "csd_bookkeeping_share" else f"{t['threshold']:g}"
            lines.append(f"- {label}: {val} (target {op} {thr}: {'met' if t['met'] else 'missed'})")
        a = targets.get("csd_accuracy_vs_ar")
        if a and a.get("n"):
            lines.append(f"- CSD accuracy minus AR's: {100 * a['diff']:+.1f} points over N = {a['n']} graded items "
                         f"({a['gained']} gained, {a['lost']} lost)")
    for m, p in (results.get("divergences") or {}).items():
        if p.get("divergences"):
            lines += ["", f"Divergence patterns seen by `{m}`: {p['divergences']} divergences, {p['patterns']} patterns; "
                          f"the top 20% ({p['top20_patterns']}) cover {100 * p['top20_share']:.0f}%."]
    return "\n".join(lines) + "\n"


def write_charts(results: dict, out: Path) -> list[Path]:
    """speedup.html and divergences.html, plotly.js inline so that they open offline."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    paths = []
    summary = results.get("summary") or {}
    dtype = results["meta"]["dtype"]
    fig = go.Figure()
    methods = results["meta"]["config"]["methods"]
    datasets = list(summary)
    for m in methods:
        ys = [(summary[ds].get(m) or {}).get("speedup_wall") for ds in datasets]
        tps = [(summary[ds].get(m) or {}).get("speedup_tps_mean") for ds in datasets]
        ns = [(summary[ds].get(m) or {}).get("n") for ds in datasets]
        fig.add_bar(name=m, x=datasets, y=ys, text=[_fmt(y, ".2f", "x") for y in ys], textposition="outside",
                    customdata=list(zip(tps, ns)),
                    hovertemplate=f"{m}<br>%{{x}}: %{{y:.2f}}x (Σ wall)<br>mean tok/s ratio %{{customdata[0]:.2f}}x"
                                  f"<br>N = %{{customdata[1]}}<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"Speed-up over autoregressive decoding ({dtype}, "
                            f"{results['meta']['config']['max_new_tokens']} new tokens)",
                      barmode="group", yaxis_title="speed-up over AR (ratio of summed wall times)",
                      xaxis_title="dataset", template="plotly_white")
    p = out / "speedup.html"
    fig.write_html(p, include_plotlyjs=True, full_html=True)
    paths.append(p)

    div = results.get("divergences") or {}
    m = "csd" if "csd" in div else next(iter(div), None)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.5, 0.5], vertical_spacing=0.18,
                        subplot_titles=("Cumulative share of divergences covered by the top patterns",
                                        "Most frequent divergence patterns (draft -> target)"))
    title = "Divergence patterns"
    if m is not None and div[m].get("divergences"):
        d = div[m]
        n = d["patterns"]
        k = d["top20_patterns"]
        fig.add_scatter(x=[0.0] + [(i + 1) / n for i in range(n)], y=[0.0] + d["cumulative"], mode="lines",
                        name="cumulative share", hovertemplate="top %{x:.0%} of patterns: %{y:.0%}<extra></extra>",
                        row=1, col=1)
        fig.add_scatter(x=[k / n], y=[d["top20_share"]], mode="markers+text", name="top 20%",
                        text=[f"top 20% ({k} of {n} patterns): {100 * d['top20_share']:.0f}% of divergences"],
                        textposition="bottom right", row=1, col=1)
        fig.add_vline(x=0.2, line_dash="dot", line_color="grey", row=1, col=1)
        top = d["top"][:20]
        fig.add_bar(x=[f"{t['draft_text']!r} -> {t['target_text']!r}" for t in top], y=[t["count"] for t in top],
                    name="count", row=2, col=1)
        title = (f"Divergence patterns seen by {m} in this run: {d['divergences']} divergences, {n} patterns; "
                 f"top 20% cover {100 * d['top20_share']:.0f}%")
    fig.update_xaxes(title_text="fraction of patterns (most frequent first)", tickformat=".0%", range=[0, 1.02],
                     row=1, col=1)
    fig.update_yaxes(title_text="share of divergences", tickformat=".0%", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title_text="count", row=2, col=1)
    fig.update_layout(title=title, template="plotly_white", showlegend=False, height=800)
    p = out / "divergences.html"
    fig.write_html(p, include_plotlyjs=True, full_html=True)
    paths.append(p)
    return paths




def profile_figure(costs, title: str = ""):
    """The machine's cost model: the target's pass time by block length, the block's total time
    with the draft, and the ideal speed-up over AR at each block length (every draft token kept)."""
    from plotly.subplots import make_subplots

    gs = list(range(1, 33))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Time per block (ms)", "Ideal speed-up over AR"))
    fig.add_scatter(x=gs, y=[costs.verify(g + 1) for g in gs], mode="lines+markers", name="target verify pass",
                    row=1, col=1)
    fig.add_scatter(x=gs, y=[costs.block_ms(g) for g in gs], mode="lines+markers", name="draft g tokens + verify",
                    row=1, col=1)
    fig.add_scatter(x=gs, y=[costs.bound(g) for g in gs], mode="lines+markers", name="bound (all accepted)",
                    row=1, col=2)
    g_best, b_best = costs.best_bound()
    fig.add_annotation(x=g_best, y=b_best, text=f"{b_best:.2f}x at gamma {g_best}", showarrow=True, row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    fig.update_xaxes(title_text="draft block length gamma")
    fig.update_layout(title=title or "Measured costs", template="plotly_white", height=420)
    return fig
