"""The record of two runs (2026-12-07, AMD EPYC Zen 4): 8 runs at once through the app's batcher, in turn: AR; CSD
with the app's settings, each block planned as one of the runs in flight (``CostModel.shared``); the same CSD
planned as a run alone (``runs_sharing`` forced to 1, as before that change). Arguments: the output file, the
batcher's gathering window in seconds (0.01, the default then) and the rounds (2).

    python docs/bench/gguf-epyc4/at_once_ab.py docs/bench/gguf-epyc4/at_once_ab.json
    python docs/bench/gguf-epyc4/at_once_ab.py docs/bench/gguf-epyc4/window/window-0.04.json 0.04 1
"""
import json
import sys

from csd.cli.app_runs import load_app_models, since, timed
from csd.config import CSDConfig, default_lookup
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.batch import BatchedLM, Batcher
from csd.runtime.profile import cached_costs, decoder, machine_name

pair, solo = load_app_models()
window_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
batcher = Batcher(pair, solo=solo, window_s=window_s)
runs_at_once = decoder(batcher.view(pair.rep.activations, False), cached_costs(pair))
threads.one_core()
items = load_dataset("humaneval", limit=2) + load_dataset("gsm8k", limit=2)
prompts = [pair.encode_prompt(it.prompt) for it in items]
memory = runs_at_once.default_memory()
shared = BatchedLM.runs_sharing
SETTINGS = {"AR": (dict(method="ar"), shared),
            "CSD, planned as one of the runs in flight": (dict(method="csd", gamma="auto", lookup=default_lookup("csd")), shared),
            "CSD, planned as a run alone": (dict(method="csd", gamma="auto", lookup=default_lookup("csd")), lambda self, cache: 1)}
res = {"machine": machine_name("cpu"), "representation": pair.rep.as_dict(), "users": 8, "tokens": 128,
       "prompt_tokens": [len(p) for p in prompts], "rounds": []}
try:
    for _ in range(rounds):
        for name, (fields, counter) in SETTINGS.items():
            BatchedLM.runs_sharing = counter
            cfg = CSDConfig(max_new_tokens=128, **fields)
            before = batcher.stats()
            runs = [runs_at_once.run(p, cfg, memory.copy()) for p in (prompts * 8)[:8]]
            tok_s = timed(runs)
            res["rounds"].append({"setting": name, "tokens_per_s": round(tok_s, 2),
                                  "drafted": sum(r.metrics.drafted for r in runs),
                                  "copied": sum(r.metrics.lookup_drafted for r in runs),
                                  "prefill_s_a_run": round(sum(r.metrics.prefill_s for r in runs) / 8, 2),
                                  "passes": since(before, batcher.stats())})
            print(name, f"{tok_s:.2f} tok/s", res["rounds"][-1]["drafted"], res["rounds"][-1]["copied"], file=sys.stderr, flush=True)
finally:
    batcher.close()
json.dump(res, open(sys.argv[1], "w"), indent=1)
