"""What a target representation costs in fidelity: ``python -m tools.fidelity``.

For each representation (float32 is the reference): greedy AR answers compared with float32's
(whole answers identical, length of the common prefix), greedy SD compared with AR within the
same representation (identical answers: SD is exact only when the verify pass rounds like a
one-token pass), and accuracy of the AR answers on the graded items. Items as in the benchmark.

``--compare A/results.json B/results.json`` instead pairs two benchmark runs item by item (the same
seed draws the same items, so a smaller run is a prefix of a larger one): graded accuracy of each
with the exact McNemar test, identical answers and the common prefix. That is how long answers in
two representations are compared without running both again (a float32 run beside an int8 one).
Either side may be several runs of one representation, comma-separated (``A1,A2``): their items are
pooled, so a run extended later (``--dataset gsm8k:16-40`` beside ``gsm8k:15``) counts as one.

``--agreement RUN`` measures a representation token by token instead: the float32 target's greedy
answers of a float32 run are fed back (teacher forcing, in passes of 7 tokens like a verify pass)
and each representation's top-1 is compared with the token float32 chose. Whole answers part at the
first flip and never meet again, so that figure moves with one near-tie; this one counts every flip,
in minutes instead of hours (int8 with and without ``csd.smoothing``, bfloat16).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from csd.bench.io import Progress, print_progress, write_json
from csd.bench.results import ResultsError, load_results
from csd.config import CSDConfig
from csd.evaluation.datasets import get_item, load_dataset
from csd.evaluation.graders import grade
from csd.events import common_prefix


def compare_runs(a: dict, b: dict, method: str = "sd", names: tuple[str, str] = ("a", "b")) -> dict:
    """Two benchmark results (``results.json``) paired on the items both ran with ``method``:
    per dataset and over all, each run's graded accuracy (Wilson interval), the discordant pairs
    and their exact McNemar p, answers identical token for token, the mean common prefix."""
    from csd.bench.stats import paired_accuracy, wilson

    def answers(res):
        return {(r["dataset"], r["item_id"]): r for r in res["items"] if r["method"] == method}
    ra, rb = answers(a), answers(b)
    both = [k for k in ra if k in rb]
    if not both:
        raise ValueError(f"the two runs have no item in common with method {method!r}")
    out = {}
    for ds in [*sorted({k[0] for k in both}), "all"]:
        keys = [k for k in both if ds == "all" or k[0] == ds]
        graded = [k for k in keys if ra[k].get("correct") is not None and rb[k].get("correct") is not None]
        ka = sum(bool(ra[k]["correct"]) for k in graded)
        kb = sum(bool(rb[k]["correct"]) for k in graded)
        vs = paired_accuracy((ra[k]["correct"], rb[k]["correct"]) for k in graded)   # a gained / lost against b
        out[ds] = {"items": len(keys), "graded": len(graded),
                   f"correct_{names[0]}": ka, f"correct_{names[1]}": kb,
                   f"interval_{names[0]}": wilson(ka, len(graded)), f"interval_{names[1]}": wilson(kb, len(graded)),
                   f"only_{names[0]}": vs["gained"], f"only_{names[1]}": vs["lost"], "mcnemar_p": vs["p_value"],
                   "identical": sum(ra[k]["token_ids"] == rb[k]["token_ids"] for k in keys),
                   "mean_common_prefix": sum(common_prefix(ra[k]["token_ids"], rb[k]["token_ids"]) for k in keys)
                   / len(keys),
                   f"mean_tokens_{names[0]}": sum(ra[k]["new_tokens"] for k in keys) / len(keys),
                   f"mean_tokens_{names[1]}": sum(rb[k]["new_tokens"] for k in keys) / len(keys)}
    return {"method": method, "names": list(names), "summary": out,
            "machine": [a.get("meta", {}).get("machine", {}).get("cpu"), b.get("meta", {}).get("machine", {}).get("cpu")],
            "reprs": [a.get("meta", {}).get("dtype"), b.get("meta", {}).get("dtype")]}


def run(reprs: list[str], datasets: list[str], limit: int, max_new_tokens: int, seed: int = 0,
        progress: Progress | None = None, pair=None) -> dict:
    """``pair``: the embedded pair in float32 (loaded when None); it is left as it is, each other
    representation's target is a copy."""
    from dataclasses import replace

    import torch

    from csd.convert import maxima_for
    from csd.decode import Decoder
    from csd.lm import HFLM
    from csd.memory import CorrectionMemory
    from csd.models import load_pair
    from csd.profile import machine_name
    from csd.quant import to_repr

    items = [it for d in datasets for it in load_dataset(d, limit, seed)]
    base_pair = pair if pair is not None else load_pair(dtype="float32")
    if base_pair.target_repr != "float32":
        raise ValueError(f"the reference is the float32 target, got a {base_pair.target_repr} one")
    answers: dict[str, dict] = {}
    for r in reprs:
        pair = base_pair
        if r != "float32":
            maxima = maxima_for(base_pair.target, base_pair.target_name, base_pair.encode_prompt) \
                if r == "int8" else None        # as load_pair's int8 target
            target = to_repr(base_pair.target, r, copy=True, maxima=maxima)
            pair = replace(base_pair, target=target, target_lm=HFLM(target), target_repr=r)
        dec = Decoder(pair)
        per = answers.setdefault(r, {})
        t0 = time.perf_counter()
        for k, it in enumerate(items):
            ids = pair.encode_prompt(it.prompt)
            ar = dec.run(ids, CSDConfig(method="ar", max_new_tokens=max_new_tokens))
            sd = dec.run(ids, CSDConfig(method="sd", max_new_tokens=max_new_tokens),
                         CorrectionMemory(pair.pair_id))
            list(ar), list(sd)
            per[it.item_id] = {"ar": ar.token_ids, "sd": sd.token_ids, "correct": grade(it, ar.text).correct}
            if progress:
                progress(f"{r}: {k + 1}/{len(items)}", (k + 1) / len(items))
        per["_seconds"] = time.perf_counter() - t0
    ref = answers.get("float32")
    summary = {}
    for r, per in answers.items():
        keys = [it.item_id for it in items]
        graded = [per[k]["correct"] for k in keys if per[k]["correct"] is not None]
        s = {"items": len(keys), "sd_equals_ar": sum(per[k]["sd"] == per[k]["ar"] for k in keys),
             "accuracy": (sum(graded) / len(graded)) if graded else None, "n_graded": len(graded),
             "seconds": per["_seconds"]}
        if ref is not None and r != "float32":
            s["ar_identical_to_float32"] = sum(per[k]["ar"] == ref[k]["ar"] for k in keys)
            s["mean_common_prefix"] = sum(common_prefix(per[k]["ar"], ref[k]["ar"]) for k in keys) / len(keys)
            s["mean_answer_tokens"] = sum(len(ref[k]["ar"]) for k in keys) / len(keys)
        summary[r] = s
    return {"machine": machine_name(base_pair.device), "torch": torch.__version__, "datasets": datasets, "limit": limit,
            "max_new_tokens": max_new_tokens, "summary": summary,
            "answers": {r: {k: v for k, v in per.items() if k != "_seconds"} for r, per in answers.items()}}


