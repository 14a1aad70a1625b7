"""Benchmark harness: every column (``csd.bench.methods``) on the same items, measured the way the CSD
paper measures (arXiv 2604.13634: greedy, batch 1, speed-up over AR). How it keeps the comparison fair,
its memory modes and its outputs: docs/benchmarks.md, "How the benchmark measures"."""
from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import zip_longest
from pathlib import Path

from csd.config import CSDConfig
from csd.evaluation.datasets import Item, item_range, load_dataset, validate_datasets
from csd.evaluation.graders import grade

from .io import Progress, machine, now, write_json
from .methods import DEFAULT_METHODS, Method, make_methods
from .report import render_markdown, write_charts
from .results import ItemResult, assemble, mark_where_answers_leave_sd, median_bound

log = logging.getLogger(__name__)

MEMORY_MODES = ("online", "fresh")
WARMUP_PROMPT = "Write one sentence about the sea, then a Python one-liner that adds two numbers."
WARMUP_TOKENS = 8


def measure(pair, decoder, method: Method, prompt_ids: list[int], memory) -> tuple[ItemResult, object]:
    """One method on one prompt, timed around the whole generation: its figures (dataset and item left
    empty) and the engine's run (None for hf)."""
    cfg = method.cfg
    if method.hf is not None:
        fixed = (cfg.gamma if cfg.gamma != "auto" else 6) if method.hf == "fixed" else None
        ids, wall, tp, dp = generate_hf(pair, prompt_ids, cfg.max_new_tokens, fixed_gamma=fixed,
                                        assisted=method.hf != "generate")
        stopped = "eos" if ids and ids[-1] in pair.eos_ids else "max_new_tokens"
        return ItemResult("", "", method.name, 0, wall, len(ids), tp, dp, stopped_by=stopped, token_ids=ids,
                          text=pair.tokenizer.decode(ids, skip_special_tokens=True),
                          prompt_tokens=len(prompt_ids)), None
    t0 = time.perf_counter()
    run = decoder.run(prompt_ids, cfg, memory)
    for _ in run:
        pass
    wall = time.perf_counter() - t0
    mt = run.metrics
    drafts = (mt.drafted, mt.accepted, mt.rescued + mt.relaxed, mt.divergences) if cfg.uses_draft else (None,) * 4
    copies = {"lookup_blocks": mt.lookup_blocks, "lookup_drafted": mt.lookup_drafted, "lookup_kept": mt.lookup_kept}
    return ItemResult("", "", method.name, 0, wall, mt.new_tokens, mt.target_forwards, mt.draft_forwards, *drafts,
                      mt.bookkeeping_s, mt.policy_s, mt.wall_s, mt.stopped_by, text=run.text,
                      token_ids=list(run.token_ids), prefill_s=mt.prefill_s, prompt_tokens=len(prompt_ids),
                      **(copies if cfg.lookup else {})), run


def generate_hf(pair, prompt_ids: list[int], max_new_tokens: int, fixed_gamma: int | None = None,
                assisted: bool = True) -> tuple[list[int], float, int, int]:
    """transformers' greedy assisted generation at its defaults, or with ``fixed_gamma`` draft tokens per
    round (constant schedule, no confidence threshold); ``assisted=False``: its plain generate on the
    target alone. Returns (new ids, wall s, target passes, draft passes), passes counted by hooks."""
    import torch

    passes = Counter()                   # forward passes by model
    target, draft = pair.hf_target(), (pair.hf_draft() if assisted else None)   # built on first use
    x = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else pair.eos_ids[0]
    gc = draft.generation_config if assisted else target.generation_config
    saved = {k: getattr(gc, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                                                "assistant_confidence_threshold")}
    if fixed_gamma is not None and assisted:
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = fixed_gamma, "constant"
        gc.assistant_confidence_threshold = 0.0
    hooks = [lm.register_forward_hook(lambda *_, name=name: passes.update((name,)))
             for name, lm in (("target", target), ("draft", draft)) if lm is not None]
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(input_ids=x, attention_mask=torch.ones_like(x),
                                  **({"assistant_model": draft} if assisted else {}),
                                  do_sample=False, max_new_tokens=max_new_tokens,
                                  eos_token_id=list(pair.eos_ids), pad_token_id=pad)
        wall = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
        if fixed_gamma is not None and assisted:   # the defaults' own state (its heuristic schedule) is left as it was
            for k, v in saved.items():
                setattr(gc, k, v)
    new = out[0, len(prompt_ids):].tolist()
    new = new[:next((i + 1 for i, t in enumerate(new) if t in pair.eos_ids), len(new))]   # cut after the first EOS
    return new, wall, passes["target"], passes["draft"]


