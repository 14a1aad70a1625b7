"""What the models cost on this machine, measured once and cached (keyed by machine, torch
version, pair, representations and the engine's code, see ``engine_revision``): the target's time
for a pass of k tokens and the draft's time per token, as a ``csd.costs.CostModel``.

It also chooses the target's representation when asked for ``auto``: the one with the fastest
verify pass of the paper's block (gamma 6, so 7 tokens) on this machine, by measurement rather
than by a CPU flag; within 10% the more exact representation wins (float32 > bfloat16 > float16 > int8).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from .costs import CostModel
from .events import Progress
from .fileio import atomic_write, cache_dir
from .lm import HFLM, LeanLM, lean_unsupported
from .quant import quantize_int8, release_memory, to_repr

log = logging.getLogger(__name__)

PASS_LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)   # tokens in a target pass (a block of k - 1 + 1)
CONTEXT = 150                                                 # cached tokens before the timed pass
EXACTNESS = ("float32", "bfloat16", "float16", "int8")        # most exact first
TIE = 0.10


def machine_name(device: torch.device | str = "cpu") -> str:
    """The processor (or GPU) that the figures belong to, as the system names it."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@torch.inference_mode()
def time_pass(lm, k: int, reps: int = 3, context: int = CONTEXT) -> float:
    """Median ms of a k-token forward of an ``csd.lm.LM`` after ``context`` cached tokens (fewer where a
    static KV cache holds fewer: its attention reads the whole capacity whatever it holds)."""
    capacity = getattr(lm, "capacity", None)
    if capacity is not None:
        context = max(1, min(context, capacity - k))
    cache = lm.new_cache()
    lm.forward(cache, [100 + (i % 1000) for i in range(context)], 1)
    lm.forward(cache, [7] * k, k)          # warm-up at this shape
    lm.crop(cache, context)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.forward(cache, [7] * k, k)
        _sync(lm.device)
        times.append(1000 * (time.perf_counter() - t0))
        lm.crop(cache, context)
    return statistics.median(times)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


ENGINE_FILES = ("lm.py", "static.py", "quant.py")   # the forward passes and how each representation is built


@functools.cache
def engine_revision() -> str:
    """A digest of the code whose speed a profile measures (the forwards in ``csd/lm.py`` and
    ``csd/static.py``, the representations built in ``csd/quant.py``): a change there makes the cached profile a miss, so
    a faster draft is re-timed instead of planned with its old cost."""
    h = hashlib.sha1()
    for name in ENGINE_FILES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:12]


def profile_key(pair) -> dict:
    return {"machine": machine_name(pair.device), "device": str(pair.device), "torch": torch.__version__,
            "engine": engine_revision(),
            "pair": pair.pair_id, "target_repr": pair.target_repr, "target_impl": pair.target_lm.impl,
            "draft_repr": pair.draft_dtype,
            "draft_impl": pair.draft_lm.impl if pair.draft_lm is not None else "",
            "draft_vocab": pair.draft_vocab_size,
            **({"static_capacity": pair.target_lm.capacity} if hasattr(pair.target_lm, "capacity") else {}),
            **({"int8_activations": pair.int8_activations} if pair.int8_activations else {})}


