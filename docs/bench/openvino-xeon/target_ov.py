"""Issue 52: the target on OpenVINO (PyPI wheel, no compiler), as ``--dtype ov4`` loads it (``csd.runtime.ovlm``). The
target's 28 decoder layers, final norm and output layer as one OpenVINO graph: the layers' products with 4-bit
weights in groups of 128 (the ort4 draft's quantiser, ``csd.runtime.ortlm.quantize_nbits``, a float32 scale and
4-bit zero point a group), the output layer int8 per output channel (the int8 target's own rows), RMS norms, RoPE
and attention (``ScaledDotProductAttention``) over the project's own KV cache (read in place, the new keys and
values handed back and written by torch). The script checks (1) greedy agreement with the int8 target over its own
answer, teacher-forced; (2) whether a pass of 6 tokens equals six 1-token steps and 2 + 4, bit for bit; (3) its 1-
and 6-token passes against the int8 target's (activations per token, then per pass), in turn, wall and CPU ms; (4)
resident memory. From the repository root:

    python docs/bench/openvino-xeon/target_ov.py [--reps 20] [--out docs/bench/openvino-xeon]
"""
import argparse
import json
import os
import pathlib
import time

import psutil
import torch

from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import CorrectionMemory
from csd.runtime.models import load_pair
from csd.runtime.profile import machine_name, time_interleaved


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import openvino
    rss = lambda: round(psutil.Process(os.getpid()).memory_info().rss / 2**30, 2)  # noqa: E731
    out = {"machine": machine_name("cpu"), "threads": torch.get_num_threads(), "openvino": openvino.__version__,
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python docs/bench/openvino-xeon/target_ov.py"
                      + "".join(f" --{k} {v}" for k, v in vars(args).items() if v)}
    before = rss()
    pair = load_pair(draft_weights="int8", activations="row")
    out["resident_gib_int8_pair"] = round(rss() - before, 2)
    before, t0 = rss(), time.perf_counter()
    lm = load_pair(draft=None, dtype="ov4").target_lm
    out["load_s"], out["resident_gib_ov4_target"] = round(time.perf_counter() - t0, 1), round(rss() - before, 2)
    int8_target = pair.target_lm
    prompt = pair.encode_prompt("Write a Python function that checks whether a number is prime, with a docstring.",
                                chat=True)
    run = Decoder(pair).run(prompt, CSDConfig(method="ar", max_new_tokens=96), CorrectionMemory(pair.pair_id))
    list(run)
    text, n = list(prompt) + list(run.token_ids), len(run.token_ids) + 1
    l8, l4 = (m.forward(m.new_cache(), text, n) for m in (int8_target, lm))
    out["top1_agreement_with_int8_target"] = round((l8.argmax(-1) == l4.argmax(-1)).float().mean().item(), 4)
    out["tokens_compared"] = n
    print(json.dumps({k: v for k, v in out.items() if k not in ("command", "date")}), flush=True)
    block, runs = [7, 8, 9, 10, 11, 12], {}
    for name, parts in (("6", [6]), ("1x6", [1] * 6), ("2+4", [2, 4])):
        c = lm.new_cache()
        lm.forward(c, prompt, 1)
        at, rows = 0, []
        for k in parts:
            rows.append(lm.forward(c, block[at:at + k], k))
            at += k
        runs[name] = torch.cat(rows)
    out["pass_of_6_equals_1x6_bitwise"] = bool(torch.equal(runs["6"], runs["1x6"]))
    out["pass_of_6_equals_2_then_4_bitwise"] = bool(torch.equal(runs["6"], runs["2+4"]))
    out["pass_of_6_vs_1x6_max_abs_diff"] = float((runs["6"] - runs["1x6"]).abs().max())
    out["pass_of_6_vs_1x6_same_top1"] = bool(torch.equal(runs["6"].argmax(-1), runs["1x6"].argmax(-1)))
    print(json.dumps({k: v for k, v in out.items() if k.startswith("pass")}), flush=True)
    for tokens in (1, 6):
        pair.set_activations("row")
        row = time_interleaved({"int8, activations per token": int8_target, "ov4": lm}, args.reps, tokens=tokens)
        pair.set_activations("pass")
        per_pass = time_interleaved({"int8, activations per pass": int8_target, "ov4": lm}, args.reps, tokens=tokens)
        out[f"timed_{tokens}"] = {"row": row, "pass": per_pass}
        print(tokens, json.dumps(out[f"timed_{tokens}"]), flush=True)
    if args.out:
        pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out, "results.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
