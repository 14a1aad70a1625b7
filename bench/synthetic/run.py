"""The synthetic benchmark's runs: build the random pair, check greedy SD == AR, time the target's
passes, then run AR, SD and CSD on random prompts, each until it follows its script (docs/gpu.md)."""
from __future__ import annotations

import gc
import os
import resource
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from csd.config import GAMMA_RANGE, CSDConfig
from csd.representation import Representation
from csd.runtime.profile import CONTEXT, PASS_LENGTHS
from csd.runtime.static import ENGINES

from ..io import machine, now, write_json
from .models import ARCHS, ATTN_LOGIT_STD, LOGIT_STD, PAIR_CHOICES, PAIRS, build_model, make_pair
from .report import Measured, output_stats, render_markdown, summarize

METHODS = ("ar", "sd", "csd")


@dataclass(frozen=True)
class SyntheticConfig:
    pair: str = "auto"               # tiny, 1.5b or 7b (PAIRS); auto: 1.5b on CUDA, tiny on the CPU
    acceptance: float = 0.8          # probability that the draft proposes the target's own next token
    prompts: int = 10                # random prompts, each run by every method
    prompt_tokens: int = 32          # tokens per random prompt
    max_new_tokens: int = 128
    gamma: int | str = 6             # draft block length (paper default 6), or "auto"
    gamma_max: int = 16              # the longest block "auto" may draft
    lam: float = 6                   # CSD memory threshold (paper default)
    tau: float = 0.01                # CSD gate threshold (paper default)
    memory_mode: str = "online"      # online: CSD's memory evolves over the prompts; fresh: new per prompt
    seed: int = 0                    # weights, prompts and coins all follow from it
    device: str = "auto"             # auto: CUDA if available
    dtype: str = "auto"              # the target's representation; auto: bfloat16 on CUDA, float32 on the CPU
    draft_weights: str = "auto"        # auto / same: the target's (int8 on the CPU when the target is int8)
    draft_impl: str = "auto"         # lean (auto) or hf
    engine: str = "auto"             # static (fixed shapes, CUDA graphs), eager, or auto: static on CUDA
                                     # (csd.runtime.static)
    pass_lengths: tuple[int, ...] = PASS_LENGTHS   # tokens per target pass in the verify-time table
    reps: int = 3                    # timed repetitions per pass length (median)
    warmup: bool = True              # one short untimed generation per method first
    rehearsals: int = 16             # untimed reruns allowed per method and prompt to reach the script's fixed point
    repeats: int = 1                 # timed runs of each counted run (the same path); the fastest counts
    check_tokens: int = 32           # length of the float32 SD == AR check when the timed runs are not float32
    check_prompts: int = 1           # prompts of that check
    threads: int | None = None       # CPU intra-op threads; None: torch's default, but 1 for the tiny pair

    def validated(self) -> SyntheticConfig:
        if self.pair not in PAIR_CHOICES:
            raise ValueError(f"unknown synthetic config {self.pair!r}; choose {', '.join(PAIR_CHOICES)}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"--acceptance must be in [0, 1], got {self.acceptance}")
        if self.prompts < 1 or self.prompt_tokens < 2 or self.max_new_tokens < 1:
            raise ValueError("--limit must be >= 1, --prompt-tokens >= 2 and --max-new-tokens >= 1 with --synthetic")
        if not self.pass_lengths or any(k < 1 for k in self.pass_lengths):
            raise ValueError("--pass-lengths must be positive whole numbers")
        if self.gamma == "auto" and len(set(self.pass_lengths)) < 2:
            raise ValueError("gamma auto needs at least two --pass-lengths to interpolate the target's cost")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose {', '.join(ENGINES)}")
        if self.memory_mode not in ("online", "fresh"):
            raise ValueError(f"memory mode must be online or fresh, got {self.memory_mode!r}")
        if self.rehearsals < 0 or self.check_tokens < 1 or self.check_prompts < 0:
            raise ValueError("--rehearsals must be >= 0")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or not 1 <= self.repeats <= 20:
            raise ValueError(f"--repeats must be a whole number in 1..20, got {self.repeats!r}")
        self.engine_config("csd").validated()
        return self

    def engine_config(self, method: str) -> CSDConfig:
        return CSDConfig(method=method, gamma=self.gamma, gamma_max=self.gamma_max, lam=self.lam, tau=self.tau,
                         max_new_tokens=self.max_new_tokens)

    @property
    def fixed_gamma(self) -> int:
        """The block length of the SD == AR check (6 where gamma is auto)."""
        return self.gamma if self.gamma != "auto" else 6

    def coin_seed(self, k: int) -> int:      # of prompt k's coins
        return self.seed * 1_000_003 + k


def _script_of(prompt: list[int], run) -> tuple[list[int], list[int]]:
    """The path a run committed, and the target's top-1 at each of its new positions."""
    want = [e.target_id for e in run.events if e.in_output]
    return prompt + list(run.token_ids), [-1] * len(prompt) + want


def _coins(n: int, acceptance: float, seed: int) -> torch.Tensor:
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)) < acceptance


