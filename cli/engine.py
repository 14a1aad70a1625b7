"""``generate``, ``calibrate``, ``prepare`` and ``profile``: the engine on the command line, recording to the store."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from csd.config import (
    DEFAULT_LOOKUP,
    GAMMA,
    GAMMA_AUTO,
    GAMMA_MAX,
    LAM,
    LOOKUP,
    LOOKUP_NGRAM,
    MAX_NEW_TOKENS,
    METHODS,
    PRESETS,
    SEED,
    TAU,
    TEMPERATURE,
    ConfigError,
    CSDConfig,
    default_lookup,
)
from csd.rule import FLY, LOSSY, TOPK, TYPICAL

from .common import (
    add_memory_policy_args,
    add_model_args,
    add_rival_args,
    app_draft_weights,
    choose_draft,
    choose_target,
    load_from_args,
    memory_policy,
    number,
    open_store,
    rival_values,
    tqdm_progress,
)

METHOD_HELP = {   # --method's help: a sentence a method
    "ar": "the target alone, autoregressive (baseline)",
    "sd": "standard speculative decoding (a draft token is kept only where it is the target's top-1)",
    "csd": "SD + Online Correction Memory + Semantic Consistency Gate",
    "ocm-only": "ablation: memory without gate (rescue any pattern with count >= lambda)",
    "scg-only": "ablation: gate without memory (rescue any divergence with gap >= log tau)",
    LOSSY: "rival, lossy SD: keep a draft token whose target probability is at least --tau-lossy times the top-1's",
    TOPK: "rival, TensorRT-LLM's relaxed acceptance: keep a draft token in the target's --topk within --delta "
          "of the top-1's probability",
    TYPICAL: "rival, vLLM/Medusa typical acceptance: keep a draft token with p > min(--posterior-threshold, "
             "--posterior-alpha * exp(-entropy))",
    FLY: "rival, FLy: forgive a mismatch when the next --win-len - 1 draft tokens match and the target's top-3 "
         "entropy is at least --entropy-thre (needs blocks longer than --win-len: use a fixed --gamma, e.g. 15)",
}


def add_parsers(sub) -> None:
    """Register ``generate``, ``calibrate``, ``prepare`` and ``profile``."""
    g = sub.add_parser("generate", help="generate text with AR, SD, CSD, an ablation or a rival rule")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="csd", choices=METHODS,
                   help="; ".join(f"{k}: {v}" for k, v in METHOD_HELP.items()))
    d = CSDConfig()
    g.add_argument("--max-new-tokens", type=number(MAX_NEW_TOKENS, "--max-new-tokens"), default=d.max_new_tokens)
    add_decoding_args(g)
    add_rival_args(g)
    g.add_argument("--temperature", type=number(TEMPERATURE, "--temperature"), default=d.temperature,
                   help="0 (default): greedy; > 0: sampling with rejection-sampling verification (not the rivals)")
    g.add_argument("--seed", type=number(SEED, "--seed"), default=None,
                   help="seeds the run's sampling (a whole number, 0 or more; default: none)")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the chat template (default on)")
    g.add_argument("--memory", default=None,
                   help="correction-memory file to start from (default: the pair's calibrated memory)")
    g.add_argument("--save-memory", default=None, help="write the memory after the run (with its online updates)")
    add_memory_policy_args(g)
    g.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, events, metrics)")
    add_model_args(g)
    g.set_defaults(func=cmd_generate)
    add_calibrate_parser(sub)
    sub.add_parser("prepare", help="assemble, verify and convert the embedded models (done once, cached)") \
        .set_defaults(func=cmd_prepare)
    pf = sub.add_parser("profile", help="measure the target's verify time by block length and the draft's time per "
                                        "token on this machine; print the speed-up bound",
                        description="Measured once and cached per machine, torch version, pair, representations "
                                    "and engine code (--refresh measures again). Writes a Plotly chart with --chart.")
    pf.add_argument("--refresh", action="store_true", help="measure again even if a profile is cached")
    pf.add_argument("--chart", default=None, help="write the chart as a self-contained HTML file")
    pf.add_argument("--json", action="store_true", help="print the profile as JSON")
    pf.add_argument("--drafts", action="store_true", help="also time each way to run the draft (impl, dtype, vocab)")
    add_model_args(pf)
    pf.set_defaults(func=cmd_profile)


def add_calibrate_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="calibrate a correction memory on the target's own answers or on a corpus",
                       description="Prompt mode (default): the target answers prompts greedily and the draft is "
                                   "teacher-forced over the answers. Text mode (--corpus, or --mode text): both "
                                   "models read a corpus.")
    c.add_argument("--mode", choices=("prompts", "text"), default=None,
                   help="prompts (default) or text (the default when --corpus is given)")
    c.add_argument("--prompts", default=None,
                   help="prompt mode: JSONL ('prompt' per line) or a text file, one prompt per line "
                        "(default: the shipped prompt set's calibration split)")
    c.add_argument("--limit", type=int, default=None, help="prompt mode: use the first N prompts")
    c.add_argument("--per-kind", type=int, default=None, help="prompt mode: the first N prompts of each kind")
    c.add_argument("--skip-per-kind", type=int, default=0, help="prompt mode: skip the first N prompts of each kind")
    c.add_argument("--heldout", type=int, default=0,
                   help="prompt mode: also answer N held-out prompts; report how the memory covers them")
    c.add_argument("--answer-tokens", type=int, default=320, help="prompt mode: longest answer (default 320)")
    c.add_argument("--corpus", default=None, help="text mode: text file or JSONL (default: the shipped corpus)")
    c.add_argument("--max-positions", type=int, default=None, help="text mode: stop after this many counted positions")
    c.add_argument("--chunk-tokens", type=int, default=256, help="text mode: tokens per chunk")
    c.add_argument("--batch-size", type=int, default=None,
                   help="sequences a step, between progress lines (default: 8 prompts, 4 chunks)")
    c.add_argument("--out", required=True, help="memory file to write (.json or .json.gz)")
    c.add_argument("--memory", default=None, help="memory file to extend instead of starting empty")
    c.add_argument("--vocab-out", default=None, help="prompt mode: also write the answers' token frequencies here")
    add_memory_policy_args(c)
    add_model_args(c)
    c.set_defaults(func=cmd_calibrate)


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    d = CSDConfig()
    p.add_argument("--gamma", type=number(GAMMA, "--gamma", GAMMA_AUTO), default=GAMMA_AUTO,
                   help=f"draft block length (1..32), or '{GAMMA_AUTO}' (the default: chosen per block from this "
                        f"machine's costs and the run's acceptance); {d.gamma} is the paper's fixed block")
    p.add_argument("--gamma-max", type=number(GAMMA_MAX, "--gamma-max"), default=d.gamma_max,
                   help="the longest block gamma auto may draft")
    p.add_argument("--lam", type=number(LAM, "--lam"), default=d.lam, help="memory threshold lambda (>= 0)")
    p.add_argument("--tau", type=number(TAU, "--tau"), default=d.tau, help="gate threshold tau in (0, 1]")
    p.add_argument("--lookup", type=number(LOOKUP, "--lookup"), default=None,
                   help="also propose up to N tokens copied from the context where the costs say it pays, verified "
                        f"exactly (default {DEFAULT_LOOKUP} with sd, csd, the ablations; 0: the paper's method alone)")
    p.add_argument("--lookup-ngram", type=number(LOOKUP_NGRAM, "--lookup-ngram"), default=d.lookup_ngram,
                   help=f"the shortest recurring run after which --lookup copies (1..4, default {d.lookup_ngram})")
    paper = PRESETS["paper"]
    p.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help=f"paper: the paper's CSD (gamma {paper['gamma']}, lambda {paper['lam']:g}, "
                        f"tau {paper['tau']:g}, no copies, no adaptive block); "
                        "it sets those four and refuses them as flags beside it")


def apply_preset(cfg: CSDConfig, name: str, typed: list[str]) -> CSDConfig:
    """``cfg`` with a preset's settings; a flag that the preset sets, typed beside it, is refused (which was meant?)."""
    preset = PRESETS[name]
    flags = {"--" + k.replace("_", "-") for k in preset if k not in ("method", "gamma_min")}
    clash = sorted({t.split("=", 1)[0] for t in typed} & flags)
    if clash:
        raise ConfigError(f"--preset {name} sets {', '.join(sorted(flags))}; drop {', '.join(clash)} or the preset")
    if cfg.method != preset["method"]:
        raise ConfigError(f"--preset {name} is {preset['method']}'s; it cannot run with --method {cfg.method}")
    return replace(cfg, **preset).validated()


