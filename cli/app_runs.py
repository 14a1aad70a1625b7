"""The app's own runs, timed: the models the app loads with its defaults, its batcher, a CSD run alone and then
several at once, beside llama.cpp's plain decoding of the same target file where ``--llama-bench`` names it
(issue 66's marks: a run alone at 1.3x llama.cpp's tok/s, 8 at once at 1.7x one run's). Run it with nothing
else on the machine, after ``python -m csd prepare``:

    python -m csd.cli.app_runs --out docs/bench/NAME/app [--llama-bench PATH/llama-bench]
        [--prompts 6] [--rounds 2] [--users 8] [--tokens 128]

A run alone drafts as the app's run alone does (prepare's timed draft, ``cli.common.app_solo_draft``); runs at
once draft as the app's batched runs do (``cli.common.app_draft_weights``). Writes ``app_runs.json`` and
``app_runs.md``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

from csd.bench.io import command_line, md_table, now, write_outputs
from csd.bench.llama_side import llama_bench
from csd.config import DEFAULT_LOOKUP

from .common import add_model_args, app_draft_weights, app_solo_draft, choose_draft, choose_target, load_from_args


def load_app_models():
    """The pair and its solo pair (or None), as ``python app.py`` with no flags loads them."""
    from csd.runtime.batch import can_batch
    defaults = argparse.ArgumentParser()
    add_model_args(defaults, store=False)
    args = defaults.parse_args([])
    choose_draft(args)
    choose_target(args)
    asked, args.draft_weights = args.draft_weights, app_draft_weights(args, None)
    pair = load_from_args(args)
    if not can_batch(pair):
        raise SystemExit("the app serves one run at a time with these models (no batcher): nothing to time at once")
    return pair, app_solo_draft(args, asked, pair)


def timed(runs) -> float:
    """Tokens a second of ``runs`` decoded together, each on its own thread as the app's handlers are."""
    workers = [threading.Thread(target=list, args=(r,)) for r in runs]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(r.metrics.new_tokens for r in runs) / (time.perf_counter() - t0)


def since(before: dict, after: dict) -> dict:
    """The batcher's passes between two of its ``stats()``: per model, passes, calls, rows and seconds."""
    out = {}
    for role, d in after.items():
        b = before.get(role, {})
        out[role] = {k: round(d[k] - b.get(k, 0), 3) for k in ("passes", "calls", "rows", "seconds")}
    return out


def median_of(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "all": [round(v, 2) for v in values]}


def table(res: dict) -> str:
    alone, together = res["summary"]["alone"]["median"], res["summary"]["at once"]["median"]
    rep = res["representation"]
    lines = [f"# The app's runs: {res['machine']}", "",
             f"{res['date']}; nothing else running (`{res['command']}`). The models as the app loads them: target "
             f"{rep['target']}, draft {res['draft alone']} for a run alone and {rep['draft']} for runs at once; "
             f"CSD, gamma auto, copies from the context up to {res.get('lookup', 0)} tokens (the app's default: "
             f"{DEFAULT_LOOKUP}), {res['tokens']} new "
             f"tokens a run, the first {res['prompts']} chats of HumanEval and GSM8K (half each); a run's tokens a "
             "second include reading its prompt, as the app's user waits for it.", ""]
    rows = [[f"a run alone (median of {len(res['summary']['alone']['all'])})", f"{alone:.2f}", "1.00x"],
            [f"{res['users']} runs at once, in all (median of {len(res['summary']['at once']['all'])})",
             f"{together:.2f}", f"{together / alone:.2f}x"]]
    head = ["what runs", "tok/s", "x a run alone"]
    if ll := res.get("llama.cpp"):
        head.append("x llama.cpp plain")
        base = ll["tokens_per_s"]
        rows = [[*r, f"{float(r[1]) / base:.2f}x"] for r in rows]
        rows.insert(0, [f"llama.cpp, the target alone (plain decoding, tg{res['tokens']})",
                        f"{base:.2f} ± {ll.get('stddev') or 0:.2f}", "–", "1.00x"])
    lines += md_table(head, rows)
    if pg := res.get("llama.cpp with prompt"):
        rate = pg["tokens_per_s"]
        lines += ["", f"With the prompt read, as the runs above count it: llama.cpp reading a {pg['prompt']}-token "
                  f"prompt (the chats' mean) and then generating {res['tokens']} tokens (`{pg['command']}`) made "
                  f"{rate:.2f} ± {pg.get('stddev') or 0:.2f} new tokens a second; a run alone {alone / rate:.2f}x "
                  f"that, {res['users']} runs at once in all {together / rate:.2f}x."]
    bullets = []        # how the batcher's passes went while the runs decoded together
    for role, d in res.get("passes at once", {}).items():
        n = d["passes"]
        if n:
            bullets.append(f"- Runs at once, the {role}: {n:g} passes served {d['calls'] / n:.1f} runs and "
                         f"{d['rows'] / n:.1f} token rows each, {1000 * d['seconds'] / n:.1f} ms a pass, "
                         f"{d['seconds']:.1f} s in all")
    if copied := res.get("prompt rows copied"):
        bullets.append(f"- Prompt rows copied from another run's reading (`csd.runtime.prompt_rows`; none is kept "
                       f"from one measurement to the next): alone {copied['alone']}, at once {copied['at once']} in "
                       f"{len(res['summary']['at once']['all'])} rounds")
    if bullets:
        lines += ["", *bullets]
    lines += ["", "Each figure: " + "; ".join(f"{k} {', '.join(map(str, v['all']))}"
                                            for k, v in res["summary"].items()) + " tok/s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m csd.cli.app_runs", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--llama-bench", help="path of a built llama-bench binary: its plain decoding of the target, "
                   "measured in the same run")
    p.add_argument("--prompts", type=int, default=6, help="chats, half HumanEval and half GSM8K (default 6)")
    p.add_argument("--rounds", type=int, default=2, help="times each measurement is made (default 2)")
    p.add_argument("--users", type=int, default=8, help="runs at once (default 8)")
    p.add_argument("--tokens", type=int, default=128, help="new tokens a run (default 128)")
    args = p.parse_args(argv)
    if min(args.prompts, args.rounds, args.tokens) < 1 or args.users < 2:
        p.error("--prompts, --rounds and --tokens must be at least 1, --users at least 2")
    if args.llama_bench and not Path(args.llama_bench).is_file():
        p.error(f"--llama-bench {args.llama_bench}: no such file (build llama-bench first: docs/cpu.md)")
    if not args.llama_bench:
        return measure(args, None)
    from csd.runtime.embedded import assembled
    with assembled("target") as target_gguf:        # assembled once for both llama-bench runs
        return measure(args, target_gguf)


