"""This project's AR, SD and CSD beside llama.cpp's plain decoding of the same GGUF files, on one machine in one
run (issue 52). llama.cpp is not a dependency: build its ``llama-bench`` yourself (docs/cpu.md says how) and
name it with ``--llama-bench``; it decodes ``--tokens`` tokens with no prompt pass, then ``python -m csd bench``
runs AR, SD and CSD on the benchmark's items with the same new-token count, and last llama.cpp reads a prompt of
the items' mean length before it decodes the same count (``-pg``), the yardstick for tok/s that include the prompt.

    python -m csd.bench.llama_side --llama-bench PATH/llama-bench --out docs/bench/llama-side-NAME \\
        [--dataset humaneval:4,gsm8k:4] [--tokens 128] [--threads 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from csd.representation import Representation

from .io import command_line, now, read_results_json, write_outputs


def llama_bench(binary: str, gguf: Path, tokens: int, threads: int, reps: int, prompt: int = 0) -> dict:
    """llama-bench's figures for one GGUF file: mean and spread of tok/s over ``reps``. With no ``prompt``, its
    token generation alone (``-n tokens``: no prompt is read). With a ``prompt`` length, a prompt of that many tokens
    read first, then ``tokens`` generated (``-pg prompt,tokens``); llama-bench counts both kinds of token in its
    tok/s, so the figure returned is the new tokens a second with the prompt's reading inside the time, as this
    project's benchmark counts them."""
    shape = ["-p", "0", "-n", "0", "-pg", f"{prompt},{tokens}"] if prompt else ["-p", "0", "-n", str(tokens)]
    cmd = [binary, "-m", str(gguf), "-t", str(threads), *shape, "-r", str(reps), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    return bench_row(json.loads(out.stdout), tokens, prompt) | {
        "command": " ".join(cmd[:1] + ["-m", gguf.name] + cmd[3:])}


def bench_row(rows: list[dict], tokens: int, prompt: int = 0) -> dict:
    """The figures of llama-bench's JSON row for ``prompt`` tokens read and ``tokens`` generated."""
    rows = [r for r in rows if r.get("n_gen") == tokens and r.get("n_prompt", 0) == prompt]
    if not rows:
        raise RuntimeError(f"llama-bench printed no {'pg' if prompt else 'tg'} row for {tokens} tokens")
    r = rows[0]
    new_share = tokens / (prompt + tokens)       # of llama-bench's tokens a second, the new ones
    tok_s, spread = r["avg_ts"] * new_share, r.get("stddev_ts")
    return {"tokens_per_s": tok_s, "stddev": None if spread is None else spread * new_share,
            "ms_per_token": 1000 / tok_s, "prompt": prompt, "build": r.get("build_commit"), "cpu": r.get("cpu_info"),
            "type": r.get("model_type")}


def prompt_length(items: list[dict]) -> int | None:
    """The items' mean prompt length in tokens (each item once), None where the run did not record it."""
    lengths = {(it["dataset"], it["item_id"]): it.get("prompt_tokens") for it in items}
    if not lengths or None in lengths.values():
        return None
    return round(sum(lengths.values()) / len(lengths))


def after_prompt(items: list[dict], method: str) -> float | None:
    """Tokens a second of ``method``'s items once each prompt was read (wall time less its reading), as
    llama-bench's tg figure times them; None where a run did not record its reading."""
    rows = [it for it in items if it["method"] == method]
    if not rows or any(it.get("prefill_s") is None for it in rows):
        return None
    return sum(it["new_tokens"] for it in rows) / sum(it["wall_s"] - it["prefill_s"] for it in rows)


def ours(dataset: str, tokens: int, out: Path, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "csd", "bench", "--dataset", dataset, "--methods", "ar,sd,csd",
           "--max-new-tokens", str(tokens), "--no-db", "--out", str(out), *flags]
    subprocess.run(cmd, check=True, timeout=7200)
    _, data = read_results_json(out)
    return {"command": " ".join(["python", *cmd[1:]]), **our_figures(data)}


def our_figures(data: dict) -> dict:
    """What the side by side reads from a results.json: the methods' figures over all its items (the "all" row, or
    the only dataset's where ``--dataset`` named one), the tokens a second once each prompt was read, and the items'
    mean prompt length."""
    from .results import overall
    return {"summary": overall(data["summary"]), "meta": data["meta"],
            "after_prompt": {m: after_prompt(data["items"], m) for m in ("ar", "sd", "csd")},
            "prompt_tokens": prompt_length(data["items"])}


def target_passes(reps: list[str], verify: int = 5, rounds: int = 15) -> dict:
    """The embedded target's 1-token and ``verify``-token passes in each representation, loaded together and timed
    in turn (``csd.runtime.profile.time_interleaved``)."""
    from csd.runtime.models import load_pair
    from csd.runtime.profile import CONTEXT, time_interleaved
    lms = {r: load_pair(None, dtype=r, activations="row").target_lm for r in reps}
    one, many = time_interleaved(lms, rounds), time_interleaved(lms, rounds, tokens=verify)
    return {"context": CONTEXT, "reps": rounds, "verify": verify,
            "ms": {r: {"1": one[r]["wall_ms"], str(verify): many[r]["wall_ms"]} for r in reps}}


def table(res: dict) -> str:
    ll, mine = res["llama.cpp"], res["ours"]["summary"]
    base = ll["target"]["tokens_per_s"]
    sd = ll["target"].get("stddev") or 0.0
    ours = Representation.of(res["ours"]["meta"])
    lines = [f"# Side by side with llama.cpp: {res['machine']}", "",
             f"{res['date']}; one machine, one run, nothing else running (`{res['command']}`). llama.cpp "
             f"{ll['target'].get('build')}: `{ll['target']['command']}` (Q4_K_M, as the GGUF ships); this "
             f"project: `{res['ours']['command']}` (its defaults: target {ours.label}, draft {ours.draft}).", "",
             "| what runs | tok/s | x llama.cpp plain | ms a token |", "|---|---:|---:|---:|",
             f"| llama.cpp, the target alone (plain decoding) | {base:.2f} ± {sd:.2f} | 1.00x | {1000 / base:.1f} |",
             f"| llama.cpp, the draft alone | {ll['draft']['tokens_per_s']:.2f} | "
             f"{ll['draft']['tokens_per_s'] / base:.2f}x | {ll['draft']['ms_per_token']:.1f} |"]
    for m in ("ar", "sd", "csd"):
        s = mine[m]
        lines.append(f"| this project, {m.upper()} | {s['tokens_per_s']:.2f} | {s['tokens_per_s'] / base:.2f}x | "
                     f"{1000 / s['tokens_per_s']:.1f} |")
    for rep, run in res.get("also", {}).items():
        for m in ("ar", "sd", "csd"):
            t = run["summary"][m]["tokens_per_s"]
            lines.append(f"| this project, {m.upper()}, target {rep} | {t:.2f} | {t / base:.2f}x | {1000 / t:.1f} |")
    if passes := res.get("passes"):
        lines += ["", f"The target's passes after {passes['context']} cached tokens, the representations in turn "
                  f"(median of {passes['reps']}): "
                  + "; ".join(f"{rep} {t['1']:.1f} ms a 1-token pass ({t['1'] / (1000 / base):.2f}x llama.cpp's "
                              f"token), {t[str(passes['verify'])]:.1f} ms a {passes['verify']}-token pass"
                              for rep, t in passes["ms"].items()) + "."]
    after = []         # each run's tok/s once its prompts were read, where it recorded the reading
    runs = {"": res["ours"], **{f", target {rep}": run for rep, run in res.get("also", {}).items()}}
    for name, run in runs.items():
        for m, t in (run.get("after_prompt") or {}).items():
            if t is not None:
                after.append(f"{m.upper()}{name} {t:.2f} ({t / base:.2f}x)")
    if after:
        lines += ["", "Once each prompt was read (a run's wall time less its reading of the prompt, which "
                  "llama-bench's tg figure leaves out), tok/s and x llama.cpp: " + "; ".join(after) + "."]
    if pg := ll.get("target with prompt"):
        rate = pg["tokens_per_s"]
        with_prompt = [f"{m.upper()}{name} {run['summary'][m]['tokens_per_s'] / rate:.2f}x"
                       for name, run in runs.items() for m in ("ar", "sd", "csd")]
        lines += ["", f"With each prompt read, as this project's tok/s above count it: llama.cpp reading a "
                  f"{pg['prompt']}-token prompt (the items' mean) and then generating {res['tokens']} tokens "
                  f"(`{pg['command']}`) made {rate:.2f} ± {pg.get('stddev') or 0:.2f} new tokens a second; this "
                  "project's runs, x that: " + "; ".join(with_prompt) + "."]
    ar = mine["ar"]["tokens_per_s"]
    lines += ["", f"CSD over AR: {mine['csd']['tokens_per_s'] / ar:.2f}x; SD over AR: "
              f"{mine['sd']['tokens_per_s'] / ar:.2f}x; CSD over SD: "
              f"{mine['csd']['tokens_per_s'] / mine['sd']['tokens_per_s']:.2f}x (tok/s over all items of the run)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m csd.bench.llama_side", description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-bench", required=True, help="path of a built llama-bench binary")
    p.add_argument("--out", required=True)
    p.add_argument("--dataset", default="humaneval:4,gsm8k:4")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--also-dtype", default="", help="comma-separated target representations run after the defaults "
                   "(e.g. int8,gguf), and timed pass by pass beside them")
    args = p.parse_args(argv)
    if not Path(args.llama_bench).is_file():
        p.error(f"--llama-bench {args.llama_bench}: no such file (build llama-bench first: docs/cpu.md)")
    if args.tokens < 1 or args.threads < 1 or args.reps < 1:
        p.error("--tokens, --threads and --reps must be at least 1")
    from csd.runtime.embedded import assembled
    from csd.runtime.profile import machine_name
    out = Path(args.out)
    res = {"machine": machine_name("cpu"), "date": now(), "command": command_line("csd.bench.llama_side"),
           "tokens": args.tokens, "llama.cpp": {}}
    with assembled("target") as target, assembled("draft") as draft:
        files = {"target": target, "draft": draft}
        for role, gguf in files.items():
            res["llama.cpp"][role] = llama_bench(args.llama_bench, gguf, args.tokens, args.threads, args.reps)
        res["ours"] = ours(args.dataset, args.tokens, out / "ours")
        default = Representation.of(res["ours"]["meta"]).target
        also = [r for r in args.also_dtype.split(",") if r and r != default]     # the defaults' own ran above
        res["also"] = {r: ours(args.dataset, args.tokens, out / f"ours-{r}", "--dtype", r) for r in also}
        if prompt := res["ours"]["prompt_tokens"]:       # llama.cpp reading a prompt of the items' length first
            res["llama.cpp"]["target with prompt"] = llama_bench(args.llama_bench, files["target"], args.tokens,
                                                                 args.threads, args.reps, prompt=prompt)
    timed = [default, *also]
    if len(timed) > 1:
        res["passes"] = target_passes(timed)
    write_outputs(out, "side", res, table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
