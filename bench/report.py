"""The benchmark's outputs for people: the Markdown report and the Plotly charts.

``python -m csd.bench.report RUN_DIR`` renders a run again from its stored items by the current code;
``python -m csd.bench.report RUN_A RUN_B ... --out DIR`` pools runs of one set-up on different items."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from csd.representation import Representation

from .alarms import alarm_lines
from .io import fmt, pct, ratio, write_json
from .results import GOALS, ResultsError, bounds, fill_leaves_sd_at, load_results, overall, pool, resummarize
from .waterfall import waterfall_lines


def _acc(s: dict) -> str:
    if s.get("accuracy") is None:
        return "–"
    ci = s.get("accuracy_ci95")
    band = f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci else ""
    return f"{s['n_correct']}/{s['n_graded']} ({100 * s['accuracy']:.0f}%{band})"


def _rescued(s: dict) -> str:
    """Rescued tokens, and their share of the divergences where those were counted."""
    if s.get("rescued") is None:
        return "–"
    return f"{s['rescued']} ({pct(s.get('rescues_per_divergence'), 0)})" if s.get("divergences") else f"{s['rescued']}"


def _vs(p: dict | None) -> str:
    if not p or not p.get("n"):
        return "–"
    pv = f" (p = {p['p_value']:.2f})" if p.get("p_value") is not None else ""
    return f"+{p['gained']} / −{p['lost']}{pv}"


def _profile_figures(p: dict, bound_label: str) -> str:
    b = p.get("best_bound") or {}
    return (f"draft {p['draft_ms']:.1f} ms/token, target {p['verify_ms'].get('1', 0):.1f} ms for 1 token and "
            f"{p['verify_ms'].get('7', 0):.1f} ms for 7; {bound_label} {b.get('speedup', 0):.2f}x AR at gamma "
            f"{b.get('gamma')}")


def leave_sd_lines(results: dict, top: int = 8) -> list[str]:
    """Where each CSD column's answers first leave SD's, grouped by the pair of tokens there."""
    by_method: dict[str, dict[tuple, list]] = {}
    for it in results.get("items") or []:
        at = it.get("leaves_sd_at")
        if at and it["method"].startswith("csd"):
            by_method.setdefault(it["method"], {}).setdefault((at[1], at[2]), []).append((it["dataset"], at[0]))
    lines = []
    for m, groups in by_method.items():
        n = sum(len(v) for v in groups.values())
        lines += ["", f"Where `{m}`'s answers first leave SD's ({n} answers differ; SD's token there is the target's "
                      f"choice, the other the token {m} kept, by a rescue or, in int8, by the pass's rounding):", "",
                  "| SD's token | kept instead | answers | datasets | positions |", "|---|---|---:|---|---|"]
        ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        for (a, b), rows in ranked[:top]:
            ds = ", ".join(f"{d} {c}" for d, c in Counter(d for d, _ in rows).most_common())
            lo, hi = min(p for _, p in rows), max(p for _, p in rows)
            lines.append(f"| {_tok(a)} | {_tok(b)} | {len(rows)} | {ds} | {lo if lo == hi else f'{lo}-{hi}'} |")
        if len(ranked) > top:
            lines.append(f"| (other pairs) | | {sum(len(v) for _, v in ranked[top:])} | | |")
    return lines


def _tok(text: str) -> str:
    """A token as Markdown inline code, newlines and tabs escaped, pipes kept out of the table."""
    if not text:
        return "(end)"
    t = repr(text)[1:-1].replace("|", "\\|")
    return f"`` {t} ``" if "`" in t else f"`{t}`"


def _header_lines(results: dict) -> list[str]:
    """The run's command, machine, pair, set-up and the reading of the table's columns."""
    meta = results["meta"]
    cfg, mem, models, prof = meta["config"], meta["memory"], meta.get("models") or {}, meta.get("profile")
    copies = f"up to {cfg['lookup']} (--lookup)" if cfg.get("lookup") else "off"
    impl = f" ({models['target_impl']} path)" if models.get("target_impl") else ""   # and an int8 target's smoothing
    impl += f", smoothed ({models['target_smoothing']})" if models.get("target_smoothing") else ""
    hf = [m for m, st in (cfg.get("settings") or {}).items() if st.get("hf")]      # rows on transformers' generate
    engines = (f"Rows on transformers' generate, on the same pair, representation and prompts: {', '.join(hf)}; "
               "every other row runs on this project's engine." if hf else "Every row runs on this project's engine.")
    lines = [
        "# CSD Explorer benchmark", "",
        f"- Command: `{meta['command'] or '(python API)'}`",
        f"- Date: {meta['started_at']} (UTC); status: {results.get('status')}",
        f"- Machine: {meta['machine']['cpu']}, {meta['machine']['torch_threads']} torch threads, torch "
        f"{meta['machine']['torch']}, transformers {meta['machine']['transformers']}; load average at start "
        f"{fmt((meta.get('loadavg_start') or [None])[0], '.1f')}",
        f"- Pair: {meta['pair']['draft']} -> {meta['pair']['target']}; target **{meta['dtype']}**"
        f"{impl}, draft "
        f"**{Representation.of(meta).draft or '-'}** ({models.get('draft_impl', '-')} path, "
        f"{models.get('draft_vocab', '-')} proposable tokens); greedy, chat template, "
        f"max_new_tokens {cfg['max_new_tokens']}, gamma {cfg['gamma']}, "
        f"copies from the context {copies}, seed {cfg['seed']}",
        f"- Memory: start memory with {mem['patterns']} patterns ({mem['candidates_at_lambda']} at lambda "
        f"{cfg['lam']:g}), {cfg['memory_mode']} updates, one copy per CSD column",
    ]
    for i, r in enumerate(meta.get("pooled_from") or []):
        lines.append(f"- Pooled, run {i + 1} of {len(meta['pooled_from'])}: `{r['command']}` ({r['items']} items, "
                     f"{r['started_at']}, {r['status']}); divergence patterns: see that run's own report")
    if prof:
        lines.append(f"- Profile of this machine: {_profile_figures(prof, 'ideal bound')}")
        for c in meta.get("profile_checks") or []:
            lines.append(f"  - re-measured beside the run ({c.get('measured_at', '')}): {_profile_figures(c, 'bound')}")
    lines += [
        "- Speed-up (× AR, × SD, × hf): the ratio of tokens per second (summed tokens / summed wall time on "
        "the same items), with its 95% bootstrap interval over the items in brackets. "
        f"{engines} Passes/token: target passes per generated "
        "token. Acc. vs SD: items gained / lost against SD on the same items, exact McNemar p. Accuracy: "
        "graded items with a 95% Wilson interval.", "",
        "| Dataset | Method | N | tok/s | × AR | × SD | × hf | Passes/token | Mean acc. len | Acceptance "
        "| Rescued (per div.) | Ended (EOS) | Accuracy [95% CI] | Acc. vs SD | Same as SD |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines


def _summary_rows(summary: dict) -> list[str]:
    """A table row per dataset and method."""
    lines = []
    for ds, per_method in summary.items():
        for m, s in per_method.items():
            same = "–" if s.get("identical_to_sd") is None or m == "sd" else f"{s['identical_to_sd']}/{s['n']}"
            lines.append(
                f"| {ds} | {m} | {s['n']} | {fmt(s['tokens_per_s'], '.2f')} | {ratio(s, 'speedup_over_ar')} "
                f"| {ratio(s, 'speedup_over_sd')} | {ratio(s, 'speedup_over_hf')} "
                f"| {fmt(s.get('target_passes_per_token'), '.3f')} | {fmt(s['mean_accepted_length'], '.2f')} "
                f"| {pct(s['acceptance_rate'])} | {_rescued(s)} | {pct(s.get('eos_share'), 0)} | {_acc(s)} "
                f"| {_vs(s.get('accuracy_vs_sd'))} | {same} |")
    return lines


def _goal_lines(results: dict) -> list[str]:
    """Each goal over all items, its value and whether it was met."""
    targets = results.get("targets") or {}
    if not targets:
        return []
    lines = ["", "## Goals (over all items, the `csd` column)", ""]
    for k, (*_, higher, label, unit) in GOALS.items():
        t = targets.get(k) or {}
        if t.get("value") is None:
            lines.append(f"- {label}: not measured")
            continue
        val = f"{100 * t['value']:.3f}%" if unit == "%" else f"{t['value']:.2f}{unit}"
        thr = f"{100 * t['threshold']:g}%" if unit == "%" else f"{t['threshold']:g}{unit}"
        if ci := t.get("ci95"):
            val += f" (95% bootstrap interval over the items: {ci[0]:.2f}-{ci[1]:.2f}{unit})"
        lines.append(f"- {label}: {val} (goal {'>=' if higher else '<='} {thr}: {'met' if t['met'] else 'missed'})")
    share = targets.get("csd_share_of_bound") or {}
    if share.get("value") is not None:
        verdict = ("the goal where the bound is under 2x: at least 80%: " + ("met" if share["met"] else "missed")
                   if share["met"] is not None else "the bound allows 2x, so the 2x goal applies")
        found = bounds(results)
        spread = (f"the median of {len(found)} profiles, {min(found):.2f}-{max(found):.2f}x"
                  if len(found) > 1 else "one profile")
        lines.append(f"- CSD share of the profile's bound ({share['bound']:.2f}x AR, every draft token "
                     f"accepted; {spread}): {100 * share['value']:.0f}% ({verdict})")
    for ref in ("sd", "ar"):
        a = targets.get(f"csd_accuracy_vs_{ref}")
        if a and a.get("n"):
            lines.append(f"- CSD accuracy against {ref.upper()}: {a['gained']} items gained, {a['lost']} lost of "
                         f"{a['n']} graded (exact McNemar p = {a['p_value']:.2f})")
    return lines


def render_markdown(results: dict) -> str:
    meta, summary = results["meta"], results.get("summary") or {}
    lines = _header_lines(results) + _summary_rows(summary) + _goal_lines(results)
    if len(results.get("frontier") or []) > 1:
        lines += ["", "## Frontier (all items)", "", frontier_markdown(results["frontier"], meta)]
    for m, st in overall(summary).items():
        if st.get("lookup_blocks") is not None:
            lines += ["", f"Copies from the context in `{m}`: {st['lookup_blocks']} target passes "
                          f"({pct(st.get('lookup_pass_share'), 0)} of its passes) verified {st['lookup_drafted']} "
                          f"copied tokens and kept {st['lookup_kept']} ({pct(st.get('lookup_acceptance'), 0)})."]
    lines += waterfall_lines(results)
    lines += alarm_lines(results, overall(summary))
    lines += leave_sd_lines(results)
    for m, p in (results.get("divergences") or {}).items():
        if p.get("divergences"):
            lines += ["", f"Divergence patterns seen by `{m}`: {p['divergences']} divergences, "
                          f"{p['patterns']} patterns; "
                          f"the top 20% ({p['top20_patterns']}) cover {100 * p['top20_share']:.0f}%."]
    return "\n".join(lines) + "\n"


def _speedup_figure(results: dict):
    """Each method's speed-up over AR per dataset, with its interval."""
    import plotly.graph_objects as go

    meta, summary = results["meta"], results.get("summary") or {}
    fig = go.Figure()
    datasets = list(summary)
    for m in meta["config"]["methods"]:
        per = [summary[ds].get(m) or {} for ds in datasets]
        ys = [p.get("speedup_over_ar") for p in per]
        cis = [p.get("speedup_over_ar_ci95") if y is not None else None for p, y in zip(per, ys)]
        fig.add_bar(name=m, x=datasets, y=ys, text=[fmt(y, ".2f", "x") for y in ys], textposition="outside",
                    error_y={"type": "data", "symmetric": False,
                             "array": [c[1] - y if c else 0 for c, y in zip(cis, ys)],
                             "arrayminus": [y - c[0] if c else 0 for c, y in zip(cis, ys)]},
                    customdata=[p.get("n") for p in per],
                    hovertemplate=f"{m}<br>%{{x}}: %{{y:.2f}}x AR in tok/s<br>N = %{{customdata}}<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"Speed-up over autoregressive decoding ({meta['dtype']}, "
                            f"{meta['config']['max_new_tokens']} new tokens)",
                      barmode="group", yaxis_title="speed-up over AR (ratio of tok/s, 95% interval)",
                      xaxis_title="dataset", template="plotly_white")
    return fig


def _divergence_figure(results: dict):
    """How much of the divergences the top patterns cover, and the most frequent patterns."""
    from plotly.subplots import make_subplots

    div = results.get("divergences") or {}
    m = "csd" if "csd" in div else next(iter(div), None)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.5, 0.5], vertical_spacing=0.18,
                        subplot_titles=("Cumulative share of divergences covered by the top patterns",
                                        "Most frequent divergence patterns (draft -> target)"))
    title = "Divergence patterns"
    if m is not None and div[m].get("divergences"):
        d = div[m]
        n, k = d["patterns"], d["top20_patterns"]
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
    return fig


