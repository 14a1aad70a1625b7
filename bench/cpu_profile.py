"""Where a CPU pass's time goes (issue 52): a draft step, a 1-token and a 6-token target pass of the embedded pair
as the app loads it, each after 150 cached tokens: wall time, torch.profiler's self time by kind of op, ops per
layer; then the drafts' steps and the target pass timed in turn. What each figure means: docs/cpu.md.

    python -m csd.bench.cpu_profile --out docs/bench/cpu-profile-NAME [--draft-dtype int8,ort4] [--reps 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter

import torch

from .io import command_line, md_table, now, write_outputs

CONTEXT = 150
KINDS = (   # (kind, substrings of the op's name), first match wins
    ("matmul", ("linear_dynamic", "int8pack_mm", "addmm", "aten::mm", "aten::bmm", "aten::matmul")),
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("norm", ("rms_norm", "aten::pow", "aten::mean", "aten::rsqrt")),
    ("elementwise", ("aten::mul", "aten::add", "aten::silu", "aten::neg", "aten::div", "aten::sub", "aten::cos",
                     "aten::sin", "aten::addcmul", "aten::where", "aten::sum", "aten::amax", "aten::abs",
                     "aten::clamp", "aten::tril", "aten::ones", "aten::argmax")),
    ("copies", ("aten::copy_", "aten::cat", "aten::_to_copy", "aten::to", "aten::index", "aten::embedding",
                "aten::contiguous", "aten::clone", "aten::pad", "aten::fill_", "aten::zero_")),
)


def kind_of(name: str) -> str:
    return next((k for k, keys in KINDS if any(s in name for s in keys)), "other")


@torch.inference_mode()
def profile_call(lm, tokens: int, reps: int) -> dict:
    """One kind of call: ``tokens`` fed after ``CONTEXT`` cached ones, timed, profiled and its ops counted."""
    from .synthetic.kernel_profile import count_ops, launches
    cache = lm.new_cache()
    vocab = lm.embed.shape[0]
    lm.forward(cache, [(100 + i) % vocab for i in range(CONTEXT)], 1)

    def call():
        lm.forward(cache, [7] * tokens, tokens)
        lm.crop(cache, CONTEXT)

    for _ in range(3):
        call()
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        walls.append(1000 * (time.perf_counter() - t0))
    n = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            call()
    by_kind, by_op = Counter(), Counter()          # self CPU ms a call
    for e in prof.key_averages():
        by_kind[kind_of(e.key)] += e.self_cpu_time_total / n / 1000
        by_op[e.key] += e.self_cpu_time_total / n / 1000
    total = sum(by_kind.values())
    layers = getattr(lm, "n_layers", 1)
    dispatched = count_ops(call)
    median = statistics.median(walls)
    return {"tokens": tokens, "wall_ms_median": round(median, 2), "wall_ms_min": round(min(walls), 2),
            "profiled_ms": round(total, 2), "ms_by_kind": {k: round(v, 2) for k, v in by_kind.most_common()},
            "share_outside_matmul": round(1 - by_kind["matmul"] / total, 3) if total else None,
            "unaccounted_ms": round(max(median - total, 0.0), 2),
            "ops_per_layer": round(launches(dispatched) / layers, 1), "ops_per_call": launches(dispatched),
            "top_ops": {k: round(v, 3) for k, v in by_op.most_common(12)}}


def run(drafts: list[str], reps: int, activations: str) -> dict:
    from csd.runtime.models import load_pair
    from csd.runtime.profile import machine_name, time_interleaved
    out = {"machine": machine_name("cpu"), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "activations": activations,
           "measured_at": now(), "command": command_line("csd.bench.cpu_profile"), "runs": []}
    lms = {}
    for dd in drafts:
        pair = load_pair(draft_weights=dd, activations=activations)
        calls = {"draft step": profile_call(pair.draft_lm, 1, reps)}
        if not out["runs"]:           # the target is the same in every run
            calls["target pass of 1"] = profile_call(pair.target_lm, 1, reps)
            calls["target pass of 6"] = profile_call(pair.target_lm, 6, reps)
            lms["target pass of 1"] = pair.target_lm
        lms[f"draft {pair.rep.draft}"] = pair.draft_lm
        out["runs"].append({"draft": pair.rep.draft, "target": f"{pair.rep.target}, activations "
                            f"{pair.rep.activations or '-'}", "calls": calls})
        del pair
    for r in out["runs"]:     # over the target's 1-token pass, profiled with the first
        draft_ms = r["calls"]["draft step"]["wall_ms_median"]
        target_ms = out["runs"][0]["calls"]["target pass of 1"]["wall_ms_median"]
        r["draft_over_target"] = round(draft_ms / target_ms, 3)
    out["interleaved"] = time_interleaved(lms, 3 * reps)
    return out


def markdown(out: dict) -> str:
    lines = [f"# Where a CPU pass's time goes: {out['machine']}", "",
             f"{out['measured_at']}, torch {out['torch']} ({out['cpu_capability']}), {out['threads']} threads; "
             f"`{out['command']}`. Each call after {CONTEXT} cached tokens; wall times are the median of the "
             "timed calls, the kinds torch.profiler's self CPU time; 'unaccounted' is the median wall time less "
             "the profiled ops (Python and dispatch between them).", ""]
    kinds = ("matmul", "attention", "norm", "elementwise", "copies", "other")
    rows = [[r["draft"], name, f"{c['wall_ms_median']} ({c['wall_ms_min']})",
             *(f"{c['ms_by_kind'].get(x, 0.0):.2f}" for x in kinds), f"{100 * (c['share_outside_matmul'] or 0):.0f}%",
             c["unaccounted_ms"], c["ops_per_layer"]] for r in out["runs"] for name, c in r["calls"].items()]
    lines += md_table(["draft", "call", "wall ms (min)", "matmul ms", *kinds[1:], "outside matmul", "unaccounted ms",
                       "ops / layer"], rows, left=2)
    over_target = ", ".join(f"{r['draft']} {r['draft_over_target']}x" for r in out["runs"])
    in_turn = "; ".join(f"{k} {v['wall_ms']}, {v['cpu_ms']}" for k, v in out["interleaved"].items())
    lines += ["", f"Draft step over a 1-token target pass: {over_target}.", "",
              f"In turn, medians (wall, CPU ms): {in_turn}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m csd.bench.cpu_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for profile.json and profile.md")
    p.add_argument("--draft-dtype", dest="draft_weights", default="int8,ort4", help="comma-separated drafts to profile")
    p.add_argument("--int8-activations", dest="activations", default="row", choices=("row", "pass"),
                   help="the target's activation scales (row: the app's default, exact)")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.draft_weights.split(",") if d.strip()]
    if not dtypes or not set(dtypes) <= {"int8", "ort4", "float32", "bfloat16"} or args.reps < 1:
        p.error(f"--draft-dtype takes int8, ort4, float32, bfloat16 (got {args.draft_weights!r}); --reps >= 1")
    out = run(dtypes, args.reps, args.activations)
    write_outputs(args.out, "profile", out, markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