# -- the harness -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    """What a benchmark run measures and where it writes it (``python -m csd bench`` builds it from its flags)."""
    dataset: str | tuple[str, ...]      # "gsm8k,humaneval:40" or a list: built-in names or files
                                        # (csd.evaluation.datasets)
    limit: int | None                   # items per dataset (a spec's own count wins), drawn by seed; None: all
    methods: str | tuple[str, ...] = DEFAULT_METHODS  # the columns, "ar,sd,csd" or a list (csd.bench.methods)
    max_new_tokens: int = 128           # the longest answer, in new tokens
    out_dir: str | os.PathLike = "bench-results"  # where the outputs are written
    seed: int = 0                       # fixes the items drawn from each dataset
    gamma: int | str = 6                # draft block length of the drafting columns, or "auto" (the profile's policy)
    lam: float = 6                      # memory threshold lambda of the csd column
    tau: float = 0.01                   # gate threshold tau of the csd column
    sweep: str | tuple | None = None    # more settings, one column each: "lam=3,tau=0.1;gamma=auto" (parse_sweep)
    memory_mode: str = "online"         # online: a column's memory evolves over the items; fresh: new per item
    warmup: bool = True                 # one short untimed generation per column before the items
    show_bar: bool = True               # a tqdm progress bar on stderr
    command: str = ""                   # the command as typed, for the record ("": the Python API)
    gamma_max: int = 16                 # the longest block gamma auto may draft
    lookup: int = 0                     # copies from the context in the drafting columns (0: the paper's methods)
    bound_checks: int = 2               # gamma auto: profiles re-measured beside the run, 1 before the items
    rivals: dict = field(default_factory=dict)   # the rival columns' parameters (csd.config.RIVAL_PARAMS fields)

    def datasets(self) -> list[str]:
        """The dataset specs, checked (ValueError names an unknown one)."""
        return validate_datasets(self.dataset)

    def engine(self) -> CSDConfig:
        """The csd column's engine config, which every other column varies (ValueError when invalid)."""
        if self.memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {', '.join(MEMORY_MODES)}, got {self.memory_mode!r}")
        return CSDConfig.of(method="csd", gamma=self.gamma, gamma_max=self.gamma_max, lam=self.lam, tau=self.tau,
                            max_new_tokens=self.max_new_tokens, lookup=self.lookup, **self.rivals).validated()

    def columns(self) -> list[Method]:
        """The run's columns: the methods, then one per sweep setting (ValueError when invalid)."""
        return make_methods(self.methods, self.engine(), self.sweep)


