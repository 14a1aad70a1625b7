"""How often the target keeps the draft's token at each position of a block, by the draft's representation (issue
52: a 4-bit draft is cheaper a step but may keep fewer tokens): greedy SD at a fixed gamma, no copies, on the
benchmark's items; the decode loop's own counts (``RunMetrics.per_position_kept``), no time measured.

    python -m csd.bench.keep_rate --out docs/bench/keep-rate-NAME [--draft-dtype int8,ort4]
        [--dataset humaneval:8,gsm8k:8] [--gamma 6] [--max-new-tokens 128]
"""
from __future__ import annotations

import argparse
import sys

from .harness import interleaved_items
from .io import command_line, fmt, md_table, now, write_outputs


def keep_rates(pair, items, gamma: int, max_new_tokens: int) -> dict:
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory
    drafted, kept, tokens, passes = [0] * gamma, [0] * gamma, 0, 0
    cfg = CSDConfig(method="sd", gamma=gamma, lookup=0, max_new_tokens=max_new_tokens)
    for it in items:
        run = Decoder(pair).run(pair.encode_prompt(it.prompt, chat=True), cfg, CorrectionMemory(pair.pair_id))
        list(run)
        m = run.metrics
        for j, (d, k) in enumerate(zip(m.per_position_drafted, m.per_position_kept)):
            if j < gamma:
                drafted[j] += d
                kept[j] += k
        tokens, passes = tokens + m.new_tokens, passes + m.target_forwards
    return {"drafted": drafted, "kept": kept, "rate": [round(k / d, 4) if d else None for d, k in zip(drafted, kept)],
            "tokens_per_pass": round(tokens / passes, 3) if passes else None, "new_tokens": tokens}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m csd.bench.keep_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--draft-dtype", dest="draft_weights", default="int8,ort4")
    p.add_argument("--dataset", default="humaneval:8,gsm8k:8")
    p.add_argument("--gamma", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", help="the target's representation (auto: as prepare chose)")
    args = p.parse_args(argv)
    from csd.evaluation.datasets import validate_datasets
    from csd.runtime.models import DRAFT_DTYPES, load_pair
    from csd.runtime.profile import machine_name
    dtypes = [d.strip() for d in args.draft_weights.split(",") if d.strip()]
    if not dtypes or any(d not in DRAFT_DTYPES for d in dtypes) or not 1 <= args.gamma <= 32 or args.max_new_tokens < 1:
        p.error(f"--draft-dtype takes {', '.join(DRAFT_DTYPES)}; --gamma 1..32; --max-new-tokens >= 1")
    items = interleaved_items(validate_datasets(args.dataset), None, 0)     # the keep rate is a sum: any order
    out = {"machine": machine_name("cpu"), "date": now(), "command": command_line("csd.bench.keep_rate"),
           "items": len(items), "gamma": args.gamma, "runs": {}}
    target = ""
    for dd in dtypes:
        pair = load_pair(draft_weights=dd, dtype=args.dtype)
        target = out["target"] = pair.rep.label
        out["runs"][pair.rep.draft] = keep_rates(pair, items, args.gamma, args.max_new_tokens)
        del pair
    rows = [[dd, *(fmt(x, ".3f") for x in r["rate"]), r["tokens_per_pass"]] for dd, r in out["runs"].items()]
    lines = [f"# The draft's keep rate by position: {out['machine']}", "",
             f"{out['date']}; `{out['command']}`: target {target}; greedy SD, gamma {args.gamma}, no copies, "
             f"{len(items)} items; "
             "kept / decided at each draft position (a position is decided only where those before it were kept).",
             "", *md_table(["draft", *(f"pos {j + 1}" for j in range(args.gamma)), "tokens / pass"], rows)]
    write_outputs(args.out, "keep_rate", out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