def cmd_generate(args) -> int:
    from csd.db.store import recording, run_fields
    from csd.memory import CorrectionMemory
    from csd.runtime.profile import decoder as measured_decoder

    cfg = CSDConfig.of(method=args.method, gamma=args.gamma, gamma_max=args.gamma_max, lam=args.lam, tau=args.tau,
                       temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       lookup=default_lookup(args.method) if args.lookup is None else args.lookup,
                       lookup_ngram=args.lookup_ngram, **rival_values(args)).validated()
    if getattr(args, "preset", None):
        cfg = apply_preset(cfg, args.preset, getattr(args, "argv", []))
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    policy = memory_policy(args)                                                # refused before anything loads
    file_memory = CorrectionMemory.load(args.memory) if args.memory else None   # a bad file costs seconds, not a load
    store = open_store(args)

    def fits(tokenizer, context: int) -> None:    # a prompt over the context is refused before the load
        from csd.runtime.pair import encode_prompt
        cfg.validated(context, len(encode_prompt(tokenizer, args.prompt, args.chat)))

    pair = load_from_args(args, need_draft=cfg.uses_draft, check=fits)
    prompt_ids = pair.encode_prompt(args.prompt, chat=args.chat)
    decoder = measured_decoder(pair)      # gamma auto: this machine's costs, measured on first need
    memory = file_memory if file_memory is not None else decoder.default_memory()
    if file_memory is not None:
        file_memory.check_pair(pair.pair_id)
    if policy is not None:
        memory.set_policy(policy)
    if cfg.use_ocm and (why := memory.mismatch(pair)):      # said, never refused
        print(f"note: {why}; its patterns still apply", file=sys.stderr)
    run = decoder.run(prompt_ids, cfg, memory)
    cancelled = False
    with recording(store, **run_fields(pair, cfg, kind="generate", prompt=args.prompt,
                                       memory_policy=memory.policy.label)) as rec:
        try:
            for ev in run:
                rec.add(ev)
                if not args.json and ev.in_output and not ev.special:
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            cancelled = True
            run.close()
        rec.result(run.text, run.metrics)
    if store is not None:
        store.close()
    if args.save_memory:
        memory.save(args.save_memory)
    print_run(args, cfg, pair, run, memory)
    return 130 if cancelled else 0


