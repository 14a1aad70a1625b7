"""``generate``, ``calibrate`` and ``prepare``: the engine on the command line, recording to the store."""
from __future__ import annotations

import argparse
import json
import sys
import time

from csd.config import METHOD_HELP, METHODS, CSDConfig

from .common import add_model_args, load_from_args, open_store, tqdm_progress


def add_parsers(sub) -> None:
    """Register ``generate``, ``calibrate`` and ``prepare``."""
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


def cmd_generate(args) -> int:
    from csd.calibrate import default_memory
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory

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
    from csd.models import EMBEDDED, cache_dir, prepare_embedded
    for role in EMBEDDED:
        path = prepare_embedded(role, tqdm_progress())
        print(f"{role}: {path}", file=sys.stderr)
    print(f"embedded models ready in {cache_dir()}", file=sys.stderr)
    return 0


def cmd_calibrate(args) -> int:
    from csd.calibrate import calibrate, default_corpus, read_corpus
    from csd.memory import CorrectionMemory

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


