"""What the models cost on this machine as a ``csd.costs.CostModel`` (the target's time for a pass of k
tokens, the draft's per token), measured once and cached by machine, torch, pair and engine code.
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
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..costs import CostModel
from ..decode import Decoder
from ..events import Progress
from ..fileio import atomic_write, cache_dir, write_json
from .convert import digest
from .lm import HFLM, LeanLM
from .ortlm import ort_missing, ort_version
from .quant import CPU_DRAFT_REPRS, int8_kernels, quantize_int8, to_repr

CPU_TARGET_CHOICES = ("int8", "gguf")     # what ``--dtype auto`` picks between on the CPU (``choose_target_dtype``)

log = logging.getLogger(__name__)

PASS_LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)   # tokens in a target pass (a block of k - 1 + 1)
CONTEXT = 150                                                 # cached tokens before the timed pass


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


def time_pass(lm, k: int, reps: int = 5, context: int = CONTEXT) -> float:
    """Median ms of a k-token forward of an ``csd.runtime.lm.LM`` after ``context`` cached tokens (fewer where a
    static KV cache holds fewer: its attention reads the whole capacity whatever it holds)."""
    return time_shapes([(lm, k)], reps, context)[0]


@torch.inference_mode()
def time_shapes(shapes, reps: int = 5, context: int = CONTEXT, progress: Progress | None = None,
                label: str = "") -> list[float]:
    """Median ms of each (lm, k) in ``shapes``: a k-token forward after ``context`` cached tokens, on one cache a
    model. The shapes take turns (1, 2, 3, ..., 1, 2, 3, ...), so that a spell of a busy or slow host falls on each
    alike: gamma auto plans with their ratios. One shape at a time, three passes each, a 1-token target pass came
    out at 25, 35 and 32 ms in three profiles of one machine (docs/bench/avx2-epyc7)."""
    caches = {}                                # id(lm): its cache and the tokens cached before each pass
    for lm, _ in shapes:
        if id(lm) not in caches:
            fill = context
            if getattr(lm, "capacity", None) is not None:
                longest = max(k for m, k in shapes if m is lm)
                fill = max(1, min(context, lm.capacity - longest))
            cache = lm.new_cache()
            lm.forward(cache, [100 + (i % 1000) for i in range(fill)], 1)
            caches[id(lm)] = (cache, fill)
    times = [[] for _ in shapes]
    for rnd in range(reps + 1):                # the first round warms each shape up and is not counted
        if progress:
            progress(f"profiling: {label}round {rnd + 1} of {reps + 1}", rnd / (reps + 2))
        for i, (lm, k) in enumerate(shapes):
            cache, fill = caches[id(lm)]
            t0 = time.perf_counter()
            lm.forward(cache, [7] * k, k)
            _sync(lm.device)
            if rnd:
                times[i].append(1000 * (time.perf_counter() - t0))
            lm.crop(cache, fill)
    return [statistics.median(t) for t in times]


@torch.inference_mode()
def time_interleaved(lms: dict, reps: int = 9, context: int = CONTEXT, tokens: int = 1) -> dict[str, dict[str, float]]:
    """Each ``LM``'s pass of ``tokens`` after ``context`` cached ones, the models in turn (A B C A B C ...) so
    that a busy machine slows each alike: the median wall and CPU ms (this process's threads) of each."""
    caches = {k: lm.new_cache() for k, lm in lms.items()}
    for k, lm in lms.items():
        lm.forward(caches[k], [100 + (i % 1000) for i in range(context)], 1)
    times = {k: ([], []) for k in lms}
    warm = 3
    for _ in range(reps + warm):       # the first rounds warm up (a runtime's first calls lay out its weights)
        for k, lm in lms.items():
            wall, cpu = time.perf_counter(), time.process_time()
            lm.forward(caches[k], [7] * tokens, tokens)
            _sync(lm.device)
            times[k][0].append(1000 * (time.perf_counter() - wall))
            times[k][1].append(1000 * (time.process_time() - cpu))
            lm.crop(caches[k], context)
    return {k: {"wall_ms": round(statistics.median(w[warm:]), 2), "cpu_ms": round(statistics.median(c[warm:]), 2)}
            for k, (w, c) in times.items()}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


ENGINE_FILES = ("lm.py", "static.py", "quant.py", "ortlm.py", "ovlm.py", "kquant.py", "kblocks.py", "kernels/kquant.c",
                "hugepages.py", "profile.py")   # the passes, representations, where the weights live, how timed


@functools.cache
def engine_revision() -> str:
    """A digest of the code whose speed a profile measures (``ENGINE_FILES``), of the int8 kernel asked for
    (``CSD_INT8_KERNEL``), of the k-quant kernel's build (``CSD_KQUANT_VARIANT``) and of whether the weights go on
    huge pages (``CSD_HUGEPAGES``): a change re-times it."""
    from .hugepages import ENV as HUGEPAGES_ENV
    from .hugepages import supported
    from .kquant import VARIANT_ENV
    from .quant import KERNEL
    h = hashlib.sha1(KERNEL.encode())
    if variant := os.environ.get(VARIANT_ENV):      # none set: the digest the native build always had
        h.update(variant.encode())
    if not supported():
        h.update(f"{HUGEPAGES_ENV}=off".encode())
    for name in ENGINE_FILES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:12]


