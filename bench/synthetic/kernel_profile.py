"""What a pass of the static engine costs in launches (the GPU issue: a 0.5B draft step took 1.4-1.8 ms on
an H200 where reading its weights takes 0.2 ms): for each synthetic pair, a draft step, a draft block and
verify passes of 1 and 7 tokens as the decode loop calls them, with the aten ops each dispatches
(``count_ops``) and, on CUDA, torch.profiler's kernels and device time (docs/gpu.md, "The profile step").

    python -m csd.bench.synthetic.kernel_profile --device cuda --out OUT/profile [--pairs 1.5b,7b] [--gamma 6]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..io import command_line, write_outputs
from .models import ARCHS, PAIRS, build_model

VERIFY_LENGTHS = (1, 7)
VIEWS = frozenset({"slice", "select", "view", "reshape", "transpose", "unsqueeze", "expand", "as_strided",
                   "detach", "detach_", "lift_fresh", "alias", "t", "permute", "squeeze", "_unsafe_view"})


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def count_ops(fn: Callable[[], object]) -> Counter:
    """The aten ops that ``fn()`` dispatches, by name (run eagerly: a graph replay dispatches none)."""
    with _Count() as c:
        fn()
    return c.ops


def launches(ops: Counter) -> int:
    """The ops that compute (views and metadata changes launch nothing)."""
    return sum(n for name, n in ops.items() if name not in VIEWS)


def static_lm(arch: str, device: torch.device, dtype: torch.dtype, capacity: int, shapes):
    """A ``StaticLM`` over seeded random weights of ``arch``, its ``shapes`` captured where CUDA is."""
    from csd.runtime.lm import LeanLM
    from csd.runtime.static import make_static
    model = build_model(ARCHS[arch], device, seed=0).to(dtype)
    return make_static(LeanLM(model), capacity, shapes, name=arch)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_call(lm, fn: Callable[[], object], reps: int = 10) -> dict:
    """Ops dispatched eagerly, wall ms per call (replayed where captured), and on CUDA the profiler's
    kernels per call, device ms per call and the top kernels by device time."""
    dev = lm.device
    saved, lm.graphs = lm.graphs, {}
    try:
        ops = count_ops(fn)                   # eagerly: what a graph holds
    finally:
        lm.graphs = saved
    with torch.inference_mode():
        for _ in range(3):
            fn()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(dev)
    out = {"ops": sum(ops.values()), "computing_ops": launches(ops), "top_ops": ops.most_common(8),
           "wall_ms": round(1000 * (time.perf_counter() - t0) / reps, 4)}
    if dev.type != "cuda":
        return out
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: Counter = Counter()
    for e in kernels:
        by_name[e.name] += e.self_device_time_total
    return {**out, "kernels": round(len(kernels) / reps, 1),
            "device_ms": round(sum(e.self_device_time_total for e in kernels) / 1000 / reps, 4),
            "top_kernels": [(name[:90], round(us / 1000 / reps, 4)) for name, us in by_name.most_common(8)]}


def profile_pair(name: str, device: torch.device, dtype: torch.dtype, gamma: int = 6, capacity: int = 512,
                 context: int = 100) -> dict:
    """The four calls of the pair ``name`` (its draft, its target) after ``context`` cached tokens."""
    from csd.runtime.static import draft_shapes
    d_arch, t_arch = PAIRS[name]
    draft = static_lm(d_arch, device, dtype, capacity, draft_shapes())
    target = static_lm(t_arch, device, dtype, capacity, [(t, t) for t in VERIFY_LENGTHS])
    dc, tc = draft.new_cache(), target.new_cache()
    draft.forward(dc, list(range(100, 100 + context)), 1)
    target.forward(tc, list(range(100, 100 + context)), 1)

    def call(lm, cache, fn):
        def run():
            fn()
            lm.crop(cache, context)
        return measure_call(lm, run)

    calls = {"draft step": call(draft, dc, lambda: draft.forward(dc, [7], 1)),
             f"draft block of {gamma}": call(draft, dc, lambda: draft.draft_block(dc, torch.tensor([7], device=device),
                                                                                  gamma))}
    for t in VERIFY_LENGTHS:
        calls[f"verify pass of {t}"] = call(target, tc, lambda t=t: target.forward(tc, [7] * t, t))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"pair": name, "draft": d_arch, "target": t_arch, "dtype": str(dtype).replace("torch.", ""),
            "context": context, "capacity": capacity, "calls": calls}


def render(results: dict) -> str:
    lines = [f"# Kernels a pass: {results['machine']} ({results['date']})", "", f"`{results['command']}`", "",
             "| pair | call | aten ops | computing | kernels | device ms | wall ms | device / wall |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in results["pairs"]:
        for call, c in p["calls"].items():
            dev = c.get("device_ms")
            share = f"{dev / c['wall_ms']:.0%}" if dev is not None and c["wall_ms"] else "-"
            lines.append(f"| {p['pair']} | {call} | {c['ops']} | {c['computing_ops']} | {c.get('kernels', '-')} | "
                         f"{dev if dev is not None else '-'} | {c['wall_ms']} | {share} |")
    for p in results["pairs"]:
        for call, c in p["calls"].items():
            top = c.get("top_kernels") or c["top_ops"]
            lines += ["", f"{p['pair']}, {call}, top: " + "; ".join(f"{n} {v}" for n, v in top[:5])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from csd.runtime.profile import machine_name
    p = argparse.ArgumentParser(prog="python -m csd.bench.synthetic.kernel_profile",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--pairs", default="1.5b,7b", help="comma-separated synthetic pairs (tiny, 1.5b, 7b)")
    p.add_argument("--gamma", type=int, default=6, help="draft steps in the profiled block")
    p.add_argument("--out", default=None, help="a folder for profile.json and profile.md")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    names = [n.strip() for n in a.pairs.split(",") if n.strip()]
    bad = [n for n in names if n not in PAIRS]
    if bad or not 1 <= a.gamma <= 32:
        p.error(f"unknown pair {bad[0]!r} (choose {', '.join(PAIRS)})" if bad else "--gamma must be in 1..32")
    results = {"machine": machine_name(device), "device": str(device), "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d", time.gmtime()),
               "command": command_line("csd.bench.synthetic.kernel_profile", argv),
               "pairs": [profile_pair(n, device, dtype, a.gamma) for n in names]}
    if a.out:
        write_outputs(a.out, "profile", results, render(results))
    else:
        print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
