"""Exactness of the int8 target per activation mode, measured on the real pair (docs/exactness.md).

``python -m tools.exactness agree --per-dataset 8 --max-new-tokens 96``: greedy AR and SD (gamma 6,
no copies) on each item, with the int8 target's activations scaled per pass and then per token (and
the verify pass's attention per query): how many items SD writes AR's token ids on, and where not.

``python -m tools.exactness passes --rounds 12``: the target's 1-token and 7-token passes in both
modes on one loaded model, interleaved round by round (a shared machine drifts), median/min/max ms.

``python -m tools.exactness nudge``: how far the target's logits move when one cached token's keys and
values move by 1e-6 (relative), in int8 per pass, int8 per token and float32, and how far the static
engine's logits are from the eager one's (attention summed over the masked capacity, in another
order): what "exact" can mean across engines.

All print JSON and write it to ``--out`` when given. They load the pair the command line's flags
name (default: the embedded pair; the target must be int8 on the lean path)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

MODES = ("pass", "row")


def agree(pair, per_dataset: int, max_new_tokens: int) -> dict:
    """SD == AR per item, first with the pair as loaded (per pass), then per token."""
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.evaluation.datasets import load_dataset

    items = [it for ds in ("gsm8k", "humaneval", "prose") for it in load_dataset(ds, per_dataset)[:per_dataset]]
    dec = Decoder(pair)
    memory = dec.default_memory()

    def tokens(method: str, ids: list[int]) -> list[int]:
        run = dec.run(ids, CSDConfig(method=method, gamma=6, lookup=0, max_new_tokens=max_new_tokens), memory.copy())
        for _ in run:
            pass
        return list(run.token_ids)

    out = {}
    for mode in MODES:
        if mode == "row":
            pair.set_int8_activations("row")
        rows = []
        for it in items:
            ids = pair.encode_prompt(it.prompt, chat=True)
            a, s = tokens("ar", ids), tokens("sd", ids)
            first = next((i for i, (x, y) in enumerate(zip(a, s)) if x != y), None)
            rows.append({"item": f"{it.dataset}/{it.item_id}", "same": a == s, "first_difference": first})
        out[mode] = {"same": sum(r["same"] for r in rows), "items": len(rows), "per_item": rows}
        print(f"{mode}: SD == AR on {out[mode]['same']} of {len(rows)} items", file=sys.stderr)
    return out


def passes(pair, rounds: int) -> dict:
    """Median, min and max ms of the target's 1- and 7-token passes in each mode, interleaved."""
    import torch

    lm = pair.target_lm
    kept = {"pass": (list(lm.layers), lm.head, False)}     # a copy: int8_per_row replaces layers in place
    lm.int8_per_row()
    kept["row"] = (lm.layers, lm.head, True)
    prompt = pair.encode_prompt("Write a Python function that returns the n-th Fibonacci number, and explain it.")
    times: dict[str, list[float]] = {f"{m}_{t}": [] for m in MODES for t in (1, 7)}
    with torch.inference_mode():
        cache = lm.new_cache()
        lm.forward(cache, prompt, 1)
        n0 = lm.length(cache)
        for r in range(rounds + 2):                 # two warm-up rounds
            for m in MODES:
                lm.layers, lm.head, lm.per_row = kept[m]
                for t in (1, 7):
                    for _ in range(3):
                        t0 = time.perf_counter()
                        lm.forward(cache, [100] * t, t)
                        if r >= 2:
                            times[f"{m}_{t}"].append(1000 * (time.perf_counter() - t0))
                        lm.crop(cache, n0)
    out = {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "n": len(v)}
           for k, v in times.items()}
    for t in (1, 7):
        out[f"row_over_pass_{t}"] = out[f"row_{t}"]["median_ms"] / out[f"pass_{t}"]["median_ms"]
    return out


