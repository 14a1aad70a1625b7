"""Benchmark harness: AR, SD, CSD, the ablations and transformers' assisted generation on the
same items, measured the way the CSD paper measures them (arXiv 2604.13634: greedy, batch 1,
speed-up over autoregressive decoding, acceptance, task accuracy).

Fairness on a noisy machine:
- every method runs on the same items in one process, after one warm-up generation each;
- items are interleaved: item 1 with every method, then item 2 ...; the method order rotates
  by one per item so that no method always runs first (cache, thermal or load effects);
- every wall time is taken here, around the whole generation (``Decoder.run`` and its events,
  or ``generate``), so that all methods pay for their own overheads;
- speed-ups are paired: a summary counts an item only when every method finished it.

Memory policy (``memory_mode``): each method that reads a correction memory gets its own copy
of the start memory (the shipped default memory unless one is given). ``"online"`` (default):
that copy evolves across the items of the run, in the order they run, as a served model's
memory would; ``"fresh"``: every item starts from a new copy of the start memory.

Outputs in ``out_dir``: ``results.json`` (every figure; rewritten after every item, so an
interrupted run keeps what it finished), ``results.md`` (the paper-style table),
``speedup.html`` and ``divergences.html`` (Plotly, with plotly.js inline: they open offline),
and ``memory_<method>.json.gz`` (the memory of each method that reads one, at the end).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from csd.config import METHODS, CSDConfig

from .datasets import BUILTIN, Item, load_dataset
from .graders import grade
from .report import render_markdown, write_charts

Progress = Callable[[str, float], None]   # (message, fraction done in [0, 1])

HF_ASSISTED = "hf-assisted"
BENCH_METHODS = METHODS + (HF_ASSISTED,)
DEFAULT_METHODS = ("ar", "sd", "csd", HF_ASSISTED)
MEMORY_MODES = ("online", "fresh")
WARMUP_PROMPT = "Write one sentence about the sea, then a Python one-liner that adds two numbers."
WARMUP_TOKENS = 8
# The figures issue 5 asks for, checked over the mix of all datasets.
TARGETS = {"csd_over_ar": 2.0, "csd_over_hf": 1.3, "sd_over_hf": 1.0, "csd_passes_vs_sd": 0.9,
           "bookkeeping_share": 0.001}


@dataclass
class ItemResult:
    """One method on one item."""
    dataset: str
    item_id: str
    method: str
    order: int                         # position of this method in the item's rotated order
    wall_s: float                      # measured here, around the whole generation
    new_tokens: int
    target_passes: int | None          # target forward passes (hf-assisted: counted by a forward hook)
    draft_passes: int | None
    drafted: int | None = None         # draft tokens proposed (None where the method does not say)
    accepted: int | None = None
    rescued: int | None = None
    divergences: int | None = None
    bookkeeping_s: float | None = None  # memory + gate time inside the engine
    engine_wall_s: float | None = None  # the engine's own wall time (excludes setting up the run)
    stopped_by: str = ""
    correct: bool | None = None        # None: not graded
    predicted: str | None = None
    grade_detail: str = ""
    identical_to_ar: bool | None = None  # same token ids as AR on this item (None without AR)
    text: str = ""
    token_ids: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return self.new_tokens / self.target_passes if self.target_passes else None

    @property
    def acceptance_rate(self) -> float | None:
        if not self.drafted:
            return None
        return ((self.accepted or 0) + (self.rescued or 0)) / self.drafted

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, mean_accepted_length=self.mean_accepted_length,
                 acceptance_rate=self.acceptance_rate)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ItemResult":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


# -- generation, one method on one prompt ------------------------------------------------------
def measure(pair, decoder, method: str, cfg: CSDConfig, prompt_ids: list[int], memory) -> tuple[ItemResult, object]:
    """Run one method on one prompt; the wall time is taken around the whole generation.
    Returns the figures (dataset and item fields left empty) and the engine's run (None for hf-assisted)."""
    if method == HF_ASSISTED:
        ids, wall, tp, dp = _generate_hf(pair, prompt_ids, cfg.max_new_tokens)
        text = pair.tokenizer.decode(ids, skip_special_tokens=True)
        stopped = "eos" if ids and ids[-1] in pair.eos_ids else "max_new_tokens"
        return ItemResult("", "", method, 0, wall, len(ids), tp, dp, stopped_by=stopped, text=text, token_ids=ids), None
    t0 = time.perf_counter()
    run = decoder.run(prompt_ids, cfg, memory)
    for _ in run:
        pass
    wall = time.perf_counter() - t0
    mt = run.metrics
    drafting = cfg.uses_draft
    return ItemResult("", "", method, 0, wall, mt.new_tokens, mt.target_forwards, mt.draft_forwards,
                      mt.drafted if drafting else None, mt.accepted if drafting else None,
                      mt.rescued if drafting else None, mt.divergences if drafting else None,
                      mt.bookkeeping_s, mt.wall_s, mt.stopped_by, text=run.text, token_ids=list(run.token_ids)), run


