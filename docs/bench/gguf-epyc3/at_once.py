"""The record of one run (2026-12-07, AMD EPYC Zen 4): 8 runs at once through the app's batcher, as AR, as CSD
with the app's settings, and as CSD with a fixed short block, in turn, twice; with how the batcher's passes went.
It asks whether 8 runs at once fall short of 1.7x one run because of the drafting or because of the rows.

    python docs/bench/gguf-epyc3/at_once.py docs/bench/gguf-epyc3/at_once.json
"""
import json
import sys

from csd.cli.app_runs import load_app_models, since, timed
from csd.config import CSDConfig, default_lookup
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.batch import Batcher
from csd.runtime.profile import cached_costs, decoder, machine_name

SETTINGS = {
    "AR": dict(method="ar"),
    "CSD, the app's settings": dict(method="csd", gamma="auto", lookup=default_lookup("csd")),
    "CSD, gamma 2, no copies": dict(method="csd", gamma=2, lookup=0),
}


def main(out: str) -> None:
    pair, solo = load_app_models()
    batcher = Batcher(pair, solo=solo)
    runs_at_once = decoder(batcher.view(pair.rep.activations, False), cached_costs(pair))
    threads.one_core()          # as the app: the batcher's thread has the cores
    items = load_dataset("humaneval", limit=2) + load_dataset("gsm8k", limit=2)
    prompts = [pair.encode_prompt(it.prompt) for it in items]
    memory = runs_at_once.default_memory()
    res = {"machine": machine_name("cpu"), "representation": pair.rep.as_dict(), "users": 8, "tokens": 128,
           "prompt_tokens": [len(p) for p in prompts], "rounds": []}
    try:
        for _ in range(2):
            for name, fields in SETTINGS.items():
                cfg = CSDConfig(max_new_tokens=128, **fields)
                before = batcher.stats()
                runs = [runs_at_once.run(p, cfg, memory.copy()) for p in (prompts * 8)[:8]]
                tok_s = timed(runs)
                res["rounds"].append({"setting": name, "tokens_per_s": round(tok_s, 2),
                                      "prefill_s_a_run": round(sum(r.metrics.prefill_s for r in runs) / 8, 2),
                                      "passes": since(before, batcher.stats())})
                print(name, f"{tok_s:.2f} tok/s", file=sys.stderr, flush=True)
    finally:
        batcher.close()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
