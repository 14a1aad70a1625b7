"""The attention of two builds of the k-quant kernel timed in turn in one process: ``kq_attend`` of git revision
OLD and of the working tree, on random queries, keys and values of the embedded pair's shapes (the target: 12 heads
sharing 2 KV heads of 128; the draft: 14 of 64), one layer a call. Each shape runs OLD then NEW, seven times over;
the medians are printed, with the largest difference between the two builds' outputs.

    python docs/bench/long-attention/attend_ab.py OLD [native|avx2]
"""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import csd.runtime.kquant as kq

SHAPES = [  # heads, KV heads, head size, new tokens, tokens cached before them
    (12, 2, 128, 1, 150), (12, 2, 128, 1, 1000), (12, 2, 128, 1, 4000), (12, 2, 128, 8, 150), (12, 2, 128, 8, 1000),
    (12, 2, 128, 128, 0), (12, 2, 128, 128, 3600), (14, 2, 64, 1, 1000), (14, 2, 64, 128, 3600)]


def build(source: Path, out: Path, variant: str):
    """The kernel compiled from ``source`` with kquant.library's flags (an older source may lack newer symbols)."""
    flags = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", *kq.VARIANTS[variant]]
    subprocess.run(["cc", *flags, "-o", str(out), str(source), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.kq_attend.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    lib.kq_attend.restype = None
    return lib


def main(old_rev: str, variant: str) -> None:
    tree = kq.SOURCE
    old_text = subprocess.run(["git", "show", f"{old_rev}:csd/runtime/kernels/kquant.c"], check=True,
                              capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "kquant.c"
        old_src.write_text(old_text)
        libs = [build(old_src, Path(tmp) / "old.so", variant), build(tree, Path(tmp) / "new.so", variant)]
    threads = torch.get_num_threads()
    print(f"kq_attend, {variant} build, {threads} threads; ms a call (one layer), median of 7, OLD={old_rev}")
    print("| heads / KV / size | new tokens | cached | old ms | new ms | old / new | largest difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    torch.manual_seed(0)
    for heads, kv, d, t, start in SHAPES:
        cap = start + t
        k, v, q = torch.randn(kv, cap, d), torch.randn(kv, cap, d), torch.randn(heads, t, d)
        outs, times = [torch.empty(t, heads, d) for _ in libs], [[], []]
        calls = min(400, max(3, int(3e7 / (t * cap * heads * d))))

        args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, heads, kv, t, d, cap, start, d ** -0.5, threads]
        for _ in range(7):
            for i, lib in enumerate(libs):
                args[3] = outs[i].data_ptr()
                lib.kq_attend(*args)
                t0 = time.perf_counter()
                for _ in range(calls):
                    lib.kq_attend(*args)
                times[i].append((time.perf_counter() - t0) / calls * 1e3)
        old, new = (statistics.median(x) for x in times)
        diff = (outs[0] - outs[1]).abs().max().item()
        print(f"| {heads} / {kv} / {d} | {t} | {start} | {old:.3f} | {new:.3f} | {old / new:.2f}x | {diff:.1e} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "native")