def profile_key(pair) -> dict:
    return {"machine": machine_name(pair.device), "device": str(pair.device), "torch": torch.__version__,
            "engine": engine_revision(), "pair": pair.pair_id, "representation": pair.rep.as_dict(),
            "target_impl": pair.target_lm.impl, "draft_impl": pair.draft_lm.impl if pair.draft_lm is not None else "",
            "draft_vocab": pair.draft_vocab_size, "int8_kernels": int8_kernels(pair.target_lm),   # a pass's kernels
            **({"static_capacity": pair.target_lm.capacity} if hasattr(pair.target_lm, "capacity") else {})}


def _cache_file(kind: str, key: dict) -> Path:
    return cache_dir() / "profiles" / f"{kind}-{digest(key)}.json"


def measure(pair, lengths=PASS_LENGTHS, reps: int = 5, progress: Progress | None = None,
            verify: dict[int, float] | None = None) -> CostModel:
    """Time the target at each pass length (unless ``verify`` gives them) and the draft per token (needs a loaded
    draft), in turn, then the host's share of a plain step and of a one-token block (``host_overheads``)."""
    target, draft = pair.target_lm, pair.draft_lm
    shapes = [] if verify is not None else [(target, k) for k in lengths]
    if draft is not None:
        shapes.append((draft, 1))
    ms = time_shapes(shapes, reps, progress=progress, label="target and draft ") if shapes else []
    if verify is None:
        verify = dict(zip(lengths, ms))
    costs = CostModel(verify, ms[-1] if draft is not None else float("nan"), profile_key(pair), _now())
    if draft is not None:
        costs.pass_overhead_ms, costs.draft_overhead_ms = host_overheads(pair)
    if progress:
        progress("profiling: done", 1.0)
    return costs


