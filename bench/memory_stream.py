"""The correction memory on a long stream that changes topic (docs/memory.md): code, then word problems, then
prose. ``collect`` reads each item's reference text once, both models teacher-forced, and keeps the draft's
and the target's top-1 and the gate's logit gap at every position; ``replay`` (``bench.memory_replay``) runs
every memory policy over that one stream. No generation: docs/memory.md says what such a replay shows.

    python -m csd.bench.memory_stream collect --out docs/bench/memory-stream [--per-topic 100]
    python -m csd.bench.memory_stream replay docs/bench/memory-stream
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from .io import write_json

TOPICS = ("humaneval", "gsm8k", "prose")       # the stream's order: code, word problems, prose
STREAM_FILE = "stream.json.gz"


# -- the items' reference texts ---------------------------------------------------------------------
def gsm8k_solution(answer: str) -> str:
    """GSM8K's worked solution as prose: calculator notes (<<2*3=6>>) dropped, '#### N' as 'The answer is N.'"""
    body, _, final = answer.partition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return f"{body}\nThe answer is {final.strip()}." if final.strip() else body


def stream_items(per_topic: int, seed: int = 0) -> list[dict]:
    """``per_topic`` items of each topic, in the stream's order: {topic, item_id, text}; the text is what a good
    answer holds (HumanEval's stub and canonical solution, GSM8K's worked solution, a prose passage)."""
    from csd.evaluation.datasets import data_file, load_dataset
    raw = {}
    with open(data_file("gsm8k"), encoding="utf-8") as f:
        for n, line in enumerate(f):
            if line.strip():
                raw[f"gsm8k/{n}"] = json.loads(line)["answer"]
    out = []
    for topic in TOPICS:
        for it in load_dataset(topic, per_topic, seed):
            if topic == "humaneval":
                text = f"```python\n{it.extra['prompt']}{it.extra['canonical_solution']}```"
            else:
                text = gsm8k_solution(raw[it.item_id]) if topic == "gsm8k" else it.content
            out.append({"topic": topic, "item_id": it.item_id, "text": text})
    return out


# -- one teacher-forced read per item -----------------------------------------------------------------
def read_prefix(lm, ids: list[int]):
    """Read the shared instruction once (the passes a run reads a prompt in): (cache, its length, last logits)."""
    from csd.decode import prefill_spans
    cache = lm.new_cache()
    for a, b in prefill_spans(len(ids)):
        z = lm.forward(cache, list(ids[a:b]), 1)
    return cache, lm.length(cache), z[-1:]                                          # (1, V)


def read_text(lm, state, text_ids: list[int]):
    """The logits after the prefix and after each text token, in one pass (the cache cropped back after)."""
    import torch
    cache, n0, z0 = state
    try:
        return torch.cat([z0, lm.forward(cache, list(text_ids), len(text_ids))])     # (n + 1, V)
    finally:
        lm.crop(cache, n0)


def read_item(pair, prefixes: dict, text_ids: list[int]) -> dict:
    """Both models teacher-forced over the instruction + text: at each text position (and after the last, so
    that a block's bonus has a t*) the draft's top-1 (``d``), the target's top-1 (``t``) and the gate's gap
    z(d) - z(t) in the target's logits (``gap``, 0 where they agree)."""
    import torch
    with torch.inference_mode():
        zd = read_text(pair.draft_lm, prefixes["draft"], text_ids).argmax(-1)
        d = zd if pair.draft_lm.vocab_ids is None else pair.draft_lm.vocab_ids[zd]
        z = read_text(pair.target_lm, prefixes["target"], text_ids)                # (n + 1, V)
        top = z.argmax(-1)
        rows = torch.arange(len(top))
        gap = z[rows, d.to(z.device)] - z[rows, top]
    return {"d": d.tolist(), "t": top.tolist(), "gap": [round(v, 4) for v in gap.tolist()]}


def truncate(row: dict, n: int) -> dict:
    """An item read further than ``n`` text tokens, as if read to ``n`` (each prediction sees only its past)."""
    return {**row, "ref": row["ref"][:n], "d": row["d"][:n + 1], "t": row["t"][:n + 1], "gap": row["gap"][:n + 1]}


def collect(out: Path, per_topic: int, max_text_tokens: int, seed: int = 0) -> Path:
    """Read the stream's items and write ``out/stream.json.gz`` (resumable: items already read are kept)."""
    from csd.calibration.calibrate import CALIBRATION_INSTRUCTION
    from csd.fileio import read_maybe_gzip
    from csd.runtime.models import load_pair

    path = out / STREAM_FILE                       # write_json makes the folder
    done = json.loads(read_maybe_gzip(path)) if path.exists() else None
    pair = load_pair()
    if pair.target_lm.vocab_ids is not None:
        raise ValueError("the target has a reduced vocabulary; the replay needs its full logits")
    items = stream_items(per_topic, seed)
    data = done or {"pair": pair.pair_id, "representation": pair.rep.as_dict(),
                    "special": sorted(int(s) for s in pair.special_ids), "per_topic": per_topic, "seed": seed,
                    "items": []}
    data["max_text_tokens"] = max_text_tokens
    data["items"] = [truncate(r, max_text_tokens) for r in data["items"]]
    prefix_ids = pair.encode_prompt(CALIBRATION_INSTRUCTION, chat=True)        # as text-mode calibration reads
    import torch
    with torch.inference_mode():
        prefixes = {"draft": read_prefix(pair.draft_lm, prefix_ids), "target": read_prefix(pair.target_lm, prefix_ids)}
    t0 = time.perf_counter()
    for n, it in enumerate(items):
        if n < len(data["items"]):
            continue
        text_ids = pair.tokenizer(it["text"], add_special_tokens=False)["input_ids"][:max_text_tokens]
        row = {"topic": it["topic"], "item_id": it["item_id"], "ref": text_ids, **read_item(pair, prefixes, text_ids)}
        data["items"].append(row)
        if (n + 1) % 10 == 0 or n + 1 == len(items):
            data["read_s"] = data.get("read_s", 0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            write_json(path, data)
            print(f"{n + 1}/{len(items)} items read ({data['read_s']:.0f} s)", file=sys.stderr, flush=True)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m csd.bench.memory_stream", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="read the stream's items once with both models (teacher-forced)")
    c.add_argument("--out", required=True, help="the run directory (stream.json.gz goes there)")
    c.add_argument("--per-topic", type=int, default=100, help="items of each topic (default 100: 300 in all)")
    c.add_argument("--max-text-tokens", type=int, default=80, help="reference tokens read per item")
    r = sub.add_parser("replay", help="run every memory policy over a collected stream; write results and chart")
    r.add_argument("run", help="the run directory holding stream.json.gz")
    r.add_argument("--lam", type=float, default=None, help="lambda (default: the engine's, 6)")
    r.add_argument("--tau", type=float, default=None, help="tau (default: the engine's, 0.01)")
    args = p.parse_args(argv)
    if args.cmd == "collect":
        print(collect(Path(args.out), args.per_topic, args.max_text_tokens), file=sys.stderr)
        return 0
    from .memory_replay import replay_run
    replay_run(Path(args.run), lam=args.lam, tau=args.tau)
    return 0


if __name__ == "__main__":
    sys.exit(main())
