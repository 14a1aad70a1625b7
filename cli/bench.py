"""``bench``: every method on the same items; the harness itself is ``csd.bench.harness``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from csd.bench.harness import MEMORY_MODES, BenchConfig, run_bench
from csd.bench.io import command_line
from csd.bench.methods import BENCH_METHODS, DEFAULT_METHODS, HF_AR, parse_sweep, validate_methods
from csd.bench.synthetic import add_synthetic_args
from csd.config import (
    DEFAULT_LOOKUP,
    GAMMA,
    GAMMA_AUTO,
    GAMMA_MAX,
    LAM,
    LOOKUP,
    MAX_NEW_TOKENS,
    PARAM_METHOD,
    TAU,
    CSDConfig,
)
from csd.evaluation.datasets import BUILTIN, validate_datasets
from csd.numbers import Field

from .common import (
    add_memory_policy_args,
    add_model_args,
    add_rival_args,
    load_from_args,
    memory_policy,
    number,
    open_store,
    rival_values,
)

COUNT = Field("a count", 0, whole=True)       # --limit (0: all items), --bound-checks (0: the cached profile alone)
ITEM_SEED = Field("the items' seed", whole=True)     # any whole number: random.Random and torch take negatives too


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="benchmark AR, SD, CSD, the rivals and transformers' assisted generation on the same items",
        description="Run every method on the same items (interleaved, rotated order, after a warm-up) and write "
                    "results.json, results.md, speedup.html, divergences.html and frontier.html to --out. "
                    "--sweep adds one CSD column per lambda/tau setting (the speed/quality frontier). --synthetic "
                    "instead times ar, sd and csd on randomly initialised models with the real pair's "
                    "architectures (no model files needed: for GPU machines; see bench/synthetic/).")
    p.add_argument("--dataset", default="gsm8k,humaneval,prose",
                   help=f"comma-separated: {', '.join(BUILTIN)} or a JSONL/text file, each with an optional count "
                        "(gsm8k:40) or range of the seeded draw (gsm8k:16-40) (default: %(default)s)")
    p.add_argument("--limit", type=number(COUNT, "--limit"), default=10,
                   help="items per dataset, fixed by --seed (default 10; 0 = all)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated from {', '.join(BENCH_METHODS)} (default: {','.join(DEFAULT_METHODS)})")
    p.add_argument("--max-new-tokens", type=number(MAX_NEW_TOKENS, "--max-new-tokens"), default=128)
    p.add_argument("--out", default="bench-results", help="output directory (default: bench-results)")
    p.add_argument("--seed", type=number(ITEM_SEED, "--seed"), default=0,
                   help="fixes the items drawn from each dataset (default 0)")
    d = CSDConfig()
    p.add_argument("--gamma", type=number(GAMMA, "--gamma", GAMMA_AUTO), default=GAMMA_AUTO,
                   help=f"draft block length of sd, csd and the ablations (1..32), or 'auto' (the default); {d.gamma} "
                        "is the paper's fixed block")
    p.add_argument("--gamma-max", type=number(GAMMA_MAX, "--gamma-max"), default=d.gamma_max,
                   help="the longest block gamma auto may draft")
    p.add_argument("--lam", type=number(LAM, "--lam"), default=d.lam, help="memory threshold lambda of the csd column")
    p.add_argument("--tau", type=number(TAU, "--tau"), default=d.tau, help="gate threshold tau of the csd column")
    p.add_argument("--lookup", type=number(LOOKUP, "--lookup"), default=DEFAULT_LOOKUP,
                   help=f"copies from the context in the sd, csd and ablation columns (default {DEFAULT_LOOKUP}; 0: "
                        "the paper's methods alone)")
    p.add_argument("--sweep", default=None,
                   help="more settings, one column each: 'lam=3,tau=0.01;lam=6,tau=0.1' (CSD), a rival's parameters "
                        "('tau_lossy=0.4;topk=5,delta=0.2'), 'method=fly,gamma=15', 'method=ar,activations=pass' "
                        "(docs/cli.md)")
    p.add_argument("--memory", help="start memory file of the memory methods (default: the pair's calibrated memory)")
    p.add_argument("--memory-mode", choices=MEMORY_MODES, default="online",
                   help="online: each method's memory evolves across the items (default); fresh: a new copy per item")
    add_memory_policy_args(p)
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation of each method")
    p.add_argument("--bound-checks", type=number(COUNT, "--bound-checks"), default=2, metavar="N",
                   help="with gamma auto, re-measure the profile N times beside the run and judge CSD against the "
                        "median bound (default 2; 0: the cached profile alone)")
    add_rival_args(p, ": of the lossy, topk, typical and fly columns")
    add_model_args(p)
    add_synthetic_args(p)
    p.set_defaults(func=cmd_bench, synthetic_refuses={a: p.get_default(a) for a in _NOT_SYNTHETIC})
    return p


# options of the benchmark on real items that mean nothing to the synthetic one
_NOT_SYNTHETIC = ("dataset", "methods", "sweep", "lookup", "memory", "memory_capacity", "memory_half_life", "draft",
                  "target", "draft_vocab", "device_map", "db", *PARAM_METHOD)


def cmd_bench(args) -> int:
    if args.synthetic:
        return cmd_synthetic(args)
    from csd.memory import CorrectionMemory

    methods = validate_methods(args.methods.split(","))
    policy = memory_policy(args)                   # refused before any model loads or file is written
    parse_sweep(args.sweep)
    validate_datasets(args.dataset)
    config = bench_config(args, methods)
    config.columns()              # every column's parameters checked before any model loads
    from csd.db.store import StoreOpenError
    try:                            # before the models load: a bad URL costs seconds
        store = open_store(args)
    except StoreOpenError as e:
        if not isinstance(e.__cause__, ImportError):
            raise
        print(f"warning: not recording to the store ({e.__cause__})", file=sys.stderr)   # optional: bench without it
        store = None
    memory = CorrectionMemory.load(args.memory) if args.memory else None
    pair = load_from_args(args, need_draft=any(m not in ("ar", HF_AR) for m in methods) or bool(args.sweep))
    if memory is not None:
        memory.check_pair(pair.pair_id)
    if policy is not None:
        from csd.memory import default_memory
        memory = memory if memory is not None else default_memory(pair)
        memory.set_policy(policy)
    out = Path(config.out_dir)
    try:
        res = run_bench(pair, config, store=store, memory=memory)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the finished items are in {out / 'results.json'}", file=sys.stderr)
        return 130
    finally:
        if store is not None:
            store.close()
    print((out / "results.md").read_text(encoding="utf-8"))
    print(f"results: {out.resolve()}", file=sys.stderr)
    return 0 if res["status"] == "finished" else 1


def bench_config(args, methods: list[str]) -> BenchConfig:
    """The run that the flags describe (``methods``: the validated names of --methods)."""
    return BenchConfig(args.dataset, None if args.limit == 0 else args.limit, tuple(methods), args.max_new_tokens,
                       args.out, args.seed, gamma=args.gamma, lam=args.lam, tau=args.tau, sweep=args.sweep,
                       memory_mode=args.memory_mode, warmup=not args.no_warmup,
                       command=getattr(args, "command_line", None) or command_line("csd"),
                       gamma_max=args.gamma_max, lookup=args.lookup, bound_checks=args.bound_checks,
                       rivals=rival_values(args, changed_only=True))


def cmd_synthetic(args) -> int:
    """``bench --synthetic``: random weights with the real architectures, before any model is loaded."""
    from csd.bench.synthetic import run_from_args

    given = [a for a, default in args.synthetic_refuses.items() if getattr(args, a) != default]
    if given:
        flags = ", ".join("--" + a.replace("_", "-") for a in given)
        raise ValueError(f"{flags}: not used by --synthetic (it runs ar, sd and csd on random prompts and models)")
    return run_from_args(args, getattr(args, "command_line", None) or command_line("csd"))
