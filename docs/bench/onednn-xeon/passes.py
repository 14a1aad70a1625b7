"""The embedded int8 target's passes of 1 and 6 tokens after 150 cached ones, timed in turn (20 rounds), and
their logits saved for a bit-compare between kernels (docs/cpu.md, "The int8 products on oneDNN"):

    CSD_INT8_KERNEL=fbgemm python docs/bench/onednn-xeon/passes.py row OUT   # then without CSD_INT8_KERNEL
"""
import os
import statistics
import sys
import time

import torch

from csd.runtime.models import load_pair
from csd.runtime.quant import int8_kernels, memory_gib

CONTEXT = 150


@torch.inference_mode()
def main(activations: str, out: str) -> None:
    torch.set_num_threads(2)
    t0 = time.time()
    pair = load_pair(None, activations=activations)
    load_s, lm = time.time() - t0, pair.target_lm
    cache = lm.new_cache()
    lm.forward(cache, [(100 + i) % 1000 for i in range(CONTEXT)], 1)

    def call(t):
        logits = lm.forward(cache, [7 + i for i in range(t)], t)
        lm.crop(cache, CONTEXT)
        return logits

    kernel = os.environ.get("CSD_INT8_KERNEL", "auto")
    torch.save([call(6).clone(), call(1).clone()], f"{out}/logits-{kernel}-{activations}.pt")
    times = {1: [], 6: []}
    for _ in range(20):
        for t in times:
            start = time.perf_counter()
            call(t)
            times[t].append(1000 * (time.perf_counter() - start))
    print(kernel, activations, f"load {load_s:.1f} s, {memory_gib(torch.device('cpu'))} GiB, {int8_kernels(lm)}",
          {t: f"median {statistics.median(v):.1f} ms, min {min(v):.1f}" for t, v in times.items()})


if __name__ == "__main__":
    main(*sys.argv[1:3])
