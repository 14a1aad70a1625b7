"""The synthetic benchmark's options, for ``python -m csd bench --synthetic`` and ``python -m csd.bench.synthetic``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from csd.config import parse_gamma
from csd.runtime.profile import PASS_LENGTHS
from csd.runtime.static import ENGINES

from ..io import command_line
from .models import PAIR_CHOICES
from .run import SyntheticConfig, run_synthetic


def add_synthetic_args(p: argparse.ArgumentParser) -> None:
    """The options of the synthetic benchmark proper (``csd bench`` has the shared ones)."""
    g = p.add_argument_group("synthetic benchmark (random weights, real architectures: no model files needed)")
    g.add_argument("--synthetic", action="store_true",
                   help="benchmark AR, SD and CSD on randomly initialised models with the real pair's architectures")
    g.add_argument("--synthetic-config", default="auto", choices=PAIR_CHOICES,
                   help="tiny (CPU, seconds), 1.5b (the embedded pair's 0.5B/1.5B), 7b (0.5B draft, Qwen2.5-7B "
                        "target); auto: 1.5b on CUDA, tiny on the CPU")
    g.add_argument("--acceptance", type=float, default=SyntheticConfig.acceptance,
                   help="probability that the draft proposes the target's own next token (default 0.8)")
    g.add_argument("--prompt-tokens", type=int, default=SyntheticConfig.prompt_tokens,
                   help="random prompt length in tokens (default 32)")
    g.add_argument("--pass-lengths", default=",".join(map(str, PASS_LENGTHS)),
                   help="target pass lengths (tokens) of the verify-time table, comma-separated")
    g.add_argument("--rehearsals", type=int, default=SyntheticConfig.rehearsals,
                   help="untimed reruns allowed per method and prompt to reach the script's fixed point (default 16)")
    g.add_argument("--repeats", type=int, default=SyntheticConfig.repeats,
                   help="timed runs of each method's counted run; the fastest counts (default 1; 3 on a GPU, whose "
                        "clocks follow the load)")


def run_from_args(args, command: str = "") -> int:
    """Run, print the Markdown table (progress on stderr); 0 when greedy SD == AR held (or was not checkable)."""
    try:
        lengths = tuple(int(x) for x in str(args.pass_lengths).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--pass-lengths must be comma-separated whole numbers, got {args.pass_lengths!r}") from None
    cfg = SyntheticConfig(
        pair=args.synthetic_config, acceptance=args.acceptance, prompts=args.limit, prompt_tokens=args.prompt_tokens,
        max_new_tokens=args.max_new_tokens, gamma=args.gamma, gamma_max=args.gamma_max, lam=args.lam, tau=args.tau,
        memory_mode=getattr(args, "memory_mode", "online"), seed=args.seed, device=args.device, dtype=args.dtype,
        draft_weights=args.draft_weights, draft_impl=args.draft_impl, pass_lengths=lengths,
        engine=getattr(args, "engine", "auto"), warmup=not args.no_warmup, rehearsals=args.rehearsals,
        repeats=args.repeats).validated()
    res = run_synthetic(cfg, args.out, command or command_line("csd.bench.synthetic"),
                        log=lambda msg: print(f"synthetic: {msg}", file=sys.stderr, flush=True))
    print((Path(args.out) / "results.md").read_text(encoding="utf-8"))
    print(f"results: {Path(args.out).resolve()}", file=sys.stderr)
    return 1 if res["sd_equals_ar"]["passed"] is False else 0


def build_parser() -> argparse.ArgumentParser:
    """``python -m csd.bench.synthetic``: the same options as ``csd bench --synthetic``, for a machine
    that has torch and transformers but not the store's or the app's packages."""
    d = SyntheticConfig()
    package_doc = sys.modules[__package__].__doc__      # the benchmark's own description, first paragraph
    p = argparse.ArgumentParser(prog="python -m csd.bench.synthetic", description=package_doc.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=d.prompts, help="random prompts (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--out", default="bench-results", help="output directory (default: bench-results)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights, prompts and coins (default 0)")
    p.add_argument("--gamma", type=parse_gamma, default=d.gamma, help="draft block length, or auto (default 6)")
    p.add_argument("--gamma-max", type=int, default=d.gamma_max)
    p.add_argument("--lam", type=float, default=d.lam)
    p.add_argument("--tau", type=float, default=d.tau)
    p.add_argument("--memory-mode", choices=("online", "fresh"), default=d.memory_mode)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--device", default=d.device, help="auto (CUDA if available), cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", default=d.dtype, choices=("auto", "float32", "bfloat16", "float16", "int8"),
                   help="the target's representation (auto: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--draft-dtype", dest="draft_weights", default=d.draft_weights,
                   choices=("auto", "same", "float32", "bfloat16", "float16", "int8"))
    p.add_argument("--draft-impl", default=d.draft_impl, choices=("auto", "hf", "lean"))
    p.add_argument("--engine", default=d.engine, choices=ENGINES,
                   help="static: fixed shapes, CUDA graphs captured at load; compiled: static through torch.compile "
                        "first; eager; auto: static on CUDA (default)")
    add_synthetic_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from csd.runtime.pair import ModelLoadError

    args = build_parser().parse_args(argv)
    try:
        return run_from_args(args)
    except (ModelLoadError, ValueError) as e:      # a ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
