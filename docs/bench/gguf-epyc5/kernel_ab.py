"""Two builds of the k-quant kernel timed in turn in one process, on the embedded pair as the app loads it: the
kernel of git revision OLD and the working tree's. Each shape (the draft's 1-token step; target passes of 1, 3, 5,
8 and 64 tokens) runs OLD then NEW, again and again, so that the host's drift falls on both alike; each pass's
logits are compared between the builds (a change that moves no value must give the same bits).

    python docs/bench/gguf-epyc5/kernel_ab.py OLD OUT.json
    CSD_KQUANT_VARIANT=avx2 python docs/bench/gguf-epyc5/kernel_ab.py OLD OUT.json   # the AVX2 builds

Before 2026-12-07 (the runs in this folder) the output layer ran the working tree's kernel in both arms, so its
share of a pass was not compared.

Writes OUT.json: per shape, the median ms of each build, the median of the paired ratios NEW / OLD with its
quartiles, and whether the logits were bit-equal.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import csd.runtime.kquant as kq
from csd.cli.common import add_model_args, choose_draft, choose_target, load_from_args
from csd.runtime.profile import machine_name

SHAPES = [("draft, 1 token", "draft", 1, 150), ("target, 1 token", "target", 1, 60),
          ("target, 3 tokens", "target", 3, 40), ("target, 5 tokens", "target", 5, 30),
          ("target, 8 tokens", "target", 8, 30), ("target, 64 tokens", "target", 64, 6)]


def build(source: Path):
    """The kernel compiled from ``source`` (kquant.library keys its cache by the source's bytes)."""
    kq.SOURCE, saved = source, dict(kq._libs)
    kq._libs.clear()
    try:
        return kq.library()
    finally:
        kq._libs.clear()
        kq._libs.update(saved)


def use(lm, variant: str, lib) -> None:
    """Run ``lm`` on ``lib``: the layers find it through kquant.library(), each product module holds its own."""
    kq._libs[variant] = lib
    for layer in getattr(lm, "layers", []):
        for m in layer:
            if isinstance(m, kq.KQuantLinear):
                m.lib = lib
    if isinstance(getattr(lm, "head", None), kq.KQuantLinear):
        lm.head.lib = lib


def main(old_rev: str, out: str) -> None:
    tree = kq.SOURCE
    old_text = subprocess.run(["git", "show", f"{old_rev}:csd/runtime/kernels/kquant.c"], check=True,
                              capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "kquant.c"
        old_src.write_text(old_text)
        libs = {"old": build(old_src), "new": build(tree)}
    variant = os.environ.get(kq.VARIANT_ENV) or "native"
    kq.SOURCE = tree
    parser = __import__("argparse").ArgumentParser()
    add_model_args(parser, store=False)
    args = parser.parse_args([])
    choose_draft(args)
    choose_target(args)
    pair = load_from_args(args)
    res = {"machine": machine_name("cpu"), "old": old_rev, "variant": variant, "representation": pair.rep.as_dict(),
           "threads": torch.get_num_threads(), "shapes": {}}
    for name, role, n, reps in SHAPES:
        lm = pair.draft_lm if role == "draft" else pair.target_lm
        cache = lm.new_cache()
        lm.forward(cache, list(range(1000, 1100)), 1)          # a 100-token context first
        base = lm.length(cache)
        times, logits = {k: [] for k in libs}, {}
        for i in range(reps):
            for k, lib in libs.items():
                use(lm, variant, lib)
                lm.crop(cache, base)
                t0 = time.perf_counter()
                got = lm.forward(cache, list(range(2000, 2000 + n)), n)
                times[k].append(time.perf_counter() - t0)
                if i == 0:
                    logits[k] = got.clone()
        ratios = [a / b for a, b in zip(times["new"], times["old"])]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        row = {"old_ms": round(1e3 * statistics.median(times["old"]), 2),
               "new_ms": round(1e3 * statistics.median(times["new"]), 2),
               "new_over_old": round(statistics.median(ratios), 3), "quartiles": [round(q1, 3), round(q3, 3)],
               "bit_equal": torch.equal(logits["old"], logits["new"]), "pairs": reps}
        res["shapes"][name] = row
        print(name, row, file=sys.stderr, flush=True)
    Path(out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.pop("CC", None)
    main(sys.argv[1], sys.argv[2])
