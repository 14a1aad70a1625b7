"""8 users who arrive half a second apart, through the app's own choice of decoder (``ui.tabs.common.decoder_for``)
on the app's default models and batcher: the first starts alone, the others while runs are in flight. Each run is
CSD with the page's defaults, 128 new tokens, a chat of the prose set or GSM8K. Twice; writes OUT.json with each
round's wall time, summed tokens a second, and which kind of target each run got (a batcher's view, or the bare
pair's model).

    python docs/bench/gguf-epyc5/stagger.py OUT.json
"""
import json
import sys
import threading
import time

from csd.cli.app_runs import load_app_models
from csd.config import CSDConfig, default_lookup
from csd.evaluation.datasets import load_dataset
from csd.runtime import threads
from csd.runtime.profile import machine_name
from csd.ui.state import Settings, make_services
from csd.ui.tabs.common import decoder_for, ensure_session

pair, solo = load_app_models()
services = make_services(pair, settings=Settings(concurrency=8), solo=solo)
threads.one_core()
items = load_dataset("prose") + load_dataset("gsm8k", limit=8)
prompts = [pair.encode_prompt(it.prompt) for it in items][:8]
cfg = CSDConfig(method="csd", gamma="auto", max_new_tokens=128, lookup=default_lookup("csd"))


def user(prompt, out):
    dec = decoder_for(services, ensure_session(services, None))        # as a request's handler does
    run = dec.run(prompt, cfg, dec.default_memory())
    list(run)
    out.append({"target": type(dec.pair.target_lm).__name__, "new_tokens": run.metrics.new_tokens})


res = {"machine": machine_name("cpu"), "users": 8, "apart_s": 0.5, "tokens": 128,
       "prompt_tokens": [len(p) for p in prompts], "rounds": []}
try:
    for _ in range(2):
        out = []
        workers = [threading.Thread(target=user, args=(p, out)) for p in prompts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
            time.sleep(0.5)
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        tokens = sum(r["new_tokens"] for r in out)
        res["rounds"].append({"wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
                              "targets": sorted(r["target"] for r in out)})
        print(res["rounds"][-1], file=sys.stderr, flush=True)
finally:
    services.batcher.close()
json.dump(res, open(sys.argv[1], "w"), indent=1)