def run_bench(pair, config: BenchConfig, *, store=None, memory=None, costs=None,
              progress: Progress | None = None) -> dict:
    """Run ``config``'s columns on its items, write the outputs and return the results. ``store``: record
    every generation there; ``memory``: the start memory (the pair's); ``costs``: gamma auto's profile (the
    pair's). An interrupt keeps the finished items in the outputs and propagates."""
    from csd.runtime.profile import decoder as measured_decoder

    cols = config.columns()
    if pair.draft_lm is None and any(m.cfg.uses_draft or m.hf not in (None, "generate") for m in cols):
        raise ValueError("methods other than 'ar' need a draft model, and none is loaded")
    if any(m.acts for m in cols) and (pair.rep.target != "int8" or not pair.rep.activations):
        raise ValueError("a column's activations=row|pass needs an int8 target on the lean path (--dtype int8)")
    items = interleaved_items(config.datasets(), config.limit, config.seed)
    prompts = {(it.dataset, it.item_id): pair.encode_prompt(it.prompt, chat=True) for it in items}
    base = config.engine()
    for ids in prompts.values():
        base.validated(pair.context_limit, len(ids))
    decoder = measured_decoder(pair, costs)
    if config.gamma == "auto":
        _ = decoder.costs                  # measure (or read) the profile before any timing
    start_memory = memory if memory is not None else decoder.default_memory()
    return _Run(pair, config, decoder, cols, start_memory, store, progress).over(items, prompts)


def interleaved_items(datasets: list[str], limit: int | None, seed: int) -> list[Item]:
    """Each dataset spec's items, the datasets taking turns, so that a run stopped early stays balanced."""
    ranges = [item_range(d, limit) for d in datasets]
    per_dataset = [load_dataset(name, stop, seed)[skip:] for name, skip, stop in ranges]
    return [it for turn in zip_longest(*per_dataset) for it in turn if it is not None]