def _timed(pair, decoder, prompt: list[int], cfg: CSDConfig, memory):
    """(run, wall seconds, peak CUDA bytes or None), the wall time taken around the whole generation."""
    dev = pair.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    run = decoder.run(prompt, cfg, memory)
    for _ in run:
        pass
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    return run, wall, (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None)


def _measured(method: str, k: int, run, wall: float, peak) -> Measured:
    m = run.metrics
    return Measured(method, k, wall, m.new_tokens, m.target_forwards, m.draft_forwards, m.drafted,
                    sum(m.per_position_drafted), m.accepted, m.rescued, m.host_syncs, m.draft_s, m.verify_s,
                    m.bookkeeping_s, host_s=max(0.0, m.wall_s - m.prefill_s - m.draft_s - m.verify_s - m.transfer_s),
                    peak_bytes=peak, token_ids=list(run.token_ids))


def _fastest(pair, decoder, prompt: list[int], cfg: CSDConfig, memory, run, wall: float, repeats: int) -> float:
    """The fastest wall time of the counted run and ``repeats - 1`` reruns of the same path."""
    for _ in range(repeats - 1):
        again, w, _ = _timed(pair, decoder, prompt, cfg, memory.copy() if memory is not None else None)
        if list(again.token_ids) == list(run.token_ids):
            wall = min(wall, w)
    return wall


def scripted_run(decoder, prompt: list[int], cfg: CSDConfig, memory, script, coins, rehearsals: int,
                 repeats: int = 1):
    """Run until the run follows its script (docs/gpu.md): the counted run, its wall time (the fastest of
    ``repeats``) and peak, the memory it leaves, the attempts, whether it is a fixed point, its own script."""
    pair = decoder.pair
    for attempt in range(1, rehearsals + 2):
        pair.draft_lm.script(*script, coins)
        mem = memory.copy() if memory is not None else None
        run, wall, peak = _timed(pair, decoder, prompt, cfg, mem)
        own = _script_of(prompt, run)
        if own == script or attempt == rehearsals + 1:
            wall = _fastest(pair, decoder, prompt, cfg, memory, run, wall, repeats)
            return run, wall, peak, mem, attempt, own == script, own
        script = own
    raise AssertionError("unreachable")


def count_cuda_syncs(fn) -> int | None:
    """Synchronising CUDA calls made by ``fn()``, as torch's sync debug mode sees them (None off CUDA)."""
    if not torch.cuda.is_available():
        return None
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    return sum("synchronizing CUDA operation" in str(w.message) for w in caught)


