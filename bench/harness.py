"""Benchmark harness: AR, SD, CSD (at several lambda/tau settings), the ablations and transformers'
assisted generation on the same items, measured the way the CSD paper measures them (arXiv
2604.13634: greedy, batch 1, speed-up over autoregressive decoding, acceptance, task accuracy).

Fairness on a noisy machine:
- every method runs on the same items in one process, after one warm-up generation each;
- items are interleaved: item 1 with every method, then item 2 ... (datasets take turns); the method order rotates by
  one per item so that no method always runs first (cache, thermal or load effects);
- every wall time is taken here, around the whole generation, so that all methods pay for their
  own overheads; summaries count an item only when every method finished it (paired).

Baselines: greedy SD is the exact one (its output is the target's own); transformers' assisted
generation runs twice: at its own defaults (``hf-assisted``: what a user gets) and configured like
ours (``hf-assisted-fixed``: gamma draft tokens per round, constant schedule, no confidence
threshold), so that a reader sees what comes from the verification rule and what from drafting.

Memory policy (``memory_mode``): each method that reads a correction memory gets its own copy of
the start memory. ``"online"`` (default): that copy evolves across the items of the run, in the
order they run, as a served model's memory would; ``"fresh"``: every item starts from a new copy.

Outputs in ``out_dir``: ``results.json`` (every figure; rewritten after every item, so an
interrupted run keeps what it finished), ``results.md``, ``speedup.html``, ``divergences.html``,
``frontier.html`` (Plotly; one ``plotly.min.js`` beside the charts), ``frontier.json`` (the frontier's points, which the
app's Analyse tab shows) and ``memory_<method>.json.gz``.
"""
from __future__ import annotations

import logging
import os
import platform
import re
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime
from itertools import zip_longest
from pathlib import Path

from csd.config import ConfigError, CSDConfig

from .datasets import Item, item_range, load_dataset, validate_datasets
from .graders import grade
from .io import Progress, now, write_json
from .methods import DEFAULT_METHODS, Method, make_methods
from .report import render_markdown, write_charts
from .results import ItemResult, assemble, mark_where_answers_leave_sd, median_bound

log = logging.getLogger(__name__)

MEMORY_MODES = ("online", "fresh")
WARMUP_PROMPT = "Write one sentence about the sea, then a Python one-liner that adds two numbers."
WARMUP_TOKENS = 8


# -- one method on one item -------------------------------------------------------------------------
def measure(pair, decoder, method: Method, prompt_ids: list[int], memory) -> tuple[ItemResult, object]:
    """Run one method on one prompt; the wall time is taken around the whole generation.
    Returns the figures (dataset and item fields left empty) and the engine's run (None for hf)."""
    cfg = method.cfg
    if method.hf is not None:
        fixed = cfg.gamma if method.hf == "fixed" and cfg.gamma != "auto" else (6 if method.hf == "fixed" else None)
        ids, wall, tp, dp = generate_hf(pair, prompt_ids, cfg.max_new_tokens, fixed_gamma=fixed)
        text = pair.tokenizer.decode(ids, skip_special_tokens=True)
        stopped = "eos" if ids and ids[-1] in pair.eos_ids else "max_new_tokens"
        return ItemResult("", "", method.name, 0, wall, len(ids), tp, dp, stopped_by=stopped, text=text,
                          token_ids=ids), None
    t0 = time.perf_counter()
    run = decoder.run(prompt_ids, cfg, memory)
    for _ in run:
        pass
    wall = time.perf_counter() - t0
    mt = run.metrics
    drafting = cfg.uses_draft
    return ItemResult("", "", method.name, 0, wall, mt.new_tokens, mt.target_forwards, mt.draft_forwards,
                      mt.drafted if drafting else None, mt.accepted if drafting else None,
                      mt.rescued if drafting else None, mt.divergences if drafting else None,
                      mt.bookkeeping_s, mt.policy_s, mt.wall_s, mt.stopped_by, text=run.text,
                      token_ids=list(run.token_ids),
                      **({"lookup_blocks": mt.lookup_blocks, "lookup_drafted": mt.lookup_drafted,
                          "lookup_kept": mt.lookup_kept} if cfg.lookup else {})), run


