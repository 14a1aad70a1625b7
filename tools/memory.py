"""The memory waterfall: what each part of a loaded pair holds, as tensor bytes and as resident memory.

    python -m tools.memory [--out DIR] [--int8-activations row|pass]

One process takes the steps the app takes, in order, and reads its resident set (``VmRSS``, with its
anonymous and file-backed parts) after each: the interpreter and torch, transformers, the pair (its
tokenizer, target and draft), one SD and one CSD answer (KV caches and buffers). The web app's own
share is ``python app.py``'s resident memory less these (``tools.lean``). Beside each model it counts
the bytes its tensors hold by kind (int8 rows with their scales and biases, norms, the output layer,
the embedding: mapped from the cache, of which only the rows looked up are read). Writes
DIR/results.json and prints the table.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from csd.bench.io import command_line, now, write_json


def resident() -> dict[str, float]:
    """This process's resident memory in GiB: all of it, anonymous, and mapped from files."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = round(int(line.split()[1]) / 2**20, 3)
    return out


def lm_bytes(lm) -> dict[str, int]:
    """Bytes a lean model's tensors hold, by kind (int8 layers counted from their shapes: torch packs them
    into its own layout, a little larger)."""
    import torch
    lean = getattr(lm, "lean", lm)

    def size(mod) -> tuple[str, int]:
        if isinstance(mod, torch.Tensor):
            return "norms", mod.numel() * mod.element_size()
        if hasattr(mod, "packed"):          # csd.quant.RowInt8Linear, csd.lm.PackedInt8Linear
            w, b = torch.ops.quantized.linear_unpack(mod.packed)
            b = getattr(mod, "bias", None) if b is None else b
            return "int8 rows, scales, biases", w.numel() + 4 * w.shape[0] + (4 * b.numel() if b is not None else 0)
        return "float layers", sum(p.numel() * p.element_size() for p in mod.parameters())

    out: dict[str, int] = {}
    for layer in lean.layers:
        for m in layer:
            kind, n = size(m)
            out[kind] = out.get(kind, 0) + n
    out["output layer"] = size(lean.head)[1]
    data = getattr(lean.embed, "data", lean.embed)
    out["embedding (mapped: only the rows looked up are read)"] = data.numel() * data.element_size()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write DIR/results.json")
    ap.add_argument("--int8-activations", default="row", choices=("row", "pass"),
                    help="as the app (row, default) or the command line (pass)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    rows = [dict(step="Python", **resident())]
    t0 = time.perf_counter()
    import torch  # noqa: F401

    rows.append(dict(step="torch imported", **resident()))
    import transformers  # noqa: F401

    from csd.models import load_pair
    rows.append(dict(step="transformers imported", **resident()))
    pair = load_pair(int8_activations=args.int8_activations)
    rows.append(dict(step="the pair loaded (target and draft)", **resident()))
    models = {"target": lm_bytes(pair.target_lm), "draft": lm_bytes(pair.draft_lm)} \
        if hasattr(getattr(pair.target_lm, "lean", pair.target_lm), "layers") else {}
    from csd.config import CSDConfig
    from csd.decode import Decoder
    prompt = pair.encode_prompt("Write a Python function that checks whether a number is prime, with a docstring.")
    for method in ("sd", "csd"):
        dec = Decoder(pair)
        run = dec.run(prompt, CSDConfig(method=method, max_new_tokens=args.max_new_tokens), dec.default_memory())
        list(run)
        rows.append(dict(step=f"after one {method.upper()} answer of {len(run.token_ids)} tokens", **resident()))
    from csd.profile import machine_name
    meta = dict(command=command_line("tools.memory"), machine=machine_name(), at=now(), pair=pair.describe(),
                seconds=round(time.perf_counter() - t0, 1))
    print("| step | resident GiB | anonymous | file-backed | peak |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['step']} | {r['VmRSS']:.2f} | {r.get('RssAnon', 0):.2f} | {r.get('RssFile', 0):.2f} | "
              f"{r['VmHWM']:.2f} |")
    for role, parts in models.items():
        print(f"\n{role}: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in parts.items()))
    if args.out:
        write_json(Path(args.out) / "results.json", dict(meta=meta, steps=rows, tensors=models))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