def check_sd_equals_ar(pair, prompts: list[list[int]], tokens: int, gamma: int, acceptance: float, seed: int) -> dict:
    """Greedy SD against AR token for token on ``prompts`` (the pair as it is: call it in float32)."""
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory

    decoder = Decoder(pair)                    # fixed gamma: no cost model needed
    same, first_diff = 0, []
    for k, prompt in enumerate(prompts):
        ar, _, _ = _timed(pair, decoder, prompt, CSDConfig(method="ar", max_new_tokens=tokens), None)
        pair.draft_lm.script(*_script_of(prompt, ar), _coins(len(prompt) + tokens + 64, acceptance, seed + k))
        sd, _, _ = _timed(pair, decoder, prompt, CSDConfig(method="sd", gamma=gamma, max_new_tokens=tokens),
                          CorrectionMemory(pair.pair_id))
        same += sd.token_ids == ar.token_ids
        first_diff.append(next((i for i, (a, b) in enumerate(zip(ar.token_ids, sd.token_ids)) if a != b), None))
    pair.draft_lm.script(None)
    return {"dtype": pair.rep.target, "prompts": len(prompts), "tokens": tokens, "gamma": gamma,
            "identical": same, "passed": same == len(prompts), "first_difference": first_diff}


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed)).tolist()


def _reprs(cfg: SyntheticConfig, device: torch.device) -> tuple[str, str]:
    from csd.runtime.models import DRAFT_DTYPES, check_repr
    from csd.runtime.pair import ModelLoadError

    target = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    target = check_repr(target, device)
    if cfg.draft_weights not in DRAFT_DTYPES:
        raise ModelLoadError(f"unknown draft dtype {cfg.draft_weights!r}; choose {', '.join(DRAFT_DTYPES)}")
    draft = target if cfg.draft_weights in ("auto", "same") else cfg.draft_weights
    if draft == "int8" and device.type != "cpu":
        raise ModelLoadError("draft dtype int8 (dynamic quantisation) runs on the CPU only")
    return target, draft


def run_synthetic(cfg: SyntheticConfig, out_dir: str | os.PathLike | None = "bench-results", command: str = "",
                  log=None) -> dict:
    """The synthetic benchmark; writes results.json and results.md to ``out_dir`` (None: nothing).
    ``log``: a callable for progress lines (None: silent)."""
    from csd.runtime.models import resolve_device

    cfg.validated()
    device = resolve_device(cfg.device)
    name = cfg.pair if cfg.pair != "auto" else ("1.5b" if device.type == "cuda" else "tiny")
    threads = cfg.threads or (1 if name == "tiny" and device.type == "cpu" else None)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(replace(cfg, pair=name), device, out_dir, command, log)
    finally:
        torch.set_num_threads(before)


def _check_in_float32(cfg: SyntheticConfig, models: tuple, device: torch.device, static: tuple[str, int],
                      prompts: list[list[int]]) -> dict:
    """Greedy SD == AR on the first prompts, the two models (draft, target) in float32 before their conversion."""
    engine, room = static
    ref_engine = "static" if engine == "compiled" else engine      # one compile per model is enough
    ref = make_pair(cfg.pair, *models, device, ("float32", "float32"), cfg.draft_impl, (ref_engine, room))
    check = check_sd_equals_ar(ref, prompts[:cfg.check_prompts], min(cfg.check_tokens, cfg.max_new_tokens),
                               cfg.fixed_gamma, cfg.acceptance, cfg.coin_seed(0))
    check["engine"] = ref_engine
    del ref
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return check


