"""The speed tables of docs/, re-derived from the committed ``results.json`` files, so that a table cannot drift
from its measurement (markers: docs/benchmarks.md, "How the benchmark measures").

``check docs/*.md``: exit 1 and the differing tables when a figure differs; ``write FILE...`` rewrites them.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .io import DASH, fmt, md_table, pct, ratio, ratio_text, read_results_json
from .methods import HF_ASSISTED
from .report import _acc, _rescued, _vs
from .results import ResultsError, by_item, overall, resummarize
from .stats import speedup

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!-- figures: (?P<args>[^>]*?) -->\n(?P<body>.*?)<!-- /figures -->", re.S)
# a comma outside brackets: csd[lookup=16,lookup_ngram=2] is one name
LIST = re.compile(r",(?![^\[]*\])")


def _same(ref: str):
    def cell(m, s):
        if m == ref or s.get(f"identical_to_{ref}") is None:
            return DASH
        return f"{s[f'identical_to_{ref}']} of {s['n']}"
    return cell


def _copies(m, s):
    if not s.get("lookup_blocks"):
        return DASH
    return (f"{pct(s['lookup_pass_share'], 0)}, {s['lookup_drafted'] / s['lookup_blocks']:.1f}, "
            f"{pct(s['lookup_acceptance'], 0)}")


EXTRA = {   # columns=NAME: (header, cell from the method and its figures)
    "rescued": ("rescued (per divergence)", lambda m, s: _rescued(s) if m.startswith("csd") else DASH),
    "accuracy": ("accuracy (graded) [95% CI]", lambda m, s: _acc(s)),
    "vs_sd": ("vs SD: gained / lost (exact McNemar p)", lambda m, s: _vs(s.get("accuracy_vs_sd"))),
    "eos": ("ended by EOS", lambda m, s: pct(s.get("eos_share"), 0)),
    "copies": ("copy passes, copies per copy pass, kept", _copies),
    "same_ar": ("same answer as AR", _same("ar")),
    "same_sd": ("same answer as SD", _same("sd")),
}


def _over(results: dict, names: list[str], dataset: str, ref: str) -> tuple[str, dict]:
    """The column DATASET:REF: each method's speed-up over REF on the items of DATASET ("all": every item)
    that every method finished, as ``csd.bench.results.summarize`` computes it (``csd.bench.stats.speedup``)."""
    if ref not in names:
        raise ResultsError(f"columns: no method {ref} in this run (it has {', '.join(names)})")
    rows = [v for k, v in by_item(results["items"]).items() if all(n in v for n in names) and dataset in ("all", k[0])]
    if not rows:
        raise ResultsError(f"columns: no item of dataset {dataset} that every method finished")
    cells = {m: speedup([(r[m]["new_tokens"], r[m]["wall_s"], r[ref]["new_tokens"], r[ref]["wall_s"]) for r in rows])
             for m in names}
    cells = {m: ratio_text(v, None if m == ref else ci) for m, (v, ci) in cells.items()}
    label = "x " + {"ar": "AR", "sd": "SD"}.get(ref, ref)
    return (label if dataset == "all" else f"{dataset} ({len(rows)}): {label}"), cells


def _synthetic_stats(results: dict) -> dict:
    """A synthetic run's per-method figures again, from its stored records."""
    from .synthetic.report import Measured, summarize

    names = Measured.__dataclass_fields__
    records = [Measured(**{k: v for k, v in it.items() if k in names}) for it in results.get("items") or []]
    if not records:
        raise ResultsError("a synthetic run without stored items cannot be re-derived")
    ar = [r for r in records if r.method == "ar"]
    return {m: summarize([r for r in records if r.method == m], ar) for m in dict.fromkeys(r.method for r in records)}


