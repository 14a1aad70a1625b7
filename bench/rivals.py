"""The rivals' frontier: every acceptance rule's speed and quality from benchmark runs on the same
items, beside the paper's table (docs/benchmarks.md, "How the benchmark measures").

``python -m csd.bench.rivals RUN_DIR [RUN_DIR ...] --out DIR`` writes rivals.json, rivals.md and rivals.html.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from csd.config import RIVAL_PARAMS, CSDConfig
from csd.events import common_prefix

from .io import fmt, ratio_text, write_outputs
from .results import ResultsError, by_item, load_results
from .stats import paired_accuracy, speedup, wilson

GRADED = ("gsm8k", "humaneval")
OPEN = ("prose",)
# The paper's comparison of relaxed rules, as PAPER.md quotes one summary of it (its exact setting is
# not confirmed there): speed-up over AR and accuracy. Not measured here.
PAPER = [{"method": "SD", "speedup": 1.56, "accuracy": 58.7}, {"method": "FLy", "speedup": 1.75, "accuracy": 58.9},
         {"method": "Reflective Verification", "speedup": 1.76, "accuracy": 59.9},
         {"method": "lossy SD (τ 0.6)", "speedup": 1.85, "accuracy": None},
         {"method": "CSD", "speedup": 1.89, "accuracy": 59.9}]
PAPER_SOURCE = "the CSD paper's comparison table as one summary quotes it (PAPER.md; its setting is not confirmed)"


def _speed(run: dict, method: str, ref: str) -> tuple[float | None, list | None]:
    return speedup((r[method]["new_tokens"], r[method]["wall_s"], r[ref]["new_tokens"], r[ref]["wall_s"])
                   for r in by_item(run["items"]).values() if r.get(method) and r.get(ref))


def setting(s: dict | None) -> str:
    """A column's setting in a few words from its results.json entry, e.g. "γ auto, copies 16, λ 6, τ 0.01"
    (what its rule reads); empty when the run did not record it."""
    if not s:
        return ""
    m = s.get("method")
    modules = CSDConfig(method=m)            # which parts of the rule the method reads (the engine's own test)
    if not modules.uses_draft:
        return "no draft"
    parts = [f"γ {s.get('gamma')}", f"copies {s.get('lookup') or 'off'}"]
    if modules.use_ocm:
        parts.append(f"λ {s.get('lam'):g}")
    if modules.use_scg:
        parts.append(f"τ {s.get('tau'):g}")
    parts += [f"{k} {s[k]:g}" for k in RIVAL_PARAMS.get(m, ()) if isinstance(s.get(k), (int, float))]
    return ", ".join(parts)


def _quality(items: dict, method: str, ar_ids: dict) -> dict:
    graded = [(r[method]["correct"], r["ar"]["correct"] if "ar" in r else ar_ids.get(k, {}).get("correct"))
              for k, r in items.items() if k[0] in GRADED and method in r and r[method].get("correct") is not None]
    k = sum(bool(c) for c, _ in graded)
    out = {"n_graded": len(graded), "accuracy": k / len(graded) if graded else None,
           "accuracy_ci95": wilson(k, len(graded)), "per_dataset": {}}
    for ds in GRADED:
        rows = [r[method] for key, r in items.items() if key[0] == ds and method in r]
        got = [bool(x["correct"]) for x in rows if x.get("correct") is not None]
        out["per_dataset"][ds] = {"n": len(got), "correct": sum(got)}
    pairs = [(c, a) for c, a in graded if a is not None]
    out["vs_ar"] = paired_accuracy(pairs) if pairs else None
    prose = [(r[method]["token_ids"], ar_ids[key]["token_ids"]) for key, r in items.items()
             if key[0] in OPEN and method in r and key in ar_ids]
    if prose:
        out["prose"] = {"n": len(prose), "identical": sum(a == b for a, b in prose),
                        "prefix_share": sum(common_prefix(b, a) / max(len(b), 1) for a, b in prose) / len(prose),
                        "length_ratio": sum(len(a) for a, _ in prose) / max(sum(len(b) for _, b in prose), 1)}
    return out


def frontier(runs: list[dict]) -> dict:
    """The rivals' frontier of ``runs`` (parsed results.json, the same items, SD in each, AR in one)."""
    if not runs:
        raise ResultsError("give at least one benchmark run")
    with_ar = [r for r in runs if any(i["method"] == "ar" for i in r["items"])]
    if not with_ar:
        raise ResultsError("no run has an AR column: run one part with --methods ar,sd,...")
    base = with_ar[0]
    ar_ids = {k: r["ar"] for k, r in by_item(base["items"]).items() if "ar" in r}
    keys = set(ar_ids)
    points = []
    sd_over_ar, sd_ci = _speed(base, "sd", "ar")
    for n, run in enumerate(runs, 1):
        items = by_item(run["items"])
        if set(items) != keys:
            raise ResultsError(f"{run['_path']}: not the same items as {base['_path']} "
                               f"({len(items)} against {len(keys)})")
        methods = list(dict.fromkeys(i["method"] for i in run["items"]))
        has_ar = "ar" in methods
        if not has_ar and "sd" not in methods:
            raise ResultsError(f"{run['_path']}: neither AR nor SD to compare its speed with")
        for m in methods:
            if m in {p["method"] for p in points}:
                continue                        # SD (or AR) already taken from an earlier run
            if has_ar:
                x, ci, how = *_speed(run, m, "ar"), "same run"
            else:
                vs_sd, ci_sd = _speed(run, m, "sd")
                x = vs_sd * sd_over_ar if vs_sd and sd_over_ar else None
                ci = [c * sd_over_ar for c in ci_sd] if ci_sd and sd_over_ar else None
                how = f"x SD in run {n} ({vs_sd:.3f}) times SD's x AR in run {runs.index(base) + 1}" if vs_sd else "–"
            tps = [i for i in run["items"] if i["method"] == m]
            conf = ((run["meta"].get("config") or {}).get("settings") or {}).get(m)
            points.append({"method": m, "run": n, "setting": setting(conf),
                           "speedup_over_ar": x, "speedup_ci95": ci, "speed_from": how,
                           "tokens_per_s": sum(i["new_tokens"] for i in tps) / max(sum(i["wall_s"] for i in tps), 1e-9),
                           **_quality(items, m, ar_ids)})
    meta = {"machine": (base["meta"].get("machine") or {}).get("cpu"), "dtype": base["meta"].get("dtype"),
            "models": base["meta"].get("models"), "items": len(keys),
            "runs": [{"path": r["_path"], "command": r["meta"].get("command"),
                      "started_at": r["meta"].get("started_at"), "finished_at": r["meta"].get("finished_at"),
                      "status": r.get("status")} for r in runs],
            "sd_over_ar": sd_over_ar, "sd_over_ar_ci95": sd_ci}
    return {"meta": meta, "points": points, "paper": PAPER, "paper_source": PAPER_SOURCE}