def _cache_file(kind: str, key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{kind}-{digest}.json"


def measure(pair, lengths=PASS_LENGTHS, reps: int = 3, progress: Progress | None = None) -> CostModel:
    """Time the target at each pass length and the draft per token (needs a loaded draft)."""
    verify = {}
    for i, k in enumerate(lengths):
        if progress:
            progress(f"profiling: target pass of {k} tokens", i / (len(lengths) + 1))
        verify[k] = time_pass(pair.target_lm, k, reps)
    draft = time_pass(pair.draft_lm, 1, max(reps, 5)) if pair.draft_lm is not None else float("nan")
    if progress:
        progress("profiling: done", 1.0)
    return CostModel(verify, draft, profile_key(pair), _now())


def costs_cached(pair) -> bool:
    """Whether this machine's cost model for the pair is already measured (``gamma="auto"`` is then instant)."""
    return _cache_file("costs", profile_key(pair)).exists()


def cached_costs(pair, refresh: bool = False, progress: Progress | None = None) -> CostModel:
    """The pair's cost model on this machine: read from the cache, or measured once and cached."""
    key = profile_key(pair)
    path = _cache_file("costs", key)
    if not refresh and path.exists():
        try:
            return CostModel.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as e:
            log.warning("ignoring unreadable profile %s: %s", path, e)
    costs = measure(pair, progress=progress)
    atomic_write(path, json.dumps(costs.to_dict(), indent=1).encode())
    return costs


# -- the target's representation -------------------------------------------------------------------
def candidate_reprs(device: torch.device) -> tuple[str, ...]:
    if device.type == "cuda":
        return ("bfloat16", "float16", "float32")
    return ("float32", "bfloat16", "int8")


def choose_target_repr(model_fp32: torch.nn.Module | Callable[[], torch.nn.Module], model_name: str,
                       device: torch.device, progress: Progress | None = None, refresh: bool = False,
                       int8_lean: bool = False) -> tuple[str, dict]:
    """The target representation for ``auto`` on this machine, and the timings it was chosen on
    ({repr: {"1": ms, "7": ms}}). Measured once per machine, torch version and model; cached.
    ``int8_lean``: int8 is timed on the lean path, the one it will run (``load_pair``'s auto).

    ``model_fp32``: the float32 model (each candidate is a copy of it), or a function that loads a
    fresh one, so that only one candidate is in memory at a time: with the model held beside a copy,
    the first start of the embedded pair peaked at 17.5 GB, over a 16 GB machine."""

    key = {"machine": machine_name(device), "device": str(device), "torch": torch.__version__, "model": model_name,
           "engine": engine_revision(), "int8_impl": "lean" if int8_lean else "hf"}
    path = _cache_file("repr", key)
    if not refresh and path.exists():
        try:
            d = json.loads(path.read_text())
            return d["choice"], d["timings"]
        except (OSError, ValueError, KeyError) as e:
            log.warning("ignoring unreadable representation choice %s: %s", path, e)
    timings = {}
    cands = candidate_reprs(device)
    for i, r in enumerate(cands):
        if progress:
            progress(f"choosing the target's representation (once on this machine): timing {r}", i / len(cands))
        m = to_repr(model_fp32, r, copy=True) if isinstance(model_fp32, torch.nn.Module) else \
            to_repr(model_fp32(), r)
        lm = LeanLM(m) if r == "int8" and int8_lean and not lean_unsupported(m) else HFLM(m)
        timings[r] = {"1": time_pass(lm, 1, 3, context=64), "7": time_pass(lm, 7, 3, context=64)}
        del lm, m
        release_memory()
    best = min(timings, key=lambda r: timings[r]["7"])
    limit = timings[best]["7"] * (1 + TIE)
    choice = next(r for r in EXACTNESS if r in timings and timings[r]["7"] <= limit)
    log.info("target representation on %s: %s (7-token pass: %s)", key["machine"], choice,
             {r: round(t["7"], 1) for r, t in timings.items()})
    atomic_write(path, json.dumps({"key": key, "choice": choice, "timings": timings, "measured_at": _now()},
                                  indent=1).encode())
    if progress:
        progress(f"target representation: {choice}", 1.0)
    return choice, timings


def draft_options(draft_fp32: torch.nn.Module, vocab_ids: torch.Tensor | None, reps: int = 7) -> dict[str, float]:
    """Median ms per draft token of each way to run the draft on this machine: transformers' forward
    in float32 and int8, the lean path in int8 with the full and with the reduced vocabulary."""

    out = {"hf float32": time_pass(HFLM(draft_fp32), 1, reps)}
    if vocab_ids is not None:
        out["lean int8, reduced vocabulary"] = time_pass(LeanLM(draft_fp32, vocab_ids=vocab_ids, int8=True), 1, reps)
    out["lean int8, full vocabulary"] = time_pass(LeanLM(draft_fp32, int8=True), 1, reps)
    out["lean float32, full vocabulary"] = time_pass(LeanLM(draft_fp32), 1, reps)
    if draft_fp32.device.type == "cpu":
        out["hf int8"] = time_pass(HFLM(quantize_int8(to_repr(draft_fp32, "float32", copy=True))), 1, reps)
    return out