def write_charts(results: dict, out: Path) -> None:
    """speedup.html, divergences.html and (with a frontier) frontier.html, plotly.js beside them."""
    figs = {"speedup": _speedup_figure(results), "divergences": _divergence_figure(results)}
    if results.get("frontier"):
        figs["frontier"] = frontier_figure(results["frontier"], results["meta"])
    for name, fig in figs.items():
        fig.write_html(out / f"{name}.html", include_plotlyjs="directory", full_html=True)


FRONTIER_COLOURS = {"ar": "#7f7f7f", "sd": "#1f77b4", "csd": "#e07b00",   # the rivals: by method, sweeps alike
                    "lossy": "#8c564b", "topk": "#17becf", "typical": "#bcbd22", "fly": "#e377c2"}


def frontier_figure(points: list[dict], meta: dict | None = None):
    """Speed against accuracy, one point per setting, with 95% intervals on accuracy."""
    import plotly.graph_objects as go

    fig = go.Figure()
    merged = len((meta or {}).get("runs") or []) > 1     # joined from several runs: speed relative to SD in its own
    xkey = "speed_vs_sd" if merged else "tokens_per_s"
    pts = [p for p in points if p.get(xkey) is not None]
    for p in pts:
        name = p["method"]
        acc, ci = p.get("accuracy"), p.get("accuracy_ci95")
        colour = FRONTIER_COLOURS.get(name.split("[")[0], "#e07b00" if name.startswith("csd[") else "#2ca02c")
        symbol = "diamond" if name.startswith("csd") else ("square" if name == "sd" else "circle")
        err = (dict(type="data", symmetric=False, array=[ci[1] - acc], arrayminus=[acc - ci[0]], thickness=1)
               if acc is not None and ci else None)
        vs = p.get("accuracy_vs_sd") or {}
        fig.add_scatter(
            x=[p[xkey]], y=[acc], mode="markers+text", name=name, text=[name], textposition="top center",
            marker=dict(size=12, color=colour, symbol=symbol, line=dict(width=1, color="#333")), error_y=err,
            hovertemplate=(f"<b>{name}</b><br>{p['tokens_per_s']:.2f} tokens/s"
                           + (f" ({p[xkey]:.2f}x SD in run {p.get('run')})" if merged else "")
                           + "<br>accuracy %{y:.1%}"
                           f"<br>passes/token {fmt(p.get('target_passes_per_token'), '.3f')}"
                           f"<br>rescued {p.get('rescued') if p.get('rescued') is not None else '–'}"
                           f"<br>vs SD: +{vs.get('gained', 0)} / -{vs.get('lost', 0)}<extra></extra>"))
    title = "Speed / quality frontier: one point per setting (accuracy with 95% intervals)"
    if meta:
        title += f"<br><sup>{meta['machine']['cpu']}, target {meta['dtype']}, draft {Representation.of(meta).draft}, " \
                 f"N = {pts[0]['n'] if pts else 0} items</sup>"
    xtitle = "tokens per second " + ("relative to SD in the same run " if merged else "") + "(all items)"
    fig.update_layout(title=title, template="plotly_white", xaxis_title=xtitle,
                      yaxis_title="accuracy (graded items)", yaxis_tickformat=".0%", showlegend=False, height=520)
    return fig