def table(run: Path, methods: list[str] | None = None, dataset: str | None = None,
          columns: list[str] | None = None) -> str:
    """The Markdown table of one committed run, a row per method: tok/s and every speed-up with its
    interval, then passes per token, acceptance and ``columns`` (or, synthetic: tokens / pass, syncs / block)."""
    f = run / "results.json" if run.is_dir() else run
    try:
        f, raw = read_results_json(run)
    except (OSError, ValueError) as e:
        raise ResultsError(f"{f}: cannot be read ({e})") from None
    if isinstance(raw, dict) and raw.get("kind") == "synthetic":
        if columns:
            raise ResultsError(f"{f}: columns= applies to a benchmark run, not a synthetic one")
        stats = _synthetic_stats(raw)
        syncs = raw.get("syncs") or {}          # counted by CUDA's sync debug mode on one prompt, where it ran
        body = []
        for m in methods or stats:
            s, sync = stats[m], syncs.get(m) or {}
            body.append([m, fmt(s["tokens_per_s"], ".1f"), ratio(s, "speedup_over_ar"), fmt(s["mean_accepted_length"]),
                         fmt(sync.get("cuda_syncs_per_block", s["syncs_per_block"]))])
        return "\n".join(md_table(["method", "tok/s", "x AR", "tokens / target pass", "syncs / block"], body)) + "\n"
    if not isinstance(raw, dict) or "items" not in raw:     # (a run of the earlier engine has no frontier: fine here)
        raise ResultsError(f"{f}: not a benchmark results.json (no items)")
    summary = resummarize(raw)["summary"]
    stats = summary[dataset] if dataset else overall(summary)
    rows = methods or list(stats)
    if missing := [m for m in rows if m not in stats]:
        raise ResultsError(f"{run}: no method {', '.join(missing)} in this run (it has {', '.join(stats)})")
    refs = [(key, label) for key, ref, label in (("speedup_over_ar", "ar", "x AR"), ("speedup_over_sd", "sd", "x SD"),
                                                 ("speedup_over_hf", HF_ASSISTED, "x hf-assisted")) if ref in stats]
    n = stats[rows[0]]["n"]
    extra = []                                  # (header, {method: cell}) per asked column
    for c in columns or []:
        if ":" in c:
            extra.append(_over(raw, list(stats), *c.split(":", 1)))
        elif c in EXTRA:
            extra.append((EXTRA[c][0], {m: EXTRA[c][1](m, stats[m]) for m in rows}))
        else:
            raise ResultsError(f"columns: unknown column {c} ({', '.join(EXTRA)} or DATASET:METHOD)")
    head = [f"method ({n} items)", "tok/s", *(label for _, label in refs), "passes / token", "acceptance",
            *(h for h, _ in extra)]
    body = [[m, fmt(stats[m]["tokens_per_s"]), *(ratio(stats[m], key) for key, _ in refs),
             fmt(stats[m].get("target_passes_per_token"), ".3f"), pct(stats[m].get("acceptance_rate")),
             *(c[m] for _, c in extra)] for m in rows]
    return "\n".join(md_table(head, body)) + "\n"


def _parse(args: str) -> tuple[Path, list[str] | None, str | None, list[str] | None]:
    run, *opts = args.split()
    kw = dict(o.split("=", 1) for o in opts)
    unknown = set(kw) - {"methods", "dataset", "columns"}
    if unknown:
        raise ResultsError(f"figures marker {args!r}: unknown option {', '.join(sorted(unknown))} "
                           "(methods=a,b, dataset=name or columns=a,b)")
    methods, columns = (LIST.split(kw[k]) if k in kw else None for k in ("methods", "columns"))
    return ROOT / run, methods, kw.get("dataset"), columns


def derive(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """``text`` with every marked table rendered again, and the (run, stored, derived) of each that differs."""
    differing = []

    def one(m: re.Match) -> str:
        body = table(*_parse(m["args"]))
        if body != m["body"]:
            differing.append((m["args"], m["body"], body))
        return f"<!-- figures: {m['args']} -->\n{body}<!-- /figures -->"

    return MARK.sub(one, text), differing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.bench.figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["check", "write"], help="check: fail on a differing table; write: rewrite them")
    ap.add_argument("files", nargs="+", type=Path, help="Markdown files with marked tables")
    a = ap.parse_args(argv)
    bad = 0
    for f in a.files:
        try:
            new, differing = derive(f.read_text(encoding="utf-8"))
        except (ResultsError, OSError, KeyError) as e:
            print(f"{f}: {e}", file=sys.stderr)
            return 2
        if a.mode == "write" and differing:
            f.write_text(new, encoding="utf-8")
            print(f"{f}: rewrote {len(differing)} table(s)")
        elif differing:
            bad += len(differing)
            for run, stored, derived in differing:
                print(f"{f}: the table of {run} differs from its results.json\n"
                      f"--- stored\n{stored}+++ derived\n{derived}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