AGREEMENT_VARIANTS = {"int8": ("int8", True), "int8-unsmoothed": ("int8", False),
                      "bfloat16": ("bfloat16", False), "float32": ("float32", False)}


def agreement(run: dict, variants: list[str], max_tokens: int = 256, items: int | None = None,
              pass_tokens: int = 7, progress: Progress | None = None, pair=None) -> dict:
    """Teacher-forced top-1 agreement of each representation in ``variants`` (keys of
    ``AGREEMENT_VARIANTS``) with the float32 greedy answers of ``run`` (a float32 benchmark run's
    results.json, its SD column: greedy SD in float32 is the target's own greedy output)."""
    import torch

    from csd.convert import maxima_for
    from csd.decode import prefill_spans
    from csd.lm import LeanLM
    from csd.models import load_pair
    from csd.profile import machine_name
    from csd.quant import release_memory, to_repr

    if run.get("meta", {}).get("dtype") != "float32":
        raise ValueError("the reference answers must come from a float32 run (--dtype float32)")
    for v in variants:
        if v not in AGREEMENT_VARIANTS:
            raise ValueError(f"unknown variant {v!r}: choose from {', '.join(AGREEMENT_VARIANTS)}")
    refs = [r for r in run["items"] if r["method"] == "sd" and r.get("token_ids")][:items]
    if not refs:
        raise ValueError("the run has no SD answers to compare with")
    pair = pair if pair is not None else load_pair(None, dtype="float32")
    if pair.target_repr != "float32":
        raise ValueError(f"the representations are built from the float32 target, got a {pair.target_repr} one")
    prompts = [pair.encode_prompt(get_item(r["dataset"], r["item_id"]).prompt) for r in refs]
    out = {"machine": machine_name(pair.device), "torch": torch.__version__, "pass_tokens": pass_tokens,
           "max_tokens": max_tokens, "items": len(refs), "summary": {}}
    for v in variants:
        repr_, smoothed = AGREEMENT_VARIANTS[v]
        maxima = maxima_for(pair.target, pair.target_name, pair.encode_prompt) if smoothed else None
        model = pair.target if repr_ == "float32" else to_repr(pair.target, repr_, copy=True, maxima=maxima)
        lm = LeanLM(model)
        per: dict[str, list[int]] = {}
        with torch.inference_mode():
            for k, (r, p) in enumerate(zip(refs, prompts)):
                ans = r["token_ids"][:max_tokens]
                cache = lm.new_cache(len(p) + len(ans) + pass_tokens)
                for a, b in prefill_spans(len(p) - 1):       # as the decode loop feeds a prompt
                    lm.forward(cache, p[a:b], 1)
                fed, ok = [p[-1]] + ans[:-1], 0
                for s in range(0, len(fed), pass_tokens):
                    chunk = fed[s:s + pass_tokens]
                    pred = lm.forward(cache, chunk, len(chunk)).argmax(-1).tolist()
                    ok += sum(int(a == b) for a, b in zip(pred, ans[s:s + pass_tokens]))
                for ds in (r["dataset"], "all"):
                    acc = per.setdefault(ds, [0, 0])
                    acc[0] += ok
                    acc[1] += len(ans)
                if progress:
                    progress(f"{v}: {k + 1}/{len(refs)}", (k + 1) / len(refs))
        out["summary"][v] = {ds: {"agree": a, "tokens": n, "share": a / n if n else None} for ds, (a, n) in per.items()}
        del lm, model
        release_memory()
    return out