def frontier_markdown(points: list[dict], meta: dict | None = None, escape=str) -> str:
    """The frontier as a Markdown table, one row per setting; ``escape`` is applied to every text taken
    from the data (the app passes ``html.escape``)."""
    if not points:
        return ""
    meta = meta or {}
    merged = len(meta.get("runs") or []) > 1
    rows = ["| setting | tok/s | " + ("× SD, same run | " if merged else "") +
            "target passes / token | rescued | ended (EOS) | accuracy [95% CI] | vs SD (gained / lost) |",
            "|---|---:|" + ("---:|" if merged else "") + "---:|---:|---:|---:|---:|"]
    for p in points:
        acc, ci = p.get("accuracy"), p.get("accuracy_ci95")
        acc_s = "–" if acc is None else f"{100 * acc:.0f}%" + (f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci else "")
        rel_s = fmt(p.get("speed_vs_sd"), ".2f", f"x (run {p.get('run')})") + " | " if merged else ""
        rows.append(f"| {escape(str(p.get('method')))} | {fmt(p.get('tokens_per_s'))} | {rel_s}"
                    f"{fmt(p.get('target_passes_per_token'), '.3f')} | {fmt(p.get('rescued'), '')} | "
                    f"{pct(p.get('eos_share'), 0)} | {acc_s} | {_vs(p.get('accuracy_vs_sd'))} |")
    machine = escape(str((meta.get("machine") or {}).get("cpu", "")))
    where = f"on {machine} (target {escape(str(meta.get('dtype')))}); N = {points[0].get('n')} items"
    if merged:
        cmds = "; ".join(f"run {i + 1}: `{escape(str(r.get('command')))}`" for i, r in enumerate(meta["runs"]))
        head = (f"Merged from {len(meta['runs'])} runs on the same items ({cmds}) {where}; "
                "tokens/s compare only within a run.")
    else:
        head = f"Measured by `{escape(str(meta.get('command') or 'python -m csd bench'))}` {where}."
    return head + "\n\n" + "\n".join(rows)