@torch.inference_mode()
def host_overheads(pair, reps: int = 7, context: int = 16) -> tuple[float, float]:
    """Median ms beyond the models' own passes (launches, the transfer, the host's work between them) of (a) a
    plain target step, its token back on the host, and (b) a one-token block drafted, verified, its scores on the
    host. Each is timed beside the same passes bare, in turn, and the median of the paired differences is kept:
    the difference of two medians timed apart would carry the host's drift between them."""
    target, draft = pair.target_lm, pair.draft_lm
    tc, dc = target.new_cache(), draft.new_cache()
    prompt = [100 + i for i in range(context)]
    target.forward(tc, prompt, 1)
    draft.forward(dc, prompt, 1)

    def step(host: bool):
        logits = target.forward(tc, [7], 1)
        if host:
            logits[-1].argmax().tolist()
        _sync(target.device)
        target.crop(tc, context)

    def block(host: bool):
        logits = draft.forward(dc, [7], 1)
        if host:
            x = logits[-1].argmax().view(1)
            if draft.vocab_ids is not None:
                x = draft.vocab_ids[x]
            ids = torch.cat([torch.tensor([7], device=x.device), x.to(torch.long)])
            torch.stack([target.forward(tc, ids, 2).argmax(-1).float(), ids.float()]).tolist()
        else:
            target.forward(tc, [7, 8], 2)
        _sync(target.device)
        target.crop(tc, context)
        draft.crop(dc, context)

    gaps = {step: [], block: []}
    for rnd in range(reps + 1):                # the first round warms up and is not counted
        for fn in (step, block):
            t = []
            for host in (True, False):
                t0 = time.perf_counter()
                fn(host)
                t.append(1000 * (time.perf_counter() - t0))
            if rnd:
                gaps[fn].append(t[0] - t[1])
    target.release(tc)
    plain = max(statistics.median(gaps[step]), 0.0)
    return plain, max(statistics.median(gaps[block]) - plain, 0.0)


def costs_cached(pair) -> bool:
    """Whether this machine's cost model for the pair is already measured (``gamma="auto"`` is then instant)."""
    return _cache_file("costs", profile_key(pair)).exists()


def cached_costs(pair, refresh: bool = False, progress: Progress | None = None,
                 target_of: CostModel | None = None) -> CostModel:
    """The pair's cost model on this machine: read from the cache, or measured once and cached. ``target_of``: the
    costs of a pair with the same target (another draft beside it), whose target passes are taken, not timed again."""
    key = profile_key(pair)
    path = _cache_file("costs", key)
    if not refresh and path.exists():
        try:
            return CostModel.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as e:
            log.warning("ignoring unreadable profile %s: %s", path, e)
    costs = measure(pair, progress=progress, verify=target_of.verify_ms if target_of is not None else None)
    atomic_write(path, json.dumps(costs.to_dict(), indent=1).encode())
    return costs


def decoder(pair, costs=None, **kw) -> Decoder:
    """A decoder on ``pair`` whose gamma auto plans with ``costs``, else this machine's
    (``cached_costs``, on first need)."""
    return Decoder(pair, costs=functools.partial(cached_costs, pair) if costs is None else costs, **kw)


def draft_options(draft_fp32: torch.nn.Module, vocab_ids: torch.Tensor | None, reps: int = 7) -> dict[str, float]:
    """Median ms per draft token of each way to run the draft on this machine (transformers', lean)."""
    out = {"hf float32": time_pass(HFLM(draft_fp32), 1, reps)}
    if vocab_ids is not None:
        out["lean int8, reduced vocabulary"] = time_pass(LeanLM(draft_fp32, vocab_ids=vocab_ids, int8=True), 1, reps)
    out["lean int8, full vocabulary"] = time_pass(LeanLM(draft_fp32, int8=True), 1, reps)
    out["lean float32, full vocabulary"] = time_pass(LeanLM(draft_fp32), 1, reps)
    if draft_fp32.device.type == "cpu":
        out["hf int8"] = time_pass(HFLM(quantize_int8(to_repr(draft_fp32, "float32", copy=True))), 1, reps)
    return out


def draft_choice_file() -> Path:
    """Where ``python -m csd prepare`` records which CPU draft representation ran faster on this machine."""
    key = {"machine": machine_name("cpu"), "torch": torch.__version__, "engine": engine_revision(),
           "drafts": CPU_DRAFT_REPRS,
           **({"onnxruntime": v} if (v := ort_version()) else {})}
    return _cache_file("draft-repr", key)


def chosen_draft_weights() -> str:
    """``--draft-dtype auto`` on the CPU: what prepare measured to run faster here (``choose_draft_weights``),
    int8 where nothing was measured."""
    try:
        choice = json.loads(draft_choice_file().read_text()).get("choice")
    except (OSError, ValueError, AttributeError):
        return "int8"
    return choice if choice in CPU_DRAFT_REPRS else "int8"