def pool_runs(runs: list[dict]) -> dict:
    """Several benchmark results of one representation as one: the first run's meta, the items of
    all of them (an item that two runs share is taken from the first: greedy answers repeat)."""
    reprs = {r.get("meta", {}).get("dtype") for r in runs}
    if len(reprs) > 1:
        raise ValueError(f"runs pooled on one side must share a target representation, got {sorted(map(str, reprs))}")
    seen, items = set(), []
    for r in runs:
        for it in r["items"]:
            key = (it["dataset"], it["item_id"], it["method"])
            if key not in seen:
                seen.add(key)
                items.append(it)
    return {**runs[0], "items": items}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--reprs", default="float32,int8", help="representations, float32 (the reference) first")
    ap.add_argument("--dataset", default="gsm8k,humaneval,prose")
    ap.add_argument("--limit", type=int, default=4, help="items per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="fidelity.json")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="pair two benchmark runs' results.json item by item instead of generating; "
                         "either may be several runs of one representation, comma-separated")
    ap.add_argument("--method", default="sd", help="with --compare: the column to pair (default sd)")
    ap.add_argument("--agreement", metavar="RUN",
                    help="a float32 benchmark run (or several, comma-separated): teacher-forced top-1 agreement "
                         "with its answers instead "
                         f"(variants from --reprs: {', '.join(AGREEMENT_VARIANTS)})")
    ap.add_argument("--items", type=int, default=None, help="with --agreement: the first N answers")
    args = ap.parse_args(argv)
    if args.compare:
        return _compare_main(args)
    if args.agreement:
        return _agreement_main(args)
    reprs = [r.strip() for r in args.reprs.split(",") if r.strip()]
    res = run(reprs, [d.strip() for d in args.dataset.split(",")], args.limit, args.max_new_tokens,
              progress=print_progress)
    write_json(args.out, res)
    print("| representation | items | AR identical to float32 | mean common prefix | SD == AR | accuracy |")
    print("|---|---:|---:|---:|---:|---:|")
    for r, s in res["summary"].items():
        ident = f"{s['ar_identical_to_float32']}/{s['items']}" if "ar_identical_to_float32" in s else "(reference)"
        pref = f"{s['mean_common_prefix']:.0f} of {s['mean_answer_tokens']:.0f}" if "mean_common_prefix" in s else "–"
        acc = "–" if s["accuracy"] is None else f"{100 * s['accuracy']:.0f}% of {s['n_graded']}"
        print(f"| {r} | {s['items']} | {ident} | {pref} | {s['sd_equals_ar']}/{s['items']} | {acc} |")
    print(f"({res['machine']}; written to {args.out})", file=sys.stderr)
    return 0


