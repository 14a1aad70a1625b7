"""What decoding together can give on this machine, without the app (docs/users.md, "The ceiling"): 8 greedy
CSD runs one after another, then the same 8 at once, through ``csd.runtime.batch.Batcher``'s model thread as in
the app: the ratio of their summed tokens per second, and what the model thread's passes cost.

    python -m tools.batch_ratio --tokens 48,128 --gamma 6 --repeat 2 [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import csd_app
from csd.cli.common import load_from_args
from csd.config import GAMMA_AUTO, CSDConfig
from csd.decode import Decoder
from csd.evaluation.datasets import load_dataset
from csd.runtime import profile, threads
from csd.runtime.batch import Batcher
from tools.users import cpu_label


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="48,128", help="new tokens a run (comma-separated)")
    ap.add_argument("--gamma", default="6", help="a number, or auto")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    pair = load_from_args(csd_app.parse_args([]))
    items = load_dataset("prose") + load_dataset("gsm8k", limit=args.runs)
    prompts = [pair.encode_prompt(it.prompt, True) for it in items][:args.runs]
    gamma = GAMMA_AUTO if args.gamma == "auto" else int(args.gamma)
    plain = profile.decoder(pair)
    memory, costs = plain.default_memory(), plain.costs      # measured on this thread, before the batcher
    batcher = Batcher(pair)
    threads.one_core()          # as in the app: the batcher's thread holds the cores (csd.runtime.threads)
    together_dec = Decoder(batcher.view(pair.rep.activations), costs=costs)
    passes = timed_passes(batcher)

    def alone(cfg) -> tuple[float, float]:
        t0, tokens, prefill = time.perf_counter(), 0, 0.0
        for p in prompts:
            run = together_dec.run(p, cfg, memory.copy())      # through the model thread, as in the app
            list(run)
            tokens, prefill = tokens + run.metrics.new_tokens, prefill + run.metrics.prefill_s
        return tokens / (time.perf_counter() - t0), prefill

    def together(cfg) -> float:
        runs = [together_dec.run(p, cfg, memory.copy()) for p in prompts]
        threads = [threading.Thread(target=lambda r=r: list(r)) for r in runs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(r.metrics.new_tokens for r in runs) / (time.perf_counter() - t0)

    together(CSDConfig(method="csd", gamma=gamma, max_new_tokens=8))      # warm both paths
    passes.clear()
    rows = []
    for n in (int(t) for t in args.tokens.split(",")):
        cfg = CSDConfig(method="csd", gamma=gamma, max_new_tokens=n)
        for rep in range(args.repeat):
            a, prefill = alone(cfg)
            t = together(cfg)
            rows.append(dict(tokens=n, rep=rep, alone_tok_s=round(a, 2), prefill_s_alone=round(prefill, 1),
                             together_tok_s=round(t, 2), ratio=round(t / a, 2)))
            print(f"{n} tokens, round {rep + 1}: alone {a:.2f} tok/s (reading the prompts {prefill:.1f} s), "
                  f"{len(prompts)} at once {t:.2f} tok/s: {t / a:.2f}x", flush=True)
    result = dict(cpu=cpu_label(), gamma=args.gamma, runs=len(prompts), prompt_tokens=[len(p) for p in prompts],
                  rows=rows, passes=pass_costs(passes))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1))


def timed_passes(batcher: Batcher) -> list[tuple]:
    """A list that gets (model, runs served, tokens, seconds) of each pass the batcher makes from now."""
    passes, run_batch = [], batcher._run

    def timed(batch):
        t0 = time.perf_counter()
        run_batch(batch)
        passes.append(("target" if batch[0].lm.member else "draft", len(batch), sum(c.tokens for c in batch),
                       time.perf_counter() - t0))
    batcher._run = timed
    return passes


def pass_costs(passes: list[tuple]) -> dict:
    """The passes' cost by model and runs served: passes, ms a pass, tokens a pass (printed too)."""
    costs = {}
    for model, served, tokens, s in passes:
        c = costs.setdefault(f"{model}, {served} at once", dict(passes=0, tokens=0, s=0.0))
        c["passes"], c["tokens"], c["s"] = c["passes"] + 1, c["tokens"] + tokens, c["s"] + s
    for name, c in sorted(costs.items()):
        c.update(ms_per_pass=round(1000 * c["s"] / c["passes"], 1), tokens_per_pass=round(c["tokens"] / c["passes"], 1))
        print(f"{name}: {c['passes']} passes, {c['ms_per_pass']} ms a pass, {c['tokens_per_pass']} tokens a pass")
    return costs


if __name__ == "__main__":
    main()