def generate_hf(pair, prompt_ids: list[int], max_new_tokens: int, fixed_gamma: int | None = None
                ) -> tuple[list[int], float, int, int]:
    """transformers' assisted generation (greedy) on the same loaded models: at its own defaults,
    or with ``fixed_gamma`` draft tokens per round (constant schedule, confidence threshold off).
    Target and draft forward passes are counted by hooks."""
    import torch

    passes = {"target": 0, "draft": 0}

    def counter(name):
        def hook(_module, _inputs, _output):
            passes[name] += 1
        return hook

    x = torch.tensor([prompt_ids], dtype=torch.long, device=pair.target.device)
    pad = pair.tokenizer.pad_token_id
    pad = pad if pad is not None else pair.eos_ids[0]
    gc = pair.draft.generation_config
    saved = {k: getattr(gc, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                                                "assistant_confidence_threshold")}
    if fixed_gamma is not None:
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = fixed_gamma, "constant"
        gc.assistant_confidence_threshold = 0.0
    hooks = [pair.target.register_forward_hook(counter("target")),
             pair.draft.register_forward_hook(counter("draft"))]
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = pair.target.generate(input_ids=x, attention_mask=torch.ones_like(x), assistant_model=pair.draft,
                                       do_sample=False, max_new_tokens=max_new_tokens,
                                       eos_token_id=list(pair.eos_ids), pad_token_id=pad)
        wall = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
        if fixed_gamma is not None:        # the defaults' own state (its heuristic schedule) is left as it was
            for k, v in saved.items():
                setattr(gc, k, v)
    new = out[0, len(prompt_ids):].tolist()
    eos = set(pair.eos_ids)
    for i, t in enumerate(new):          # batch 1 never pads, but cut after the first EOS to be sure
        if t in eos:
            new = new[:i + 1]
            break
    return new, wall, passes["target"], passes["draft"]


def rotated(methods: list, k: int) -> list:
    """The method order for the k-th item: rotate by one per item."""
    k %= len(methods)
    return methods[k:] + methods[:k]


