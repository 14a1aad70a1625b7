"""Greedy answers of the target on its GGUF blocks (``--dtype gguf``) beside llama.cpp's greedy answers of the same
GGUF file, a float32 run of the dequantised weights and the int8 target (activations per token).

    python docs/bench/gguf-epyc/fidelity.py --out DIR [--prompts 16] [--tokens 96] [--llama-python PY]

The prompts: the first HumanEval and GSM8K items of the benchmark's eval split, through the chat template.
llama.cpp runs in another interpreter (``--llama-python``: a virtual environment with ``pip install cyllama==0.2.18``,
a prebuilt wheel of llama.cpp b9190), fed the same token ids; its next token is the argmax of its logits.
Writes fidelity.json (every answer's ids) and fidelity.md (for each pair of runs: the first differing position of
each prompt, and how many answers are equal to the end)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

LLAMA = r'''
import json, sys
import numpy as np
import cyllama.llama.llama_cpp as L
L.disable_logging()
L.llama_backend_init()
path, n_vocab, tokens, eos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), set(json.loads(sys.argv[4]))

class Model(L.LlamaModel):          # cyllama 0.2.18's get_logits asks its model for n_vocab
    @property
    def n_vocab(self):
        return n_vocab

m = Model(path, L.LlamaModelParams())
out = []
for ids in json.load(sys.stdin):
    p = L.LlamaContextParams()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 2048, 2048, 2048, 2, 2
    ctx = L.LlamaContext(m, p)
    b = L.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1)
    for i, t in enumerate(ids):
        b.add(t, i, [0], i == len(ids) - 1)
    ctx.decode(b)
    answer, pos = [], len(ids)
    while len(answer) < tokens:
        nxt = int(np.argmax(np.asarray(ctx.get_logits(), dtype=np.float32)))
        answer.append(nxt)
        if nxt in eos:
            break
        b = L.LlamaBatch(n_tokens=1, embd=0, n_seq_max=1)
        b.add(nxt, pos, [0], True)
        ctx.decode(b)
        pos += 1
    out.append(answer)
    ctx.close()
json.dump(out, sys.stdout)
'''


@torch.inference_mode()
def greedy(lm, prompts: list[list[int]], tokens: int, eos: set[int]) -> list[list[int]]:
    answers = []
    for ids in prompts:
        cache = lm.new_cache()
        logits = lm.forward(cache, ids, 1)
        answer = []
        while len(answer) < tokens:
            nxt = int(logits[-1].argmax())
            answer.append(nxt)
            if nxt in eos:
                break
            logits = lm.forward(cache, [nxt], 1)
        lm.release(cache)
        answers.append(answer)
    return answers


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--llama-python", default="", help="an interpreter with cyllama installed (llama.cpp's answers)")
    ap.add_argument("--runs", default="gguf,int8,float32")
    ap.add_argument("--merge", default="", help="an earlier fidelity.json whose other runs' answers are kept")
    a = ap.parse_args()
    from csd.evaluation.datasets import load_dataset
    from csd.runtime.embedded import assembled
    from csd.runtime.models import load_pair
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    half = a.prompts // 2
    items = load_dataset("humaneval", half) + load_dataset("gsm8k", a.prompts - half)
    results: dict = {"tokens": a.tokens, "items": [it.item_id for it in items], "answers": {}, "seconds": {}}
    prompts = eos = None
    for rep in a.runs.split(","):
        t0 = time.perf_counter()
        pair = load_pair(None, dtype=rep, activations="row")
        if prompts is None:
            prompts = [pair.encode_prompt(it.prompt) for it in items]
            eos = set(pair.eos_ids)
            results["prompts"] = prompts
        results["answers"][f"{rep} ({pair.rep.label})"] = greedy(pair.target_lm, prompts, a.tokens, eos)
        results["seconds"][rep] = round(time.perf_counter() - t0, 1)
        del pair
    if a.merge:
        old = json.loads(Path(a.merge).read_text())
        if old["prompts"] != results["prompts"] or old["tokens"] != a.tokens:
            raise SystemExit(f"{a.merge} holds other prompts or another answer length")
        for name, answers in old["answers"].items():
            if name.split(" (")[0] not in a.runs.split(","):      # a run made again replaces the earlier one
                results["answers"][name] = answers
        results["seconds"] = {**old.get("seconds", {}), **results["seconds"]}
    if a.llama_python:
        t0 = time.perf_counter()
        with assembled("target") as path:
            done = subprocess.run([a.llama_python, "-c", LLAMA, str(path), "151936", str(a.tokens),
                                   json.dumps(sorted(eos))], input=json.dumps(prompts), capture_output=True,
                                  text=True, check=True)
        results["answers"]["llama.cpp b9190 (cyllama 0.2.18)"] = json.loads(done.stdout)
        results["seconds"]["llama.cpp"] = round(time.perf_counter() - t0, 1)
    (out / "fidelity.json").write_text(json.dumps(results))
    names = list(results["answers"])
    lines = [f"# Greedy answers compared ({len(items)} prompts, up to {a.tokens} new tokens)", "",
             "| run A | run B | equal to the end | first differing position of each prompt |", "|---|---|---:|---|"]
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            firsts = [first_difference(p, q) for p, q in zip(results["answers"][x], results["answers"][y])]
            equal = sum(f is None for f in firsts)
            lines.append(f"| {x} | {y} | {equal} of {len(firsts)} | "
                         f"{', '.join('=' if f is None else str(f) for f in firsts)} |")
    (out / "fidelity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