def choose_draft_weights(load_draft_lm, reps: int = 9) -> dict:
    """Time the draft's one-token step in int8, ort4, on its GGUF blocks and on them at 4 bits (q4_0) here,
    alternating (``load_draft_lm(repr)``: the draft's ``LM``, None where it fell back), and record the fastest for
    ``--draft-dtype auto``; another than int8 only where it is at least ``INT4_MARGIN`` faster, since it may keep
    fewer tokens. Returns what was written."""
    from .kquant import kernel_missing
    missing = {"ort4": why} if (why := ort_missing()) else {}
    if why := kernel_missing():
        missing.update(gguf=why, q4_0=why)
    lms = {r: lm for r in CPU_DRAFT_REPRS if r not in missing and (lm := load_draft_lm(r)) is not None}
    times = time_interleaved(lms, 3 * reps)
    ms = {r: t["wall_ms"] for r, t in times.items()}
    best = min((r for r in ms if r != "int8"), key=ms.get, default="int8")
    choice = best if ms[best] <= (1 - INT4_MARGIN) * ms["int8"] else "int8"
    out = {"choice": choice, "draft_ms": ms, "draft_cpu_ms": {r: t["cpu_ms"] for r, t in times.items()},
           "measured_at": _now(), "machine": machine_name("cpu"), **{f"{r}_missing": why for r, why in missing.items()}}
    write_json(draft_choice_file(), out)
    return out


INT4_MARGIN = 0.08


def target_choice_file() -> Path:
    """Where ``python -m csd prepare`` records whether the target ran faster in int8 or on its GGUF blocks here."""
    key = {"machine": machine_name("cpu"), "torch": torch.__version__, "engine": engine_revision()}
    return _cache_file("target-repr", key)


def chosen_target_dtype() -> str:
    """``--dtype auto`` on the CPU: what prepare measured to run faster here (``choose_target_dtype``), int8 where
    nothing was measured or the k-quant kernel cannot run."""
    try:
        choice = json.loads(target_choice_file().read_text()).get("choice")
    except (OSError, ValueError, AttributeError):
        return "int8"
    if choice == "gguf":
        from .kquant import kernel_missing
        if kernel_missing():
            return "int8"
    return choice if choice in CPU_TARGET_CHOICES else "int8"


VERIFY_TOKENS = 5      # the verify pass weighed beside a 1-token step: a block of gamma 4, near gamma auto's choice


def choose_target_dtype(load_target_lm, reps: int = 9) -> dict:
    """Time the target's 1-token step and a ``VERIFY_TOKENS``-token verify pass in int8 (activations per token) and
    on the GGUF's blocks (``load_target_lm(repr)``: the target's ``LM``, None where it cannot run), and record the
    faster by the sum of the two for ``--dtype auto``. One target is held at a time, so that a first start stays
    within its memory (two held together took the app's first start to a 4.8 GiB peak). Returns what was written."""
    from .kquant import kernel_missing
    from .quant import release_memory
    missing = {"gguf": why} if (why := kernel_missing()) else {}
    one, verify = {}, {}
    for r in CPU_TARGET_CHOICES:
        lm = None if r in missing else load_target_lm(r)
        if lm is None:
            continue
        one.update(time_interleaved({r: lm}, reps))
        verify.update(time_interleaved({r: lm}, reps, tokens=VERIFY_TOKENS))
        del lm
        release_memory()
    score = {r: one[r]["wall_ms"] + verify[r]["wall_ms"] for r in one}
    choice = min(score, key=score.get) if score else "int8"
    out = {"choice": choice, "step_ms": {r: t["wall_ms"] for r, t in one.items()},
           f"verify_{VERIFY_TOKENS}_ms": {r: t["wall_ms"] for r, t in verify.items()},
           "measured_at": _now(), "machine": machine_name("cpu"), **{f"{r}_missing": w for r, w in missing.items()}}
    write_json(target_choice_file(), out)
    return out