def _generate_hf(pair, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], float, int, int]:
    """transformers' assisted generation (greedy) on the same loaded models, with its own
    defaults for the draft length; target and draft forward passes are counted by hooks."""
    import torch

    passes = {"target": 0, "draft": 0}

    def counter(name):
        def hook(_module, _inputs, _output):
            passes[name] += 1
        return hook

    x = torch.tensor([prompt_ids], dtype=torch.long, device=pair.target.device)
    pad = pair.tokenizer.pad_token_id
    pad = pad if pad is not None else pair.eos_ids[0]
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
    new = out[0, len(prompt_ids):].tolist()
    eos = set(pair.eos_ids)
    for i, t in enumerate(new):          # batch 1 never pads, but cut after the first EOS to be sure
        if t in eos:
            new = new[:i + 1]
            break
    return new, wall, passes["target"], passes["draft"]


def rotated(methods: list[str], k: int) -> list[str]:
    """The method order for the k-th item: rotate by one per item."""
    k %= len(methods)
    return methods[k:] + methods[:k]


# -- the harness -------------------------------------------------------------------------------
@dataclass
class BenchSetup:
    datasets: list[str]
    limit: int | None
    methods: list[str]
    max_new_tokens: int
    seed: int
    gamma: int
    lam: float
    tau: float
    memory_mode: str
    command: str = ""


def validate_methods(methods: Iterable[str]) -> list[str]:
    out = []
    for m in methods:
        m = m.strip()
        if not m:
            continue
        if m not in BENCH_METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(BENCH_METHODS)}")
        if m not in out:
            out.append(m)
    if not out:
        raise ValueError("no method to benchmark")
    return out


def validate_datasets(dataset: str | Iterable[str]) -> list[str]:
    """Dataset names from "a,b" or a list: built-in names or existing files."""
    names = [d.strip() for part in ([dataset] if isinstance(dataset, str) else dataset) for d in part.split(",")]
    names = list(dict.fromkeys(d for d in names if d))
    if not names:
        raise ValueError("no dataset to benchmark")
    for d in names:
        if d not in BUILTIN and not Path(d).expanduser().is_file():
            raise ValueError(f"unknown dataset {d!r}: choose {', '.join(BUILTIN)} or give a JSONL/text file")
    return names


