"""The embedded pair's models with their matrices on huge pages and in ordinary memory, timed in turn in one process.

Each model is loaded twice from its assembled GGUF file (``CSD_HUGEPAGES`` on, then off; the draft with the app's
reduced output layer and its 4-bit blocks). Each shape (the draft's 1-token step; target passes of 1, 4 and 8
tokens after a 100-token context) runs the two copies one after the other, again and again, the order swapped
every time, so that the host's drift falls on both alike; their logits are compared (the same bytes must give the
same bits).

    python docs/bench/hugepages/ab.py OUT.json
    CSD_KQUANT_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python docs/bench/hugepages/ab.py OUT.json

Writes OUT.json: per shape, the median ms of each copy, the median of the paired ratios huge / plain with its
quartiles, and whether the logits were bit-equal.
"""
import json
import os
import statistics
import sys
import time

import torch

from csd.cli.common import add_model_args, choose_draft, choose_target, load_from_args
from csd.runtime import hugepages, kquant
from csd.runtime.embedded import assembled
from csd.runtime.profile import machine_name

SHAPES = [("draft, 1 token", "draft", 1, 300), ("target, 1 token", "target", 1, 80),
          ("target, 4 tokens", "target", 4, 50), ("target, 8 tokens", "target", 8, 40)]


def load_twice(role: str, vocab_ids) -> dict:
    out = {}
    with assembled(role) as path:
        for name, env in (("huge", "1"), ("plain", "0")):
            os.environ[hugepages.ENV] = env
            out[name] = kquant.lean_from_gguf(path, vocab_ids, four_bit=role == "draft")
    os.environ.pop(hugepages.ENV)
    return out


def main(out: str) -> None:
    parser = __import__("argparse").ArgumentParser()
    add_model_args(parser, store=False)
    args = parser.parse_args([])
    choose_draft(args)
    choose_target(args)
    pair = load_from_args(args)             # for the draft's reduced output layer, as the app chooses it
    vocab = pair.draft_lm.vocab_ids
    rep = pair.rep.as_dict()
    del pair
    models = {"draft": load_twice("draft", vocab), "target": load_twice("target", None)}
    res = {"machine": machine_name("cpu"), "variant": os.environ.get(kquant.VARIANT_ENV) or "native",
           "representation": rep, "threads": torch.get_num_threads(), "shapes": {}}
    for label, role, n, reps in SHAPES:
        lms = models[role]
        caches = {}
        for k, lm in lms.items():
            c = lm.new_cache()
            lm.forward(c, list(range(1000, 1100)), 1)
            caches[k] = (c, c.n)
        ids = list(range(2000, 2000 + n))
        times = {k: [] for k in lms}
        ratios, equal = [], True
        for r in range(reps):
            logits = {}
            for k in (("huge", "plain") if r % 2 else ("plain", "huge")):
                c, base = caches[k]
                c.n = base
                t = time.perf_counter()
                logits[k] = lms[k].forward(c, ids, n)
                times[k].append(time.perf_counter() - t)
            equal &= torch.equal(logits["huge"], logits["plain"])
            ratios.append(times["huge"][-1] / times["plain"][-1])
        q = statistics.quantiles(ratios, n=4)
        res["shapes"][label] = {"huge_ms": round(1e3 * statistics.median(times["huge"]), 2),
                                "plain_ms": round(1e3 * statistics.median(times["plain"]), 2),
                                "huge_over_plain": round(statistics.median(ratios), 3),
                                "quartiles": [round(q[0], 3), round(q[2], 3)], "bit_equal": bool(equal),
                                "pairs": reps}
        print(label, res["shapes"][label], flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