def profile_figure(costs, title: str = ""):
    """The machine's cost model by block length: pass and block times, and the ideal speed-up over AR."""
    from plotly.subplots import make_subplots

    gs = list(range(1, 33))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Time per block (ms)", "Ideal speed-up over AR"))
    for name, ys, col in (("target verify pass", [costs.verify(g + 1) for g in gs], 1),
                          ("draft g tokens + verify", [costs.block_ms(g) for g in gs], 1),
                          ("bound (all accepted)", [costs.bound(g) for g in gs], 2)):
        fig.add_scatter(x=gs, y=ys, mode="lines+markers", name=name, row=1, col=col)
    g_best, b_best = costs.best_bound()
    fig.add_annotation(x=g_best, y=b_best, text=f"{b_best:.2f}x at gamma {g_best}", showarrow=True, row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    fig.update_xaxes(title_text="draft block length gamma")
    fig.update_layout(title=title or "Measured costs", template="plotly_white", height=420)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.bench.report", description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="+",
                    help="a benchmark output directory (holding results.json); several with --out: pool them")
    ap.add_argument("--out", help="with several runs: the directory of the pooled report")
    args = ap.parse_args(argv)
    if len(args.run) > 1 and not args.out:
        print("error: several runs are pooled into a new report: give it a directory with --out", file=sys.stderr)
        return 2
    try:
        runs = [load_results(Path(r)) for r in args.run]
        for r in runs:
            fill_leaves_sd_at(r)
        if len(runs) > 1:
            results = pool(runs, "python -m csd.bench.report " + " ".join(args.run) + f" --out {args.out}")
            path = Path(args.out) / "results.json"          # write_json makes the folder
        else:
            path = Path(runs[0].pop("_path"))
            results = resummarize(runs[0])
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(path, results)
    (path.parent / "results.md").write_text(render_markdown(results), encoding="utf-8")
    write_charts(results, path.parent)
    done = "pooled into" if len(runs) > 1 else "re-rendered"
    print(f"{done} {path} and {path.parent / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