class _Run:
    """One run as it goes: each memory column's memory, the records, the divergences and the results."""

    def __init__(self, pair, config: BenchConfig, decoder, cols: list[Method], start_memory, store,
                 progress: Progress | None):
        self.pair, self.config, self.decoder, self.cols = pair, config, decoder, cols
        self.store, self.progress, self.start_memory = store, progress, start_memory
        self.memories = {m.name: start_memory.copy() for m in cols if m.reads_memory}
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.bench_id = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.results = {"meta": _meta(pair, decoder, config, cols, start_memory, self.bench_id),
                        "items": [], "status": "running"}
        self.records: list[ItemResult] = []
        self.divergences: dict[str, Counter] = {m.name: Counter() for m in cols if m.cfg.uses_draft and not m.hf}
        self.token_text: dict[int, str] = {}
        self.bar, self.done, self.total = None, 0, 0
        self.acts = pair.rep.activations         # the run's representation; a column may name its own

    def _represent(self, m: Method | None) -> None:
        """The target in ``m``'s int8 activation scales, or the run's (``m`` None)."""
        want = (m.acts if m else "") or self.acts
        if want and self.pair.rep.activations != want:
            self.pair.set_activations(want)

    def over(self, items: list[Item], prompts: dict[tuple, list[int]]) -> dict:
        """Warm up, check the profile, run every column on every item, write the outputs; the results."""
        from tqdm.auto import tqdm

        checks, status = self.config.bound_checks, "failed"
        self.total = len(items) * len(self.cols)
        self.bar = tqdm(total=self.total, desc="bench", unit="gen", disable=not self.config.show_bar,
                        dynamic_ncols=True)
        try:
            if self.config.warmup:
                self._warm_up()
            if checks > 0:
                self._check_profile()
            for k, it in enumerate(items):
                self._item(k, it, prompts[(it.dataset, it.item_id)])
                self._assemble("running")
                write_json(self.out / "results.json", self.results)
                (self.out / "results.md").write_text(render_markdown(self.results), encoding="utf-8")
            for _ in range(checks - 1):
                self._check_profile()
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.bar.close()
            self._represent(None)
            self._finish(status, len(items))
        return self.results

    def _say(self, message: str, fraction: float) -> None:
        self.bar.set_postfix_str(message.replace(": ", " "))
        if self.progress:
            self.progress(message, fraction)

    def _warm_up(self) -> None:
        """One short generation per column (the warm-up never teaches a memory)."""
        warm_ids = self.pair.encode_prompt(WARMUP_PROMPT, chat=True)
        for m in self.cols:
            self._say(f"warm-up: {m.name}", 0.0)
            mem = self.memories[m.name].copy() if m.name in self.memories else None
            warm = replace(m, cfg=replace(m.cfg, max_new_tokens=WARMUP_TOKENS))
            self._represent(m)
            measure(self.pair, self.decoder, warm, warm_ids, mem)

    def _item(self, k: int, it: Item, prompt_ids: list[int]) -> None:
        """Every column on the k-th item, in the k-th rotated order; its records paired up."""
        item_records: dict[str, ItemResult] = {}
        k %= len(self.cols)
        for j, m in enumerate(self.cols[k:] + self.cols[:k]):
            self._say(f"{it.dataset} {it.item_id}: {m.name}", self.done / self.total)
            self._represent(m)
            mem = self.memories.get(m.name)           # the column's own (online) or a fresh copy; None without one
            if mem is not None and self.config.memory_mode != "online":
                mem = self.start_memory.copy()
            r, run = measure(self.pair, self.decoder, m, prompt_ids, mem)
            r.dataset, r.item_id, r.order = it.dataset, it.item_id, j
            if run is not None and m.name in self.divergences:
                for ev in (ev for ev in run.events if ev.is_divergence):
                    self.divergences[m.name][(ev.draft_id, ev.target_id)] += 1
                    self.token_text.setdefault(ev.draft_id, ev.draft_text or "")
                    self.token_text.setdefault(ev.target_id, ev.target_text or "")
            g = grade(it, r.text)
            r.correct, r.predicted, r.grade_detail = g.correct, g.predicted, g.detail
            item_records[m.name] = r
            if self.store is not None:
                _record(self.store, self.pair, m, it, r, run, self.bench_id, self.start_memory.policy.label)
            self.done += 1
            self.bar.update(1)
        for ref in ("ar", "sd"):
            if ref in item_records:
                ids = item_records[ref].token_ids
                for r in item_records.values():
                    setattr(r, f"identical_to_{ref}", r.token_ids == ids)
        mark_where_answers_leave_sd(item_records, self.pair.tokenizer.decode)
        self.records.extend(item_records[m.name] for m in self.cols if m.name in item_records)

    def _check_profile(self) -> None:
        """Re-measure the profile beside the run (not cached, not used by the policy) into
        ``meta.profile_checks``: on a shared machine one profile's draft time can be off by 1.5x."""
        if not self.decoder.has_costs:
            return
        self._represent(None)
        from csd.runtime.profile import measure as measure_costs
        costs = measure_costs(self.pair, progress=self.progress)
        self.results["meta"].setdefault("profile_checks", []).append(_profile_record(costs))

    def _assemble(self, status: str) -> None:
        self.results.update(assemble(self.records, [m.name for m in self.cols], self.divergences, self.token_text,
                                     status, median_bound(self.results)))

    def _finish(self, status: str, n_items: int) -> None:
        """The outputs of a run that ended (finished, interrupted or failed): every file, every memory."""
        results, out = self.results, self.out
        self._assemble(status)
        results["meta"]["finished_at"] = now()
        results["meta"]["loadavg_end"] = _loadavg()
        write_json(out / "results.json", results)
        keep = ("command", "started_at", "machine", "dtype", "representation", "models", "config")
        write_json(out / "frontier.json", {"meta": {k: results["meta"].get(k) for k in keep},
                                           "status": results["status"], "points": results.get("frontier", [])})
        (out / "results.md").write_text(render_markdown(results), encoding="utf-8")
        try:
            write_charts(results, out)
        except (ImportError, ValueError, KeyError, OSError) as e:       # never lose the JSON and the table to a chart
            log.exception("bench charts not written: %s", e)
        for name, mem in self.memories.items():
            mem.save(out / f"memory_{re.sub(r'[^A-Za-z0-9_.=-]+', '_', name).strip('_')}.json.gz")
            if self.store is not None and self.config.memory_mode == "online":
                self.store.save_memory(mem, label=f"bench {self.bench_id} {name} memory after {n_items} items")
        if self.progress:
            self.progress(f"bench {results['status']}", 1.0)