def print_run(args, cfg: CSDConfig, pair, run, memory) -> None:
    """A generation's result: one JSON object (``--json``), else its metrics on stderr after the text."""
    if args.json:
        print(json.dumps({"text": run.text, "token_ids": run.token_ids, "method": cfg.method,
                          "pair": pair.pair_id, "dtype": pair.rep.target, "models": pair.describe(),
                          "config": {**{k: getattr(cfg, k) for k in ("gamma", "gamma_max", "lam", "tau", "temperature",
                                                                     "max_new_tokens", "seed", "lookup")},
                                     **(cfg.rule_params() or {})},
                          "events": [e.to_dict() for e in run.events], "metrics": run.metrics.to_dict(),
                          "memory": {"policy": memory.policy.to_dict(), "patterns": len(memory),
                                     "evicted": memory.evicted}}))
    else:
        m = run.metrics
        if cfg.relax:
            kept, n_kept = ("relaxed", m.relaxed), m.relaxed_share
        else:
            kept, n_kept = ("rescued", m.rescued), m.rescued_share
        copies = (f"; {m.lookup_kept} of {m.lookup_drafted} tokens copied from the context kept in {m.lookup_blocks} "
                  f"passes" if cfg.lookup else "")
        print(f"\n\n[{cfg.method}] {m.new_tokens} tokens in {m.wall_s:.2f} s ({m.tokens_per_s:.2f} tok/s), "
              f"{m.target_forwards} target passes, mean acceptance length {m.mean_accepted_length:.2f}, "
              f"accepted {m.accepted_share:.1%} and {kept[0]} {n_kept:.1%} of {m.drafted} draft tokens "
              f"({kept[1]} {kept[0]}){copies}; target {pair.rep.label}, draft {pair.rep.draft or '-'}; "
              f"memory {len(memory):,} patterns, {memory.policy.describe()}", file=sys.stderr)