# -- the harness -------------------------------------------------------------------------------------
def run_bench(pair, dataset: str | list[str], limit: int | None, methods: str | list[str] = DEFAULT_METHODS,
              max_new_tokens: int = 128, out_dir: str | os.PathLike = "bench-results", seed: int = 0,
              store=None, progress: Progress | None = None, *, gamma: int | str = 6, lam: float = 6,
              tau: float = 0.01, sweep=None, memory=None, memory_mode: str = "online", warmup: bool = True,
              show_bar: bool = True, command: str = "", costs=None, gamma_max: int = 16, lookup: int = 0,
              bound_checks: int = 2) -> dict:
    """Benchmark ``methods`` (and one CSD column per ``sweep`` setting) on ``limit`` items of each
    dataset (fixed by ``seed``) and write the outputs to ``out_dir``. ``store``: a ``db.store.Store``
    to record every generation in, or None. ``memory``: the start memory of the memory methods
    (default: the pair's calibrated memory). ``lookup``: copies from the context in the drafting
    columns (0: none, the paper's methods alone). ``bound_checks``: where the run has a profile
    (gamma auto), re-measure it this many times beside the run (one before the items, the rest after
    them) and judge CSD against the median bound of the profiles (``_bound``); the draft-length policy
    keeps the cached profile throughout. Returns the results dict (also in ``results.json``).
    On KeyboardInterrupt, the outputs hold the finished items and the interrupt propagates."""
    from tqdm.auto import tqdm

    from csd.decode import Decoder

    datasets = validate_datasets(dataset)
    if memory_mode not in MEMORY_MODES:
        raise ValueError(f"memory_mode must be one of {', '.join(MEMORY_MODES)}, got {memory_mode!r}")
    try:
        base = CSDConfig(method="csd", gamma=gamma, gamma_max=gamma_max, lam=lam, tau=tau,
                         max_new_tokens=max_new_tokens, lookup=lookup).validated()
    except ConfigError as e:
        raise ValueError(str(e)) from None
    cols = make_methods(methods, base, sweep)
    if pair.draft is None and any(m.cfg.uses_draft or m.hf for m in cols):
        raise ValueError("methods other than 'ar' need a draft model, and none is loaded")

    # datasets take turns (gsm8k 1, humaneval 1, gsm8k 2, ...): a run stopped early stays balanced
    per_dataset = []
    for spec in datasets:
        name, skip, stop = item_range(spec, limit)
        per_dataset.append(load_dataset(name, stop, seed)[skip:])
    items: list[Item] = [it for turn in zip_longest(*per_dataset) for it in turn if it is not None]
    prompts = {(it.dataset, it.item_id): pair.encode_prompt(it.prompt, chat=True) for it in items}
    for ids in prompts.values():
        base.validated(pair.context_limit, len(ids))

    decoder = Decoder(pair, costs=costs)
    if gamma == "auto":
        _ = decoder.costs                  # measure (or read) the profile before any timing
    start_memory = memory if memory is not None else decoder.default_memory()
    memories = {m.name: start_memory.copy() for m in cols if m.reads_memory}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bench_id = datetime.now().strftime("%Y%m%d-%H%M%S")
    results = {"meta": _meta(pair, decoder, cols, datasets, limit, seed, base, memory_mode, start_memory,
                             bench_id, command),
               "items": [], "status": "running"}
    records: list[ItemResult] = []
    divergences: dict[str, Counter] = {m.name: Counter() for m in cols if m.cfg.uses_draft and not m.hf}
    token_text: dict[int, str] = {}

    total = len(items) * len(cols)
    status = "failed"
    bar = tqdm(total=total, desc="bench", unit="gen", disable=not show_bar, dynamic_ncols=True)
    done = 0
    try:
        if warmup:
            warm_ids = pair.encode_prompt(WARMUP_PROMPT, chat=True)
            for m in cols:
                bar.set_postfix_str(f"warm-up {m.name}")
                if progress:
                    progress(f"warm-up: {m.name}", 0.0)
                mem = memories[m.name].copy() if m.name in memories else None    # the warm-up never teaches a memory
                warm = replace(m, cfg=replace(m.cfg, max_new_tokens=WARMUP_TOKENS))
                measure(pair, decoder, warm, warm_ids, mem)
        if bound_checks > 0:
            _check_profile(results, pair, decoder, progress)
        for k, it in enumerate(items):
            prompt_ids = prompts[(it.dataset, it.item_id)]
            item_records: dict[str, ItemResult] = {}
            for j, m in enumerate(rotated(cols, k)):
                bar.set_postfix_str(f"{it.dataset} {it.item_id} {m.name}")
                if progress:
                    progress(f"{it.dataset} {it.item_id}: {m.name}", done / total)
                mem = None
                if m.name in memories:
                    mem = memories[m.name] if memory_mode == "online" else start_memory.copy()
                r, run = measure(pair, decoder, m, prompt_ids, mem)
                r.dataset, r.item_id, r.order = it.dataset, it.item_id, j
                if run is not None and m.name in divergences:
                    for ev in run.events:
                        if ev.is_divergence:
                            divergences[m.name][(ev.draft_id, ev.target_id)] += 1
                            token_text.setdefault(ev.draft_id, ev.draft_text or "")
                            token_text.setdefault(ev.target_id, ev.target_text or "")
                g = grade(it, r.text)
                r.correct, r.predicted, r.grade_detail = g.correct, g.predicted, g.detail
                item_records[m.name] = r
                if store is not None:
                    _record(store, pair, m, it, r, run, bench_id)
                done += 1
                bar.update(1)
            for ref in ("ar", "sd"):
                if ref in item_records:
                    ids = item_records[ref].token_ids
                    for r in item_records.values():
                        setattr(r, f"identical_to_{ref}", r.token_ids == ids)
            mark_where_answers_leave_sd(item_records.values(), pair.tokenizer.decode)
            records.extend(item_records[m.name] for m in cols if m.name in item_records)
            results.update(assemble(records, [m.name for m in cols], divergences, token_text, "running", median_bound(results)))
            write_json(out / "results.json", results)
            (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
        for _ in range(bound_checks - 1):
            _check_profile(results, pair, decoder, progress)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        bar.close()
        results.update(assemble(records, [m.name for m in cols], divergences, token_text, status, median_bound(results)))
        results["meta"]["finished_at"] = now()
        results["meta"]["loadavg_end"] = _loadavg()
        write_json(out / "results.json", results)
        write_json(out / "frontier.json", {"meta": {k: results["meta"].get(k) for k in
                                                     ("command", "started_at", "machine", "dtype", "draft_dtype",
                                                      "models", "config")},
                                            "status": results["status"], "points": results.get("frontier", [])})
        (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
        try:
            write_charts(results, out)
        except (ImportError, ValueError, KeyError, OSError) as e:       # never lose the JSON and the table to a chart
            log.exception("bench charts not written: %s", e)
        for name, mem in memories.items():
            mem.save(out / f"memory_{_safe(name)}.json.gz")
            if store is not None and memory_mode == "online":
                store.save_memory(mem, label=f"bench {bench_id} {name} memory after {len(items)} items")
        if progress:
            progress(f"bench {results['status']}", 1.0)
    return results


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name).strip("_")


def _record(store, pair, m: Method, item: Item, r: ItemResult, run, bench_id: str) -> None:
    """Write one generation to the store (after its timing, so the store never slows a method)."""
    from csd.events import RunMetrics

    fields = dict(kind="bench", **pair.run_fields(), method=m.name[:32], temperature=0.0,
                  max_new_tokens=m.cfg.max_new_tokens, prompt=item.prompt,
                  label=f"bench {bench_id} {item.dataset} {item.item_id}"[:200],
                  target_repr=pair.target_repr, draft_repr=pair.draft_dtype or None)
    if m.hf is None and m.cfg.uses_draft:
        fields.update({k: v for k, v in m.cfg.run_fields().items() if k in ("gamma", "lam", "tau", "lookup")})
    with store.record(**fields) as rec:
        if run is None:
            rec.result(r.text, {"new_tokens": r.new_tokens, "target_forwards": r.target_passes,
                                "draft_forwards": r.draft_passes, "wall_s": r.wall_s,
                                "mean_accepted_length": r.mean_accepted_length, "stopped_by": r.stopped_by,
                                "correct": r.correct})
            return
        for ev in run.events:
            rec.add(ev)
        metrics: RunMetrics = run.metrics
        rec.result(r.text, {**metrics.to_dict(), "bench_wall_s": r.wall_s, "correct": r.correct})


def _check_profile(results: dict, pair, decoder, progress: Progress | None) -> None:
    """Re-measure the machine's profile beside the run (not cached, not used by the policy) and add its
    bound to ``meta.profile_checks``: on a shared machine one profile's draft time can be off by 1.5x."""
    if decoder._costs is None:
        return
    from csd.profile import measure as measure_costs
    results["meta"].setdefault("profile_checks", []).append(_profile_record(measure_costs(pair, progress=progress)))


def _profile_record(c) -> dict:
    """A cost model as the results hold it: its figures, its bound at a few block lengths, its best bound."""
    g_best, b_best = c.best_bound()
    return {**c.to_dict(), "bound": {str(g): c.bound(g) for g in (1, 2, 4, 6, 8, 12, 16)},
            "best_bound": {"gamma": g_best, "speedup": b_best}}


# -- outputs ------------------------------------------------------------------------------------------
def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _meta(pair, decoder, cols: list[Method], datasets, limit, seed, base: CSDConfig, memory_mode, memory,
          bench_id: str, command: str) -> dict:
    import torch
    import transformers

    from csd.profile import machine_name

    costs = _profile_record(decoder.costs) if decoder._costs is not None else None
    return {
        "bench_id": bench_id, "command": command, "started_at": now(),
        "machine": {"platform": platform.platform(), "cpu": machine_name(pair.device), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "device": str(pair.device)},
        "loadavg_start": _loadavg(),
        "pair": {"pair_id": pair.pair_id, "draft": pair.draft_name, "target": pair.target_name},
        "dtype": pair.target_repr,
        "draft_dtype": pair.draft_dtype,
        "models": pair.describe(),
        "profile": costs,
        "humaneval_isolation": _isolation(),
        "config": {"datasets": datasets, "limit": limit, "methods": [m.name for m in cols],
                   "settings": {m.name: {"method": m.cfg.method, "gamma": m.cfg.gamma, "lam": m.cfg.lam,
                                         "tau": m.cfg.tau, "lookup": m.cfg.lookup, "hf": m.hf} for m in cols},
                   "max_new_tokens": base.max_new_tokens, "seed": seed, "gamma": base.gamma, "lookup": base.lookup,
                   "lam": base.lam,
                   "tau": base.tau, "temperature": 0.0, "chat": True, "memory_mode": memory_mode,
                   "warmup_tokens": WARMUP_TOKENS, "method_order": "rotated by one per item",
                   "hf_assisted": "target.generate(assistant_model=draft, do_sample=False) at transformers' defaults "
                                  "(heuristic draft length, confidence threshold); passes counted by forward hooks",
                   "hf_assisted_fixed": "the same with num_assistant_tokens = gamma, constant schedule, "
                                        "assistant_confidence_threshold 0"},
        "memory": {"patterns": len(memory), "total": memory.total, "candidates_at_lambda": memory.n_candidates(base.lam),
                   "top20_share": memory.top_share(0.2), "calibration": memory.meta.get("calibration")},
    }


def _isolation() -> str:
    from .sandbox import SandboxError, isolation
    try:
        return isolation()
    except SandboxError as e:
        return f"unavailable: {e}"