def measure(args, target_gguf: Path | None) -> int:
    """A run alone and runs at once, timed, beside llama-bench on ``target_gguf`` where given; writes the outputs."""
    from csd.config import CSDConfig, default_lookup
    from csd.evaluation.datasets import load_dataset
    from csd.runtime import threads
    from csd.runtime.profile import cached_costs, decoder, machine_name
    from csd.runtime.prompt_rows import PromptRows

    res = {"machine": machine_name("cpu"), "date": now(), "command": command_line("csd.cli.app_runs"),
           "tokens": args.tokens, "users": args.users, "prompts": args.prompts, "lookup": default_lookup("csd")}
    if target_gguf:       # llama.cpp's plain decoding, no prompt read (tg)
        res["llama.cpp"] = llama_bench(args.llama_bench, target_gguf, args.tokens, 2, 3)
    from csd.runtime.batch import Batcher
    pair, solo = load_app_models()
    batcher = Batcher(pair, solo=solo)
    mode = pair.rep.activations
    costs = cached_costs(pair)
    solo_costs = costs if solo is None else cached_costs(solo, target_of=costs)     # as the app: the same target's
    shared_rows = PromptRows()      # as the app: its runs share the rows of prompts that begin alike
    together = decoder(batcher.view(mode, False), costs, prompt_rows=shared_rows)
    alone = decoder(batcher.view(mode, True), solo_costs, prompt_rows=shared_rows)
    threads.one_core()          # as the app: the batcher's thread has the cores
    half = (args.prompts + 1) // 2
    items = load_dataset("humaneval", limit=half)
    if args.prompts > half:
        items += load_dataset("gsm8k", limit=args.prompts - half)
    prompts = [pair.encode_prompt(it.prompt) for it in items]
    memory = together.default_memory()
    cfg = CSDConfig(method="csd", gamma="auto", max_new_tokens=args.tokens, lookup=default_lookup("csd"))  # the app's
    speeds = {"alone": [], "at once": []}
    try:
        # each measurement starts with no prompt read before (a run alone would copy its own prompt's rows from
        # the round before); runs at once still share what they read together (two of 8 have the same chat)
        copied = {"alone": 0, "at once": 0}
        for rnd in range(args.rounds):
            for i, prompt in enumerate(prompts):
                shared_rows.clear()
                run = alone.run(prompt, cfg, memory.copy())
                speeds["alone"].append(timed([run]))
                copied["alone"] += run.metrics.prompt_rows_copied
                print(f"round {rnd} prompt {i} alone: {speeds['alone'][-1]:.2f} tok/s", file=sys.stderr, flush=True)
        before = batcher.stats()
        for rnd in range(args.rounds):
            many = (prompts * args.users)[:args.users]
            shared_rows.clear()
            runs = [together.run(p, cfg, memory.copy()) for p in many]
            speeds["at once"].append(timed(runs))
            copied["at once"] += sum(r.metrics.prompt_rows_copied for r in runs)
            print(f"round {rnd}, {args.users} at once: {speeds['at once'][-1]:.2f} tok/s", file=sys.stderr, flush=True)
        passes = since(before, batcher.stats())
    finally:
        batcher.close()
    if target_gguf:       # llama.cpp reading a prompt of the chats' mean length first, as the runs above did
        prompt = round(sum(map(len, prompts)) / len(prompts))
        res["llama.cpp with prompt"] = llama_bench(args.llama_bench, target_gguf, args.tokens, 2, 3, prompt=prompt)
    res |= {"representation": pair.rep.as_dict(), "draft alone": (solo or pair).rep.draft,
            "summary": {k: median_of(v) for k, v in speeds.items()}, "passes at once": passes,
            "prompt rows copied": copied,
            "draft_ms": {"alone": solo_costs.draft_ms, "at once": costs.draft_ms}, "pass_1_ms": costs.verify(1)}
    write_outputs(args.out, "app_runs", res, table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