def run_bench(pair, dataset: str | list[str], limit: int | None, methods: str | list[str] = DEFAULT_METHODS,
              max_new_tokens: int = 128, out_dir: str | os.PathLike = "bench-results", seed: int = 0,
              store=None, progress: Progress | None = None, *, gamma: int = 6, lam: float = 6, tau: float = 0.01,
              memory=None, memory_mode: str = "online", warmup: bool = True, show_bar: bool = True,
              command: str = "") -> dict:
    """Benchmark ``methods`` on ``limit`` items of each dataset (fixed by ``seed``) and write the
    outputs to ``out_dir``. ``store``: a ``db.store.Store`` to record every generation in, or None.
    ``memory``: the start memory of the memory methods (default: ``default_memory(pair)``).
    Returns the results dict (also in ``results.json``). On KeyboardInterrupt, the outputs hold
    the finished items and the interrupt propagates."""
    from tqdm.auto import tqdm

    from csd.decode import Decoder

    datasets = validate_datasets(dataset)
    methods = validate_methods(methods.split(",") if isinstance(methods, str) else methods)
    if memory_mode not in MEMORY_MODES:
        raise ValueError(f"memory_mode must be one of {', '.join(MEMORY_MODES)}, got {memory_mode!r}")
    if pair.draft is None and any(m != "ar" for m in methods):
        raise ValueError("methods other than 'ar' need a draft model, and none is loaded")
    base_cfg = CSDConfig(method="ar", gamma=gamma, lam=lam, tau=tau, max_new_tokens=max_new_tokens).validated()
    setup = BenchSetup(datasets, limit, methods, max_new_tokens, seed, gamma, lam, tau, memory_mode, command)

    items: list[Item] = []
    for name in datasets:
        items.extend(load_dataset(name, limit, seed))
    prompts = {(it.dataset, it.item_id): pair.encode_prompt(it.prompt, chat=True) for it in items}
    for ids in prompts.values():
        base_cfg.validated(pair.context_limit, len(ids))

    decoder = Decoder(pair)
    start_memory = memory if memory is not None else decoder.default_memory()
    memories = {m: start_memory.copy() for m in methods if m not in ("ar", HF_ASSISTED)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bench_id = datetime.now().strftime("%Y%m%d-%H%M%S")
    results = {
        "meta": _meta(pair, setup, start_memory, bench_id),
        "items": [],
        "status": "running",
    }
    records: list[ItemResult] = []
    divergences: dict[str, Counter] = {m: Counter() for m in memories}
    token_text: dict[int, str] = {}

    def cfg_for(method: str) -> CSDConfig:
        return replace(base_cfg, method="ar" if method == HF_ASSISTED else method)

    total = len(items) * len(methods)
    status = "failed"
    bar = tqdm(total=total, desc="bench", unit="gen", disable=not show_bar, dynamic_ncols=True)
    done = 0
    try:
        if warmup:
            warm_ids = pair.encode_prompt(WARMUP_PROMPT, chat=True)
            for m in methods:
                bar.set_postfix_str(f"warm-up {m}")
                if progress:
                    progress(f"warm-up: {m}", 0.0)
                mem = memories[m].copy() if m in memories else None      # the warm-up never teaches a memory
                measure(pair, decoder, m, replace(cfg_for(m), max_new_tokens=WARMUP_TOKENS), warm_ids, mem)
        for k, it in enumerate(items):
            prompt_ids = prompts[(it.dataset, it.item_id)]
            item_records: dict[str, ItemResult] = {}
            for j, m in enumerate(rotated(methods, k)):
                bar.set_postfix_str(f"{it.dataset} {it.item_id} {m}")
                if progress:
                    progress(f"{it.dataset} {it.item_id}: {m}", done / total)
                mem = None
                if m in memories:
                    mem = memories[m] if memory_mode == "online" else start_memory.copy()
                r, run = measure(pair, decoder, m, cfg_for(m), prompt_ids, mem)
                r.dataset, r.item_id, r.order = it.dataset, it.item_id, j
                if run is not None and m in divergences:
                    for ev in run.events:
                        if ev.is_divergence:
                            divergences[m][(ev.draft_id, ev.target_id)] += 1
                            token_text.setdefault(ev.draft_id, ev.draft_text or "")
                            token_text.setdefault(ev.target_id, ev.target_text or "")
                g = grade(it, r.text)
                r.correct, r.predicted, r.grade_detail = g.correct, g.predicted, g.detail
                item_records[m] = r
                if store is not None:
                    _record(store, pair, cfg_for(m), m, it, r, run, bench_id)
                done += 1
                bar.update(1)
            if "ar" in item_records:
                ref = item_records["ar"].token_ids
                for r in item_records.values():
                    r.identical_to_ar = r.token_ids == ref
            records.extend(item_records[m] for m in methods if m in item_records)
            results.update(_assemble(records, methods, divergences, token_text, "running"))
            _write_json(out / "results.json", results)
            (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        bar.close()
        results.update(_assemble(records, methods, divergences, token_text, status))
        results["meta"]["finished_at"] = _now()
        results["meta"]["loadavg_end"] = _loadavg()
        _write_json(out / "results.json", results)
        (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
        try:
            write_charts(results, out)
        except Exception as e:       # never lose the JSON and the table to a chart
            warnings.warn(f"bench charts not written: {e!r}")
        for m, mem in memories.items():
            if not CSDConfig(method=m).use_ocm:
                continue            # the other methods never read their memory
            mem.save(out / f"memory_{m}.json.gz")
            if store is not None and memory_mode == "online":
                store.save_memory(mem, label=f"bench {bench_id} {m} memory after {len(items)} items")
        if progress:
            progress(f"bench {results['status']}", 1.0)
    return results


def _record(store, pair, cfg: CSDConfig, method: str, item: Item, r: ItemResult, run, bench_id: str) -> None:
    """Write one generation to the store (after its timing, so the store never slows a method)."""
    fields = dict(kind="bench", **pair.run_fields(), method=method, temperature=0.0, max_new_tokens=cfg.max_new_tokens,
                  prompt=item.prompt, label=f"bench {bench_id} {item.dataset} {item.item_id}"[:200])
    if method != HF_ASSISTED and cfg.uses_draft:
        fields.update(gamma=cfg.gamma, lam=cfg.lam, tau=cfg.tau)
    run_id = store.start_run(**fields)
    if run is None:
        metrics = {"new_tokens": r.new_tokens, "target_forwards": r.target_passes, "draft_forwards": r.draft_passes,
                   "wall_s": r.wall_s, "mean_accepted_length": r.mean_accepted_length, "stopped_by": r.stopped_by,
                   "correct": r.correct}
        store.finish_run(run_id, r.text, metrics)
        return
    rec = store.recorder(run_id)
    for ev in run.events:
        rec.add(ev)
    metrics = run.metrics.to_dict()
    metrics.update(bench_wall_s=r.wall_s, correct=r.correct)
    rec.finish(output_text=r.text, metrics=metrics)


# -- summaries ---------------------------------------------------------------------------------
def summarize(records: list[ItemResult], methods: list[str]) -> dict:
    """Per dataset (and "all"), per method, over the items that every method finished."""
    by_item: dict[tuple, dict[str, ItemResult]] = {}
    for r in records:
        by_item.setdefault((r.dataset, r.item_id), {})[r.method] = r
    complete = {k: v for k, v in by_item.items() if all(m in v for m in methods)}
    datasets = list(dict.fromkeys(k[0] for k in complete))
    out = {}
    for ds in datasets + (["all"] if len(datasets) > 1 else []):
        keys = [k for k in complete if ds == "all" or k[0] == ds]
        out[ds] = {m: _method_stats([complete[k] for k in keys], m) for m in methods}
    return out


def _method_stats(rows: list[dict[str, ItemResult]], m: str) -> dict:
    rs = [row[m] for row in rows]
    n = len(rs)
    wall = sum(r.wall_s for r in rs)
    tokens = sum(r.new_tokens for r in rs)
    tp = None if any(r.target_passes is None for r in rs) else sum(r.target_passes for r in rs)
    drafted = None if any(r.drafted is None for r in rs) else sum(r.drafted for r in rs)
    kept = None if drafted is None else sum((r.accepted or 0) + (r.rescued or 0) for r in rs)
    graded = [r for r in rs if r.correct is not None]
    s = {
        "n": n, "wall_s": wall, "new_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
        "target_passes": tp, "target_passes_per_token": tp / tokens if tp is not None and tokens else None,
        "mean_accepted_length": tokens / tp if tp else None,
        "drafted": drafted, "acceptance_rate": kept / drafted if drafted else None,
        "rescued": None if drafted is None else sum(r.rescued or 0 for r in rs),
        "n_graded": len(graded), "n_correct": sum(bool(r.correct) for r in graded),
        "accuracy": sum(bool(r.correct) for r in graded) / len(graded) if graded else None,
        "bookkeeping_share": (sum(r.bookkeeping_s for r in rs) / wall
                              if wall > 0 and all(r.bookkeeping_s is not None for r in rs) else None),
        "identical_to_ar": sum(bool(r.identical_to_ar) for r in rs) if rs and rs[0].identical_to_ar is not None else None,
    }
    if rows and "ar" in rows[0]:
        ar = [row["ar"] for row in rows]
        ar_wall = sum(r.wall_s for r in ar)
        s["speedup_wall"] = ar_wall / wall if wall > 0 else None
        ratios = [r.tokens_per_s / a.tokens_per_s for r, a in zip(rs, ar) if a.tokens_per_s > 0]
        s["speedup_tps_mean"] = statistics.fmean(ratios) if ratios else None
        both = [(row[m].correct, row["ar"].correct) for row in rows
                if row[m].correct is not None and row["ar"].correct is not None]
        s["accuracy_vs_ar"] = {"n": len(both), "gained": sum(1 for x, a in both if x and not a),
                               "lost": sum(1 for x, a in both if a and not x),
                               "diff": (sum(bool(x) for x, _ in both) - sum(bool(a) for _, a in both)) / len(both)
                               if both else None}
    if rows and "sd" in rows[0] and tp is not None:
        sd_tp = sum(row["sd"].target_passes for row in rows)
        s["target_passes_vs_sd"] = tp / sd_tp if sd_tp else None
    if rows and HF_ASSISTED in rows[0]:
        hf_wall = sum(row[HF_ASSISTED].wall_s for row in rows)
        s["speedup_over_hf"] = hf_wall / wall if wall > 0 else None
    return s


def pareto(counts: Counter) -> dict:
    """The divergence patterns' Pareto curve: cumulative share of divergences covered by the top
    patterns, and the share covered by the top 20% (the paper reports about 69%)."""
    values = sorted(counts.values(), reverse=True)
    total = sum(values)
    if not total:
        return {"patterns": 0, "divergences": 0, "top20_share": None, "cumulative": []}
    cum, acc = [], 0
    for v in values:
        acc += v
        cum.append(acc / total)
    k = max(1, round(len(values) * 0.2))
    return {"patterns": len(values), "divergences": total, "top20_patterns": k, "top20_share": cum[k - 1],
            "cumulative": cum}


def _assemble(records, methods, divergences: dict[str, Counter], token_text: dict, status: str) -> dict:
    div = {}
    for m, counts in divergences.items():
        p = pareto(counts)
        p["top"] = [{"draft_id": d, "target_id": t, "draft_text": token_text.get(d, ""),
                     "target_text": token_text.get(t, ""), "count": c}
                    for (d, t), c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50]]
        div[m] = p
    summary = summarize(records, methods)
    return {"status": status, "items": [r.to_dict() for r in records], "summary": summary,
            "targets": check_targets(summary.get("all") or (next(iter(summary.values())) if summary else {})),
            "divergences": div}


def check_targets(stats: dict) -> dict:
    """Issue 5's figures over the mix: value, threshold and whether it is met (None: not measured)."""
    def get(m, k):
        return (stats.get(m) or {}).get(k)

    def t(value, threshold, higher=True):
        return {"value": value, "threshold": threshold,
                "met": None if value is None else (value >= threshold if higher else value <= threshold)}

    csd_hf, sd_hf = get("csd", "speedup_over_hf"), get("sd", "speedup_over_hf")
    out = {"csd_over_ar": t(get("csd", "speedup_wall"), TARGETS["csd_over_ar"]),
           "csd_over_hf": t(csd_hf, TARGETS["csd_over_hf"]),
           "sd_over_hf": t(sd_hf, TARGETS["sd_over_hf"]),
           "csd_passes_vs_sd": t(get("csd", "target_passes_vs_sd"), TARGETS["csd_passes_vs_sd"], higher=False),
           "csd_bookkeeping_share": t(get("csd", "bookkeeping_share"), TARGETS["bookkeeping_share"], higher=False),
           "csd_accuracy_vs_ar": get("csd", "accuracy_vs_ar")}
    return out


# -- outputs -------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meta(pair, setup: BenchSetup, memory, bench_id: str) -> dict:
    import torch
    import transformers

    return {
        "bench_id": bench_id, "command": setup.command, "started_at": _now(),
        "machine": {"platform": platform.platform(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "device": str(pair.device)},
        "loadavg_start": _loadavg(),
        "pair": {"pair_id": pair.pair_id, "draft": pair.draft_name, "target": pair.target_name},
        "dtype": pair.target_repr,
        "models": pair.describe(),
        "draft_dtype": pair.draft_dtype,
        "config": {"datasets": setup.datasets, "limit": setup.limit, "methods": setup.methods,
                   "max_new_tokens": setup.max_new_tokens, "seed": setup.seed, "gamma": setup.gamma,
                   "lam": setup.lam, "tau": setup.tau, "temperature": 0.0, "chat": True,
                   "memory_mode": setup.memory_mode, "warmup_tokens": WARMUP_TOKENS,
                   "method_order": "rotated by one per item",
                   "hf_assisted": "target.generate(assistant_model=draft, do_sample=False), transformers' "
                                  "default draft length schedule; passes counted by forward hooks"},
        "memory": {"patterns": len(memory), "total": memory.total, "candidates_at_lambda": memory.n_candidates(setup.lam),
                   "top20_share": memory.top_share(0.2), "calibration": memory.meta.get("calibration")},
    }


def _write_json(path: Path, data: dict) -> None:
    """Atomic: a killed process leaves the previous file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
