"""What a target representation costs in fidelity: ``python -m bench.fidelity``.

For each representation (float32 is the reference): greedy AR answers compared with float32's
(whole answers identical, length of the common prefix), greedy SD compared with AR within the
same representation (identical answers: SD is exact only when the verify pass rounds like a
one-token pass), and accuracy of the AR answers on the graded items. Items as in the benchmark.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from csd.config import CSDConfig

from .datasets import load_dataset
from .graders import grade


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run(reprs: list[str], datasets: list[str], limit: int, max_new_tokens: int, seed: int = 0,
        progress=None, pair=None) -> dict:
    """``pair``: the embedded pair in float32 (loaded when None); it is left as it is, each other
    representation's target is a copy."""
    from dataclasses import replace

    import torch

    from csd.decode import Decoder
    from csd.lm import HFLM
    from csd.memory import CorrectionMemory
    from csd.models import load_pair, to_repr
    from csd.profile import machine_name

    items = [it for d in datasets for it in load_dataset(d, limit, seed)]
    base_pair = pair if pair is not None else load_pair(dtype="float32")
    if base_pair.target_repr != "float32":
        raise ValueError(f"the reference is the float32 target, got a {base_pair.target_repr} one")
    answers: dict[str, dict] = {}
    for r in reprs:
        pair = base_pair
        if r != "float32":
            target = to_repr(base_pair.target, r, copy=True)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--reprs", default="float32,int8", help="representations, float32 (the reference) first")
    ap.add_argument("--dataset", default="gsm8k,humaneval,prose")
    ap.add_argument("--limit", type=int, default=4, help="items per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="fidelity.json")
    args = ap.parse_args(argv)
    reprs = [r.strip() for r in args.reprs.split(",") if r.strip()]
    res = run(reprs, [d.strip() for d in args.dataset.split(",")], args.limit, args.max_new_tokens,
              progress=lambda m, f: print(m, file=sys.stderr, flush=True))
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("| representation | items | AR identical to float32 | mean common prefix | SD == AR | accuracy |")
    print("|---|---:|---:|---:|---:|---:|")
    for r, s in res["summary"].items():
        ident = f"{s['ar_identical_to_float32']}/{s['items']}" if "ar_identical_to_float32" in s else "(reference)"
        pref = f"{s['mean_common_prefix']:.0f} of {s['mean_answer_tokens']:.0f}" if "mean_common_prefix" in s else "–"
        acc = "–" if s["accuracy"] is None else f"{100 * s['accuracy']:.0f}% of {s['n_graded']}"
        print(f"| {r} | {s['items']} | {ident} | {pref} | {s['sd_equals_ar']}/{s['items']} | {acc} |")
    print(f"({res['machine']}; written to {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