def _run(cfg: SyntheticConfig, device: torch.device, out_dir, command: str, log) -> dict:
    """1. build the random models; 2. check SD == AR in float32, convert them; 3. time the target's passes;
    4. run every method on every prompt; 5. count CUDA synchronisations; 6. write the figures."""
    from csd.decode import Decoder
    from csd.runtime.profile import measure

    say = log or (lambda _msg: None)
    target_rep, draft_rep = _reprs(cfg, device)
    d_arch, t_arch = (ARCHS[a] for a in PAIRS[cfg.pair])
    if d_arch["vocab_size"] != t_arch["vocab_size"]:
        raise ValueError("the draft and target architectures must share a vocabulary")
    if cfg.prompt_tokens + cfg.max_new_tokens > t_arch["max_position_embeddings"]:
        raise ValueError("--prompt-tokens + --max-new-tokens exceed the architecture's context")
    engine = cfg.engine if cfg.engine != "auto" else ("static" if device.type == "cuda" else "eager")
    room = max(cfg.prompt_tokens + cfg.max_new_tokens + 2 * (GAMMA_RANGE[1] + 2), CONTEXT + max(cfg.pass_lengths) + 1)
    static = (engine, room)      # a static cache: the run with a block to spare, or the timed passes
    started, t_start = now(), time.perf_counter()
    prompts = _random_prompts(cfg.prompts, cfg.prompt_tokens, t_arch["vocab_size"], cfg.seed)

    say(f"building random {cfg.pair} models on {device} (seed {cfg.seed})")                      # 1.
    draft_model, target_model = build_model(d_arch, device, cfg.seed), build_model(t_arch, device, cfg.seed + 1)
    build_s = time.perf_counter() - t_start
    check = None
    if target_rep != "float32" and cfg.check_prompts > 0:                                       # 2.
        say("checking greedy SD == AR in float32")
        check = _check_in_float32(cfg, (draft_model, target_model), device, static, prompts)
    pair = make_pair(cfg.pair, draft_model, target_model, device, (target_rep, draft_rep), cfg.draft_impl, static)
    del draft_model, target_model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    say(f"timing target passes of {', '.join(map(str, cfg.pass_lengths))} tokens")               # 3.
    costs = measure(pair, tuple(sorted(set(cfg.pass_lengths))), cfg.reps)
    table_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    decoder = Decoder(pair, costs=costs)
    records = bench_prompts(pair, decoder, cfg, prompts, say)                                    # 4.
    syncs = cuda_syncs(pair, decoder, cfg, prompts[0], say) if device.type == "cuda" else {}       # 5.

    if check is None:             # the timed runs are float32: they are the check                  6.
        sd = [r for r in records if r.method == "sd"]
        check = {"dtype": target_rep, "prompts": len(sd), "tokens": cfg.max_new_tokens, "gamma": cfg.fixed_gamma,
                 "identical": sum(bool(r.identical_to_ar) for r in sd), "source": "the timed runs",
                 "passed": all(r.identical_to_ar for r in sd) if target_rep == "float32" else None}
    results = _results(cfg, pair, records, costs, check, syncs, _peak_memory(device, records, table_peak),
                       {"command": command, "started_at": started, "build_s": build_s,
                        "wall_s": time.perf_counter() - t_start,
                        "representation": Representation(target_rep, draft_rep).as_dict()})
    if out_dir is not None:
        write_json(Path(out_dir) / "results.json", results)                  # makes the folder
        (Path(out_dir) / "results.md").write_text(render_markdown(results), encoding="utf-8")
    return results


def bench_prompts(pair, decoder, cfg: SyntheticConfig, prompts: list[list[int]], say) -> list[Measured]:
    """Warm up, then per prompt: AR first (its run writes the script), then SD and CSD, taking
    turns going first, each until it follows its script."""
    configs = {m: cfg.engine_config(m) for m in METHODS}
    start_memory = decoder.default_memory()                       # empty: nothing is known about random models
    memory = start_memory.copy()
    room = cfg.prompt_tokens + cfg.max_new_tokens + 64
    if cfg.warmup:
        say("warm-up")
        warm = _random_prompts(1, cfg.prompt_tokens, pair.draft_vocab_size, cfg.seed + 99)[0]
        # at full length: a short warm-up left the first prompt's AR run 3x slower on the H200 (docs/gpu.md)
        ar, _, _ = _timed(pair, decoder, warm, configs["ar"], None)
        for m in METHODS[1:]:
            scripted_run(decoder, warm, configs[m], start_memory.copy(),
                         _script_of(warm, ar), _coins(room, cfg.acceptance, cfg.seed + 99), 0)
    records: list[Measured] = []
    for k, prompt in enumerate(prompts):
        say(f"prompt {k + 1}/{len(prompts)}")
        run, wall, peak = _timed(pair, decoder, prompt, configs["ar"], None)
        wall = _fastest(pair, decoder, prompt, configs["ar"], None, run, wall, cfg.repeats)
        ar = _measured("ar", k, run, wall, peak)
        ar.identical_to_ar = True
        records.append(ar)
        script = _script_of(prompt, run)
        coins = _coins(room, cfg.acceptance, cfg.coin_seed(k))
        for m in (METHODS[1:] if k % 2 == 0 else METHODS[:0:-1]):
            online = m == "csd" and cfg.memory_mode == "online"
            run, wall, peak, mem_after, attempts, fixed, own = scripted_run(
                decoder, prompt, configs[m], memory if online else start_memory.copy(), script, coins,
                cfg.rehearsals, cfg.repeats)
            if online:
                memory = mem_after
            r = _measured(m, k, run, wall, peak)
            r.attempts, r.fixed_point, r.identical_to_ar = attempts, fixed, run.token_ids == ar.token_ids
            records.append(r)
            if fixed:
                script = own                                # the next method starts from a known fixed point
    pair.draft_lm.script(None)
    return records