def cmd_prepare(args) -> int:
    """Make the embedded pair ready once (config, tokenizer, int8 conversion, this machine's costs for gamma
    auto under both int8 activation scalings, and with the app's int8 draft), so that the first generation pays
    for none of them."""
    from csd.fileio import cache_dir
    from csd.runtime.models import load_pair
    from csd.runtime.profile import cached_costs
    t0 = time.perf_counter()
    defaults = argparse.ArgumentParser()
    add_model_args(defaults, store=False)
    default_args = defaults.parse_args([])
    choose_draft(default_args)      # --draft-dtype auto: int8, ort4, gguf or q4_0, whichever runs fastest here
    choose_target(default_args)     # --dtype auto: int8 or the GGUF's own blocks (kept loaded for the pair below)
    pair = load_pair(progress=tqdm_progress())
    costs = cached_costs(pair, progress=tqdm_progress())      # gamma "auto" needs it; measured once
    app_costs = costs if pair.rep.activations != "pass" else None     # the app's target: activations per token
    if pair.rep.target == "int8":     # the other activation scaling has its own costs (the app's: per token)
        pair.set_activations("pass" if pair.rep.activations == "row" else "row")
        other = cached_costs(pair, progress=tqdm_progress())
        if pair.rep.activations == "row":
            app_costs = other
    print(f"embedded models ready in {cache_dir()} ({time.perf_counter() - t0:.0f} s); target representation: "
          f"{pair.rep.target}; draft {costs.draft_ms:.0f} ms/token, target {costs.verify(1):.0f} ms per 1-token "
          f"pass; {pair.memory_gib} GiB resident", file=sys.stderr)
    app_draft = app_draft_weights(default_args, None)      # the app's where runs decode together ("auto" on a GPU)
    if app_draft not in ("auto", pair.rep.draft):
        del pair
        cached_costs(load_pair(draft_weights=app_draft, activations="row", progress=tqdm_progress()),
                     progress=tqdm_progress(), target_of=app_costs)     # the same target: its passes are timed
    return 0


def cmd_calibrate(args) -> int:
    from csd.calibration.calibrate import calibrate, calibrate_prompts
    from csd.db.store import run_fields
    from csd.memory import CorrectionMemory

    policy = memory_policy(args)                   # refused before anything loads or is written
    mode, data, heldout = calibration_input(args)
    memory = CorrectionMemory.load(args.memory) if args.memory else None    # before the load: a bad file costs seconds
    store = open_store(args)
    pair = load_from_args(args)
    if memory is not None:
        memory.check_pair(pair.pair_id)
    if policy is not None:
        memory = memory if memory is not None else CorrectionMemory(pair.pair_id)
        memory.set_policy(policy)
    t0 = time.perf_counter()
    lam = CSDConfig().lam
    if mode == "prompts":
        from collections import Counter
        freq: Counter = Counter()
        memory = calibrate_prompts(pair, data, memory, max_new_tokens=args.answer_tokens,
                                   batch_size=args.batch_size or 8, heldout=heldout, lam=lam,
                                   progress=tqdm_progress(), source=str(args.prompts or "shipped prompt set"),
                                   token_freq=freq)
        freq = dict(freq.most_common())
        if args.vocab_out:
            from csd.fileio import write_json
            write_json(args.vocab_out, {"pair": pair.pair_id, "source": "target answers in prompt-mode calibration",
                                        "ids": [int(k) for k in freq], "counts": list(freq.values())})
    else:
        memory = calibrate(pair, data, memory, chunk_tokens=args.chunk_tokens, batch_size=args.batch_size or 4,
                           max_positions=args.max_positions, progress=tqdm_progress(),
                           corpus_name=args.corpus or "default")
    memory.save(args.out)
    info = memory.meta["calibration"][-1]
    if store is not None:
        run_id = store.start_run(**run_fields(pair, kind="calibrate", method="calibrate",
                                              prompt=str(args.prompts or args.corpus or f"default {mode}"),
                                              memory_policy=memory.policy.label))
        label = f"calibration ({mode}) {args.prompts or args.corpus or 'default'}"
        store.save_memory(memory, run_id=run_id, label=label)
        store.finish_run(run_id, "", info)
        store.close()
    print(calibration_summary(mode, info, memory, lam) + f"; memory {len(memory):,} patterns, "
          f"{memory.policy.describe()}; target {pair.rep.label}, draft {pair.rep.draft}; "
          f"{time.perf_counter() - t0:.0f} s; written to {args.out}", file=sys.stderr)
    return 0


