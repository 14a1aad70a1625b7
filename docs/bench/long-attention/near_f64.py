"""How far the target's first-token logits lie from a run whose attention is exact, for the kernel of this checkout.

Loads the target as the command line does (``--dtype gguf``, exact rows) and, on three of the fidelity prompts
(12 and 14, whose first token is a near-tie, and 3), writes the first token's logits of:
- ``kernel``: the model as it runs (every layer in ``kq_layer``);
- ``kernel_attend`` (with ``--ref``): the layers in PyTorch's steps around the same products, the kernel's attention;
- ``f64_attend`` (with ``--ref``): the same, the attention in float64 (PyTorch's, the reference).

    PYTHONPATH=. python docs/bench/long-attention/near_f64.py OUT.pt [--ref]      # in each checkout compared
"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from csd.runtime.models import load_pair

PROMPTS = (12, 14, 3)


def main(out_file: str, ref: bool) -> None:
    fidelity = Path(__file__).with_name("fidelity") / "fidelity.json"
    prompts = json.loads(fidelity.read_text())["prompts"]
    lm = load_pair(None, dtype="gguf", activations="row").target_lm
    out = {}

    def run(tag):
        rows = []
        for idx in PROMPTS:
            cache = lm.new_cache()
            rows.append(lm.forward(cache, prompts[idx], 1)[-1])
            lm.release(cache)
        out[tag] = torch.stack(rows)

    run("kernel")
    if ref:
        lm._records = None              # PyTorch's steps between the products; the attention is KQuantLM._attend

        run("kernel_attend")

        def attend_f64(k, v, q, start):
            t = q.shape[2]
            mask = torch.ones(t, start + t, dtype=torch.bool).tril(start)
            return F.scaled_dot_product_attention(q.double(), k[:, :, :start + t].double(),
                                                  v[:, :, :start + t].double(), attn_mask=mask, scale=lm.scaling,
                                                  enable_gqa=True).float()
        lm._attend = attend_f64
        run("f64_attend")
    torch.save(out, out_file)
    for tag, logits in out.items():
        print(tag, [(x.topk(2).indices.tolist(), [round(y, 4) for y in x.topk(2).values.tolist()]) for x in logits])


if __name__ == "__main__":
    main(sys.argv[1], "--ref" in sys.argv)
