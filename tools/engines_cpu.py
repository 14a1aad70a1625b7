"""The engines side by side on this machine (issue 24, item 3): the eager lean path, the static one
(``csd.static``; no graphs off CUDA) and ``--engine compiled`` (the same through ``torch.compile``), for the
draft's 1-token step and the target's 1- and 7-token verify passes, on the pair as the command line
loads it. Interleaved round by round (a shared machine drifts); median, min and max ms per pass.

``python -m tools.engines_cpu --rounds 10 --out DIR/engines.json`` (prints the JSON too). The compiled
engine compiles when it is built (two compiles a model); the first calls are reported apart, never timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ENGINES = ("eager", "static", "compiled")
SHAPES = {"draft": (1,), "target": (1, 7)}
TOKEN = 7         # the token each timed pass feeds (any id: the cost does not depend on it)


def build(lean, engine: str, capacity: int):
    """An ``LM`` for ``engine`` over the lean model ``lean`` (the same weights; nothing copied):
    "compiled" is ``--engine compiled`` (``csd.static``, compiled here at build, as at load)."""
    from csd.static import make_static
    if engine == "eager":
        return lean
    return make_static(lean, capacity, [(1, 1), (7, 7)], compiled=engine == "compiled")


def time_engines(lms: dict[str, object], shapes: tuple[int, ...], prompt: list[int], rounds: int) -> dict:
    """{engine: {tokens: {median_ms, min_ms, max_ms, n}}, "first_calls_s": {engine: s}}: ``rounds`` rounds
    of 3 passes per engine and shape after ``prompt``, engines interleaved; two untimed rounds first."""
    import torch

    times = {e: {t: [] for t in shapes} for e in lms}
    first: dict[str, float] = {}
    outs: dict[tuple, torch.Tensor] = {}
    with torch.inference_mode():             # as the decode loop runs them (a compiled pass checks)
        caches = {}
        for e, lm in lms.items():
            t0 = time.perf_counter()
            caches[e] = lm.new_cache()
            lm.forward(caches[e], prompt, 1)
            for t in shapes:                      # the first call of a shape: compiles where compiled
                outs[e, t] = lm.forward(caches[e], [TOKEN] * t, t).clone()
                lm.crop(caches[e], len(prompt))
            first[e] = time.perf_counter() - t0
        for r in range(rounds + 2):
            for e, lm in lms.items():
                for t in shapes:
                    for _ in range(3):
                        t0 = time.perf_counter()
                        lm.forward(caches[e], [TOKEN] * t, t)
                        dt = 1000 * (time.perf_counter() - t0)
                        lm.crop(caches[e], len(prompt))
                        if r >= 2:
                            times[e][t].append(dt)
    out = {e: {str(t): {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "n": len(v)}
               for t, v in per.items()} for e, per in times.items()}
    out["first_calls_s"] = first
    base = next(iter(lms))                      # what the others compute, against the first engine
    out["max_abs_diff_vs_" + base] = {e: {str(t): float((outs[e, t] - outs[base, t]).abs().max()) for t in shapes}
                                      for e in lms}
    out["same_argmax_as_" + base] = {e: all(bool((outs[e, t].argmax(-1) == outs[base, t].argmax(-1)).all())
                                            for t in shapes) for e in lms}
    return out


def measure(pair, rounds: int, capacity: int, engines=ENGINES) -> dict:
    """Every engine on the draft and the target of ``pair`` (both on the lean path)."""
    from csd.lm import LeanLM
    prompt = pair.encode_prompt("Write a Python function that returns the n-th Fibonacci number, and explain it.")
    result = {}
    for role, lean in (("draft", pair.draft_lm), ("target", pair.target_lm)):
        if not isinstance(lean, LeanLM):
            result[role] = {"skipped": f"the {role} is not on the lean path ({lean.impl})"}
            continue
        lms = {}
        for e in engines:
            try:
                t0 = time.perf_counter()
                lms[e] = build(lean, e, capacity)
                result.setdefault(role, {}).setdefault("build_s", {})[e] = time.perf_counter() - t0
            except Exception as ex:      # noqa: BLE001 - a build that fails is a result, said as such
                result.setdefault(role, {})[e] = {"failed": f"{type(ex).__name__}: {ex}"}
        try:
            result.setdefault(role, {}).update(time_engines(lms, SHAPES[role], prompt, rounds))
        except Exception as ex:          # noqa: BLE001 - e.g. the compiler failing on this machine
            result[role]["failed"] = f"{type(ex).__name__}: {str(ex)[:500]}"
        for e in lms:
            per = result[role].get(e, {})
            if "eager" in result[role] and e != "eager" and isinstance(per, dict) and "failed" not in per:
                for t in SHAPES[role]:
                    per[f"over_eager_{t}"] = per[str(t)]["median_ms"] / result[role]["eager"][str(t)]["median_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.engines_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of 3 passes per engine and shape")
    ap.add_argument("--capacity", type=int, default=4096, help="the static KV cache's tokens (default: the engine's)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--int8-activations", default="pass", choices=("pass", "row"))
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    a = ap.parse_args(argv)
    engines = tuple(e.strip() for e in a.engines.split(",") if e.strip())
    if a.rounds < 1 or a.capacity < 256 or not engines or any(e not in ENGINES for e in engines):
        ap.error(f"--rounds >= 1, --capacity >= 256, --engines of {', '.join(ENGINES)}")
    from csd.models import load_pair
    from csd.pair import ModelLoadError
    from csd.profile import machine_name
    try:
        pair = load_pair(int8_activations=a.int8_activations, engine="eager")
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"command": "python -m tools.engines_cpu " + " ".join(sys.argv[1:] if argv is None else argv),
              "cpu": machine_name(pair.device), "machine": pair.describe(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    result.update(measure(pair, a.rounds, a.capacity, engines))
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