NUDGE = 1e-6
NUDGE_PROMPTS = ("Write a haiku about the sea.", "What is 17 times 23? Explain.",
                 "Write a Python function that reverses a string.")


def nudge(pair, float_target=None, passes=(2, 8)) -> dict:
    """Per representation: the largest logit change (and top-1 flips) of a pass of t prompt tokens when
    the first token's cached keys and values are scaled by 1 + NUDGE, and the static engine against
    the eager one on the same passes. ``float_target``: a float32 lean ``LM`` of the same target."""
    import torch

    from csd.decode import prefill_spans
    from csd.static import StaticLM

    def run(lm, ids, t, scale=None):
        cache = lm.new_cache()
        lm.forward(cache, ids[:1], 1)
        if scale is not None:                     # the first token's keys and values, in place (eager cache)
            cache.k[:, :, :1] *= scale
            cache.v[:, :, :1] *= scale
        return lm.forward(cache, ids[1:1 + t], t).float()

    reps = {"int8 per pass": ("pass", pair.target_lm), "int8 per token": ("row", pair.target_lm)}
    if float_target is not None:
        reps["float32"] = (None, float_target)
    out = {}
    prompts = [pair.encode_prompt(p, chat=True) for p in NUDGE_PROMPTS]
    assert all(len(ids) > max(passes) for ids in prompts) and prefill_spans(2)[0] == (0, 1)
    with torch.inference_mode():
        for name, (mode, lm) in reps.items():
            if mode:
                pair.set_int8_activations(mode)
            static = StaticLM(lm, 256)
            moved, flips, engines, engine_flips = [], 0, [], 0
            for ids in prompts:
                for t in passes:
                    a, b = run(lm, ids, t), run(lm, ids, t, 1 + NUDGE)
                    s = run(static, ids, t)
                    moved.append(float((a - b).abs().max()))
                    engines.append(float((a - s).abs().max()))
                    flips += int((a.argmax(-1) != b.argmax(-1)).sum())
                    engine_flips += int((a.argmax(-1) != s.argmax(-1)).sum())
            rows = len(prompts) * sum(passes)
            out[name] = {"nudge_max_logit_change": max(moved), "nudge_median_logit_change": statistics.median(moved),
                         "nudge_top1_flips": f"{flips} of {rows}",
                         "static_vs_eager_max_logit_diff": max(engines), "static_vs_eager_top1_flips": f"{engine_flips} of {rows}"}
    pair.set_int8_activations("pass")
    return {"nudge": NUDGE, "passes": list(passes), "prompts": list(NUDGE_PROMPTS), "per_representation": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.exactness", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("agree", "passes", "nudge"))
    ap.add_argument("--per-dataset", type=int, default=8, help="items of GSM8K, HumanEval and prose each (agree)")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per answer (agree)")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds of 3 passes per mode (passes)")
    ap.add_argument("--draft", default="embedded", help="draft model (default: the embedded pair's)")
    ap.add_argument("--target", default="embedded", help="target model, run in int8 (default: the embedded pair's)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    a = ap.parse_args(argv)
    if a.per_dataset < 1 or a.max_new_tokens < 1 or a.rounds < 1:
        ap.error("--per-dataset, --max-new-tokens and --rounds must be >= 1")
    from csd.models import load_pair
    from csd.pair import ModelLoadError
    try:        # loaded per pass; each measurement turns the rows on itself
        pair = load_pair(a.draft, a.target, dtype="int8", target_impl="lean", int8_activations="pass")
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"what": a.what, "machine": pair.describe(), "command": "python -m tools.exactness " + " ".join(
        sys.argv[1:] if argv is None else argv)}
    if a.what == "agree":
        result.update(agree(pair, a.per_dataset, a.max_new_tokens))
    elif a.what == "passes":
        result.update(passes(pair, a.rounds))
    else:
        ref = load_pair(None, a.target, dtype="float32", target_impl="lean", load_draft=False)
        result.update(nudge(pair, ref.target_lm))
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
