"""8 CSD runs at once through the app's batcher, the int8 draft against the q4_0 draft, in turn, twice (the target
as prepare chose it). Run alone on the machine:

    python docs/bench/gguf-epyc2/batch_ab.py
"""
import sys
import threading
import time

from csd.config import CSDConfig
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.batch import Batcher
from csd.runtime.models import load_pair
from csd.runtime.profile import cached_costs
from csd.runtime.profile import decoder as measured_decoder

setups = {}
for draft in ("int8", "q4_0"):
    pair = load_pair(draft_weights=draft)
    batcher = Batcher(pair)
    setups[draft] = (pair, batcher, measured_decoder(batcher.view(pair.rep.activations, False), cached_costs(pair)))
threads.one_core()          # as the app: the batchers' threads have the cores
items = load_dataset("humaneval", limit=3) + load_dataset("gsm8k", limit=3)


def at_once(draft: str) -> float:
    pair, _, dec = setups[draft]
    prompts = [pair.encode_prompt(it.prompt) for it in items]
    memory = dec.default_memory()
    cfg = CSDConfig(method="csd", gamma="auto", max_new_tokens=128)
    runs = [dec.run(p, cfg, memory.copy()) for p in (prompts * 2)[:8]]
    workers = [threading.Thread(target=list, args=(r,)) for r in runs]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(r.metrics.new_tokens for r in runs) / (time.perf_counter() - t0)


speeds = {draft: [] for draft in setups}
for _ in range(2):
    for draft in setups:
        speeds[draft].append(at_once(draft))
        print(draft, round(speeds[draft][-1], 2), file=sys.stderr, flush=True)
for _, batcher, _ in setups.values():
    batcher.close()
print(speeds)