def cuda_syncs(pair, decoder, cfg: SyntheticConfig, prompt: list[int], say) -> dict:
    """Per method, one untimed run on ``prompt`` under torch's sync debug mode."""
    from csd.memory import CorrectionMemory

    say("counting CUDA synchronisations")
    ar, _, _ = _timed(pair, decoder, prompt, cfg.engine_config("ar"), None)
    pair.draft_lm.script(*_script_of(prompt, ar), _coins(len(prompt) + cfg.max_new_tokens + 64, cfg.acceptance,
                                                         cfg.coin_seed(0)))
    out = {}
    for m in METHODS:
        holder = {}

        def go(m=m, holder=holder):
            holder["run"] = run = decoder.run(prompt, cfg.engine_config(m), CorrectionMemory(pair.pair_id))
            for _ in run:
                pass
        try:
            n = count_cuda_syncs(go)
            mt = holder["run"].metrics
            out[m] = {"cuda_syncs": n, "target_passes": mt.target_forwards,
                      "cuda_syncs_per_block": n / mt.target_forwards, "engine_host_syncs": mt.host_syncs}
        except Exception as e:       # a diagnostic: never lose the benchmark to it
            out[m] = {"error": f"{type(e).__name__}: {e}"}
    pair.draft_lm.script(None)
    return out


def _peak_memory(device: torch.device, records: list[Measured], table_peak: int | None) -> dict:
    if device.type == "cuda":
        kind, n = "cuda max_memory_allocated", max([table_peak or 0] + [r.peak_bytes or 0 for r in records])
    else:
        kind, n = "cpu peak RSS (ru_maxrss of this process)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"kind": kind, "bytes": n, "mib": n / 2**20}


def _results(cfg: SyntheticConfig, pair, records: list[Measured], costs, check: dict, syncs: dict, peak: dict,
             run_meta: dict) -> dict:
    d_name, t_name = PAIRS[cfg.pair]
    ar = [r for r in records if r.method == "ar"]
    return {
        "kind": "synthetic", "status": "finished",
        "meta": {**{k: run_meta[k] for k in ("command", "started_at", "build_s", "wall_s")},
                 "finished_at": now(),
                 "machine": machine(pair.device, "name"),
                 "config": {**asdict(cfg), "representation": run_meta["representation"]},
                 "archs": {"draft": {"name": d_name, **ARCHS[d_name]}, "target": {"name": t_name, **ARCHS[t_name]}},
                 "init": {"scheme": "fan-in: std 1/sqrt(fan_in); embeddings std 1; q, k: attention logits of std "
                                    f"{ATTN_LOGIT_STD}; lm_head: logits of std {LOGIT_STD}; norms 1, biases 0",
                          "draft_seed": cfg.seed, "target_seed": cfg.seed + 1},
                 "models": pair.describe()},
        "summary": {f"synthetic-{cfg.pair}": {m: summarize([r for r in records if r.method == m], ar)
                                              for m in METHODS}},
        "verify_ms": {str(k): v for k, v in sorted(costs.verify_ms.items())},
        "draft_ms": costs.draft_ms,
        "bound": {str(g): costs.bound(g) for g in sorted({1, 2, 4, 6, 8} | {cfg.fixed_gamma})},
        "sd_equals_ar": check,
        "syncs": syncs,
        "peak_memory": peak,
        "outputs": output_stats([r.token_ids for r in ar]),
        "items": [{k: v for k, v in asdict(r).items() if k != "token_ids"} for r in records],
    }