def _record(store, pair, m: Method, item: Item, r: ItemResult, run, bench_id: str, policy: str) -> None:
    """Write one generation to the store (after its timing, so the store never slows a method)."""
    from csd.db.store import run_fields

    fields = run_fields(pair, kind="bench", method=m.name[:32], temperature=0.0,
                        max_new_tokens=m.cfg.max_new_tokens, prompt=item.prompt,
                        label=f"bench {bench_id} {item.dataset} {item.item_id}"[:200])
    if m.hf is None and m.cfg.uses_draft:
        fields.update({k: v for k, v in m.cfg.run_fields().items()
                       if k in ("gamma", "lam", "tau", "lookup", "rule_params")})
    if m.reads_memory:
        fields["memory_policy"] = policy
    with store.record(**fields) as rec:
        if run is None:
            rec.result(r.text, {"new_tokens": r.new_tokens, "target_forwards": r.target_passes,
                                "draft_forwards": r.draft_passes, "wall_s": r.wall_s,
                                "mean_accepted_length": r.mean_accepted_length, "stopped_by": r.stopped_by,
                                "correct": r.correct})
            return
        for ev in run.events:
            rec.add(ev)
        rec.result(r.text, {**run.metrics.to_dict(), "bench_wall_s": r.wall_s, "correct": r.correct})


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


def _meta(pair, decoder, config: BenchConfig, cols: list[Method], memory, bench_id: str) -> dict:
    from csd.evaluation.sandbox import SandboxError, isolation
    try:
        iso = isolation()
    except SandboxError as e:
        iso = f"unavailable: {e}"
    costs = _profile_record(decoder.costs) if decoder.has_costs else None
    base = config.engine()
    return {
        "bench_id": bench_id, "command": config.command, "started_at": now(), "machine": machine(pair.device),
        "loadavg_start": _loadavg(),
        "pair": {"pair_id": pair.pair_id, "draft": pair.draft_name, "target": pair.target_name},
        "dtype": pair.rep.target, "representation": pair.rep.as_dict(), "models": pair.describe(),
        "profile": costs, "humaneval_isolation": iso,
        "config": {"datasets": config.datasets(), "limit": config.limit, "methods": [m.name for m in cols],
                   "settings": {m.name: {"method": m.cfg.method, "gamma": m.cfg.gamma, "lam": m.cfg.lam,
                                         "tau": m.cfg.tau, "lookup": m.cfg.lookup, "hf": m.hf,
                                         **({"activations": m.acts} if m.acts else {}),
                                         **({} if m.hf else m.cfg.rule_params() or {})} for m in cols},
                   "max_new_tokens": base.max_new_tokens, "seed": config.seed, "gamma": base.gamma,
                   "lookup": base.lookup, "lam": base.lam, "tau": base.tau, "temperature": 0.0, "chat": True,
                   "memory_mode": config.memory_mode, "warmup_tokens": WARMUP_TOKENS,
                   "method_order": "rotated by one per item",
                   "hf_assisted": "target.generate(assistant_model=draft, do_sample=False) at transformers' defaults "
                                  "(heuristic draft length, confidence threshold); passes counted by forward hooks",
                   "hf_assisted_fixed": "the same with num_assistant_tokens = gamma, constant schedule, "
                                        "assistant_confidence_threshold 0"},
        "memory": {"patterns": len(memory), "total": memory.total,
                   "candidates_at_lambda": memory.n_candidates(base.lam),
                   "top20_share": memory.top_share(0.2), "calibration": memory.meta.get("calibration"),
                   "policy": memory.policy.to_dict()},
    }