def calibration_input(args) -> tuple[str, list, list]:
    """The mode the flags ask for, its prompts or texts, and the held-out prompts (prompt mode)."""
    from csd.corpus import PROMPTS_FILE, default_corpus, read_corpus, read_prompts
    mode = args.mode or ("text" if args.corpus else "prompts")
    if mode == "prompts" and args.corpus:
        raise ValueError("--corpus is for text mode; use --prompts in prompt mode")
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be >= 1")
    if mode == "text":
        return mode, read_corpus(args.corpus) if args.corpus else default_corpus(), []
    prompts = balanced(read_prompts(args.prompts or PROMPTS_FILE, split="calibration"), args.per_kind,
                       args.skip_per_kind)[:args.limit]
    heldout = balanced(read_prompts(PROMPTS_FILE, split="heldout"), -(-args.heldout // 3))[:args.heldout] \
        if args.heldout > 0 else []
    return mode, prompts, heldout


def calibration_summary(mode: str, info: dict, memory, lam: float) -> str:
    """What a calibration counted and what the memory holds after it."""
    lines = [f"{mode} calibration: {info['positions']} positions, {info['divergences']} divergences "
             f"(agreement {info['agreement']:.1%})"]
    if mode == "prompts":
        lines.append(f"{info['prompts']} prompts, {info['answer_tokens']} answer tokens, "
                     f"{info['answers_ended']} answers ended by themselves; "
                     f"top 20% of this run's patterns cover {info['top20_share']:.1%}")
        if "heldout" in info:
            h = info["heldout"]
            lines.append(f"held-out: {h['prompts']} prompts, {h['divergences']} divergences, top 20% of their patterns "
                         f"cover {h['top20_share']:.1%}; {h['covered_at_lambda']:.1%} of them have a pattern at "
                         f"lambda={lam:g} in the memory")
    lines.append(f"memory: {len(memory)} patterns, {memory.n_candidates(lam)} reach lambda={lam:g}, top 20% of "
                 f"patterns cover {memory.top_share(0.2):.1%}")
    return "\n".join(lines)


def balanced(prompts: list[dict], per_kind: int | None, skip: int = 0) -> list[dict]:
    """The first ``per_kind`` prompts of each kind after its first ``skip``, interleaved (all when None)."""
    if per_kind is None and not skip:
        return prompts
    by_kind: dict[str, list[dict]] = {}
    for p in prompts:
        by_kind.setdefault(p.get("kind", ""), []).append(p)
    groups = [g[skip:] if per_kind is None else g[skip:skip + per_kind] for g in by_kind.values()]
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


def cmd_profile(args) -> int:
    from csd.runtime.profile import cached_costs, draft_options, machine_name

    pair = load_from_args(args)
    costs = cached_costs(pair, refresh=args.refresh, progress=tqdm_progress())
    g_best, b_best = costs.best_bound()
    if args.json:
        print(json.dumps({**costs.to_dict(), "bound": {str(g): costs.bound(g) for g in range(1, 33)},
                          "best": {"gamma": g_best, "speedup": b_best},
                          "expected": {f"{a:.1f}": dict(zip(("gamma", "speedup"), costs.best_expected(a)))
                                       for a in (0.6, 0.7, 0.8, 0.9)}}, indent=1))
    else:
        print(f"{machine_name(pair.device)}: target {pair.rep.target}, draft {pair.rep.draft} "
              f"({pair.draft_lm.impl}, {pair.draft_vocab_size} tokens); measured {costs.measured_at}")
        print(f"draft: {costs.draft_ms:.1f} ms per token; AR: {costs.ar_tokens_per_s:.2f} tokens/s")
        print(f"{'gamma':>5} {'verify ms':>10} {'block ms':>9} {'bound tok/s':>12} {'bound x AR':>11}")
        for g in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32):
            print(f"{g:>5} {costs.verify(g + 1):>10.1f} {costs.block_ms(g):>9.1f} "
                  f"{(g + 1) / costs.block_ms(g) * 1000:>12.2f} {costs.bound(g):>10.2f}x")
        print(f"best bound: {b_best:.2f}x AR at gamma {g_best} (every draft token accepted)")
        print("expected at a per-token acceptance a (independent tokens): "
              + ", ".join(f"a={a:.1f}: {x:.2f}x at gamma {g}"
                          for a in (0.6, 0.7, 0.8, 0.9) for g, x in [costs.best_expected(a)]))
    if args.drafts:
        import torch

        from csd.runtime.models import draft_vocab_ids, resolve, resolve_device
        fp32 = resolve(args.draft, "draft", None).float_model(torch.float32, resolve_device(args.device))
        vocab = draft_vocab_ids(pair.pair_id, pair.tokenizer, pair.special_ids,
                                fp32.get_output_embeddings().out_features, "auto")
        print("draft options (ms per token):")
        for name, ms in draft_options(fp32, vocab).items():
            print(f"  {name:<32} {ms:7.1f}")
    if args.chart:
        from csd.bench.report import profile_figure
        Path(args.chart).parent.mkdir(parents=True, exist_ok=True)
        profile_figure(costs, title=f"{machine_name(pair.device)}: target {pair.rep.target}, draft "
                                    f"{pair.rep.draft}").write_html(args.chart, include_plotlyjs=True, full_html=True)
        print(f"chart: {args.chart}", file=sys.stderr)
    return 0
