"""The app's runs through its batcher with the app's defaults (the target and draft prepare chose, the batched
draft of ``cli.common.app_draft_weights``): one CSD run alone on 3 HumanEval and 3 GSM8K chats, then 8 runs at
once, twice each. Run alone on the machine:

    python docs/bench/gguf-epyc/app_runs.py > app_runs.json
"""
import argparse
import json
import statistics
import sys
import threading
import time

from csd.cli.common import add_model_args, app_draft_weights
from csd.config import CSDConfig
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.batch import Batcher
from csd.runtime.models import load_pair
from csd.runtime.profile import cached_costs, machine_name
from csd.runtime.profile import decoder as measured_decoder

defaults = argparse.ArgumentParser()
add_model_args(defaults, store=False)
draft = app_draft_weights(defaults.parse_args([]), None)            # the app's draft where runs decode together
pair = load_pair(draft_weights=draft)
costs = cached_costs(pair)
batcher = Batcher(pair)
threads.one_core()          # as the app: the batcher's thread has the cores
dec = measured_decoder(batcher.view(pair.rep.activations, False), costs)   # "" for a target with no scales
items = load_dataset("humaneval", limit=3) + load_dataset("gsm8k", limit=3)
prompts = [pair.encode_prompt(it.prompt) for it in items]
memory = dec.default_memory()


def cfg() -> CSDConfig:
    return CSDConfig(method="csd", gamma="auto", max_new_tokens=128)


def alone(prompt) -> float:
    run = dec.run(prompt, cfg(), memory.copy())
    t0 = time.perf_counter()
    list(run)
    return run.metrics.new_tokens / (time.perf_counter() - t0)


def at_once() -> float:
    runs = [dec.run(p, cfg(), memory.copy()) for p in (prompts * 2)[:8]]
    workers = [threading.Thread(target=list, args=(r,)) for r in runs]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(r.metrics.new_tokens for r in runs) / (time.perf_counter() - t0)


speeds = {"alone": [], "8 at once": []}
for rnd in range(2):
    for i, p in enumerate(prompts):
        speeds["alone"].append(alone(p))
        print(f"round {rnd} prompt {i}: {speeds['alone'][-1]:.2f} tok/s", file=sys.stderr, flush=True)
for _ in range(2):
    speeds["8 at once"].append(at_once())
    print(f"8 at once: {speeds['8 at once'][-1]:.2f} tok/s", file=sys.stderr, flush=True)
batcher.close()
print(json.dumps({"machine": machine_name(), "representation": pair.rep.as_dict(),
                  "summary": {k: {"median": round(statistics.median(v), 2), "all": [round(x, 2) for x in v]}
                              for k, v in speeds.items()},
                  "draft_ms": costs.draft_ms, "pass_1_ms": costs.verify(1)}, indent=1))
