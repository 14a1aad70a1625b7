"""A run alone through the app's batcher, drafting with the int8 draft or with the solo (ort4) draft; then 8
runs at once, the first on the solo draft or not (docs/users.md). Run alone on the machine:

    python docs/bench/solo-draft-xeon/solo.py > solo.json
"""
import json
import statistics
import sys
import threading
import time
from dataclasses import replace

from csd.config import CSDConfig
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.batch import Batcher
from csd.runtime.models import load_pair
from csd.runtime.profile import cached_costs, machine_name
from csd.runtime.profile import decoder as measured_decoder

pair = load_pair(draft_weights="int8", activations="row")         # the app's pair where runs decode together
solo = replace(pair, draft_lm=load_pair(draft_weights="ort4", activations="row", draft_alone=True).lm,
               rep=replace(pair.rep, draft="ort4"))          # the app's cli.common.app_solo_draft
costs = cached_costs(pair)
solo_costs = cached_costs(solo)
print("draft ms: int8", costs.draft_ms, "ort4", solo_costs.draft_ms, "; 1-token pass", costs.verify(1), file=sys.stderr)
batcher = Batcher(pair, solo=solo)
threads.one_core()          # as the app: the batcher's thread has the cores
decoders = {False: measured_decoder(batcher.view("row", False), costs),
            True: measured_decoder(batcher.view("row", True), solo_costs)}
items = load_dataset("humaneval", limit=3) + load_dataset("gsm8k", limit=3)
chats = [pair.tokenizer.apply_chat_template([{"role": "user", "content": it.prompt}], add_generation_prompt=True,
                                            tokenize=False) for it in items]
prompts = [pair.tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]
memory = decoders[False].default_memory()


def cfg() -> CSDConfig:
    return CSDConfig(method="csd", gamma="auto", max_new_tokens=128)


def alone(use_solo: bool, prompt) -> tuple[float, list[int]]:
    run = decoders[use_solo].run(prompt, cfg(), memory.copy())
    t0 = time.perf_counter()
    list(run)
    return run.metrics.new_tokens / (time.perf_counter() - t0), run.token_ids


def at_once(first_solo: bool) -> float:
    runs = [decoders[first_solo and i == 0].run(p, cfg(), memory.copy()) for i, p in enumerate((prompts * 2)[:8])]
    workers = [threading.Thread(target=list, args=(r,)) for r in runs]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(r.metrics.new_tokens for r in runs) / (time.perf_counter() - t0)


speeds = {"alone": {False: [], True: []}, "8 at once": {False: [], True: []}}
texts = {}
for rnd in range(2):
    for i, p in enumerate(prompts):
        for s in ((False, True) if (rnd + i) % 2 == 0 else (True, False)):      # in turn, the order alternating
            tps, ids = alone(s, p)
            speeds["alone"][s].append(tps)
            texts.setdefault(i, {})[s] = ids
            print(f"round {rnd} prompt {i} solo={s}: {tps:.2f} tok/s", file=sys.stderr, flush=True)
for rnd in range(2):
    for s in ((False, True) if rnd % 2 == 0 else (True, False)):
        speeds["8 at once"][s].append(at_once(s))
        print(f"8 at once, first solo={s}: {speeds['8 at once'][s][-1]:.2f} tok/s", file=sys.stderr, flush=True)
summary = {k: {("ort4 solo" if s else "int8"): {"median": statistics.median(v), "all": [round(x, 2) for x in v]}
               for s, v in d.items()} for k, d in speeds.items()}
same = sum(t[False] == t[True] for t in texts.values())
print(json.dumps({"machine": machine_name(), "summary": summary, "same_text_alone": f"{same} of {len(texts)}",
                  "draft_ms": {"int8": costs.draft_ms, "ort4": solo_costs.draft_ms}, "pass_1_ms": costs.verify(1)},
                 indent=1))