def markdown(data: dict, escape=str) -> str:
    """The frontier as a Markdown table, then the paper's table beside it (marked as the paper's).
    ``escape`` is applied to every text taken from the data (the app passes ``html.escape``)."""
    m = data["meta"]
    rows = ["| method | setting | x AR (95% CI) | accuracy, GSM8K + HumanEval [95% CI] | vs AR (gained / lost) | "
            "prose: identical to AR | prose: AR's tokens before the first difference | prose: length / AR's |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in data["points"]:
        speed = ratio_text(p["speedup_over_ar"], p.get("speedup_ci95"))
        speed += "" if p["speed_from"] == "same run" else " †"              # chained through SD
        acc, aci = p.get("accuracy"), p.get("accuracy_ci95")
        acc_s = "–" if acc is None else f"{100 * acc:.0f}% [{100 * aci[0]:.0f}, {100 * aci[1]:.0f}] of {p['n_graded']}"
        vs = p.get("vs_ar") or {}
        pr = p.get("prose") or {}
        rows.append(f"| {escape(str(p['method']))} | {escape(p.get('setting') or '–')} | {speed} | {acc_s} | "
                    f"+{vs.get('gained', 0)} / -{vs.get('lost', 0)} | "
                    f"{pr.get('identical', '–')} of {pr.get('n', '–')} | {fmt(pr.get('prefix_share'), '.0%')} | "
                    f"{fmt(pr.get('length_ratio'), '.2f')} |")
    runs = "; ".join(f"run {i}: `{escape(str(r['command']))}`" for i, r in enumerate(m["runs"], 1))
    head = (f"Measured on {escape(str(m['machine']))} (target {escape(str(m['dtype']))}), "
            f"{m['items']} items ({runs}). x AR: tokens per second "
            "over AR's on the same items; † chained through SD (x SD in its run times SD's x AR in the AR run).")
    paper = ["| method (the paper's) | speed-up | accuracy |", "|---|---:|---:|"] + [
        f"| {p['method']} | {p['speedup']:.2f}x | {fmt(p['accuracy'], '.1f')} |" for p in data["paper"]]
    return "\n".join([head, "", *rows, "", f"The paper's figures, not ours ({data['paper_source']}):", "", *paper])


def figure(data: dict):
    """Ours (speed-up over AR against graded accuracy, with intervals) beside the paper's table."""
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"measured here: {data['meta']['machine']}",
                                                        "the paper's figures (not ours)"))
    for p in data["points"]:
        if p.get("speedup_over_ar") is None or p.get("accuracy") is None:
            continue
        ci, aci = p.get("speedup_ci95"), p.get("accuracy_ci95")
        fig.add_scatter(x=[p["speedup_over_ar"]], y=[100 * p["accuracy"]], mode="markers+text", text=[p["method"]],
                        textposition="top center", name=p["method"], row=1, col=1,
                        error_x=dict(type="data", symmetric=False, array=[ci[1] - p["speedup_over_ar"]],
                                     arrayminus=[p["speedup_over_ar"] - ci[0]]) if ci else None,
                        error_y=dict(type="data", symmetric=False, array=[100 * (aci[1] - p["accuracy"])],
                                     arrayminus=[100 * (p["accuracy"] - aci[0])]) if aci else None)
    for p in data["paper"]:
        if p["accuracy"] is not None:
            fig.add_scatter(x=[p["speedup"]], y=[p["accuracy"]], mode="markers+text", text=[p["method"]],
                            textposition="top center", name=f"paper: {p['method']}", marker=dict(symbol="diamond-open"),
                            row=1, col=2)
    fig.update_xaxes(title_text="tokens/s over AR's")
    fig.update_yaxes(title_text="accuracy (%)")
    fig.update_layout(template="plotly_white", showlegend=False, height=480,
                      title="Acceptance rules: speed against quality (ours left, the paper's right)")
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.bench.rivals", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="benchmark output directories (or results.json files)")
    ap.add_argument("--out", type=Path, required=True, help="directory for rivals.json, rivals.md and rivals.html")
    a = ap.parse_args(argv)
    try:
        data = frontier([load_results(p) for p in a.runs])
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_outputs(a.out, "rivals", data, markdown(data))
    figure(data).write_html(a.out / "rivals.html", include_plotlyjs="directory", full_html=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