def _agreement_main(args) -> int:
    try:
        runs = [load_results(Path(p)) for p in args.agreement.split(",") if p]
        run = pool_runs(runs)
        variants = [v.strip() for v in args.reprs.split(",") if v.strip()]
        res = agreement(run, variants, args.max_new_tokens, args.items,
                        progress=print_progress)
    except (ResultsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    res["reference"] = "; ".join(r.get("meta", {}).get("command") or "?" for r in runs)    # every pooled run
    write_json(args.out, res)
    datasets = [d for d in next(iter(res["summary"].values())) if d != "all"] + ["all"]
    print("| representation | " + " | ".join(datasets) + " |")
    print("|---|" + "---:|" * len(datasets))
    for v, per in res["summary"].items():
        cells = [f"{100 * per[d]['share']:.2f}% of {per[d]['tokens']}" if d in per else "–" for d in datasets]
        print(f"| {v} | " + " | ".join(cells) + " |")
    print(f"({res['machine']}; written to {args.out})", file=sys.stderr)
    return 0


def _compare_main(args) -> int:
    runs = []
    for side in args.compare:
        parts = []
        for path in (p for p in side.split(",") if p):
            try:
                parts.append(load_results(Path(path)))
            except ResultsError as e:
                print(f"error: no benchmark results at {path}: {e}", file=sys.stderr)
                return 2
        try:
            runs.append(pool_runs(parts))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    names = tuple(r.get("meta", {}).get("dtype") or f"run {i + 1}" for i, r in enumerate(runs))
    if names[0] == names[1]:
        names = ("a", "b")
    try:
        res = compare_runs(runs[0], runs[1], args.method, names)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(args.out, res)
    a, b = names
    print(f"| dataset | items | {a} correct | {b} correct | only {a} / only {b} (McNemar p) | identical | "
          "mean common prefix |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for ds, s in res["summary"].items():
        print(f"| {ds} | {s['items']} | {s[f'correct_{a}']}/{s['graded']} | {s[f'correct_{b}']}/{s['graded']} | "
              f"{s[f'only_{a}']} / {s[f'only_{b}']} (p = {s['mcnemar_p']:.2f}) | {s['identical']} | "
              f"{s['mean_common_prefix']:.0f} |")
    print(f"(written to {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
