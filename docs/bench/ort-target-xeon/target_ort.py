"""Issue 52: could the target run on ONNX Runtime's 4-bit MatMulNBits and keep greedy SD == AR?
(1) each product of the real target's layers: row i of an M-row product against a 1-row product, bit for bit;
(2) the target as one ORT graph (csd.runtime.ortlm.draft_graph on its 4-bit layers, the int8 head in torch): a
pass of 6 tokens against six 1-token steps; (3) its 1-token pass against the int8 target's (activations per
token, then per pass), timed in turn, wall and CPU ms. From the repository root:

    python docs/bench/ort-target-xeon/target_ort.py [--threads 2] [--reps 20] [--out docs/bench/ort-target-xeon]
"""
import argparse
import json
import logging
import pathlib
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--out", default=None)
args = p.parse_args()
torch.set_num_threads(args.threads)
logging.basicConfig(level=logging.WARNING)
from onnx import TensorProto, helper  # noqa: E402

from csd.runtime.convert import FORMAT, PROJECTIONS, cached_lean, layer_tensors  # noqa: E402
from csd.runtime.models import load_pair  # noqa: E402
from csd.runtime.ortlm import ORT_FORMAT, NBits, OrtLM, _Builder, _session, quantize_nbits  # noqa: E402
from csd.runtime.profile import machine_name, time_interleaved  # noqa: E402
from csd.runtime.refs import resolve  # noqa: E402

out = {"machine": machine_name("cpu"), "threads": args.threads, "command": " ".join(sys.argv), "products": []}
ref = resolve("embedded", "target", None, False)
g = torch.Generator().manual_seed(0)
with ref.source(None) as src:
    for li in (0, 13, 27):
        w = layer_tensors(src, li)
        for name, keys in PROJECTIONS.items():
            weight = torch.cat([w[k] for k in keys])
            b = _Builder()
            y = b.matmul("x", NBits(*quantize_nbits(weight)), "w")
            s = _session(helper.make_graph(b.nodes, "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", weight.shape[1]])],
                                           [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], b.inits), args.threads)
            x = (torch.randn(33, weight.shape[1], generator=g) * (1 + 20 * (torch.rand(weight.shape[1], generator=g) > 0.99))).numpy()
            many = s.run(None, {"x": x})[0]
            same = all((s.run(None, {"x": x[i:i + m]})[0] == many[i:i + m]).all() for m in (1, 6, 16) for i in range(0, 34 - m, m))
            out["products"].append({"layer": li, "product": name, "rows_bitwise_equal": bool(same)})
print(json.dumps(out["products"]), flush=True)
key = {"format": FORMAT, "source": ref.identity(), "role": "target", "bits": "ort4", "ort_format": ORT_FORMAT}
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    lean = cached_lean(pathlib.Path(tmp) / "target-ort4", key, lambda: ref.source(None), ref.config(), rows=False,
                       name="target", bits="ort4")
    ort_target = OrtLM.from_lean(lean)
    del lean
out["convert_s"] = round(time.perf_counter() - t0, 1)
with torch.inference_mode():
    c = ort_target.new_cache()
    ort_target.forward(c, [100 + i for i in range(40)], 1)
    many = ort_target.forward(c, [7, 8, 9, 10, 11, 12], 6)
    ort_target.crop(c, 40)
    ones = torch.cat([ort_target.forward(c, [t], 1) for t in [7, 8, 9, 10, 11, 12]])
out["graph_pass_of_6_bitwise_equal"] = bool(torch.equal(many, ones))
out["graph_pass_of_6_max_logit_diff"] = round(float((many - ones).abs().max()), 4)
out["graph_pass_of_6_same_argmax"] = bool(torch.equal(many.argmax(-1), ones.argmax(-1)))
print(json.dumps({k: v for k, v in out.items() if k.startswith("graph")}), flush=True)
pair = load_pair(draft=None, activations="row")
out["timed_row"] = time_interleaved({"int8 target, activations per token": pair.target_lm, "ort4 target": ort_target}, args.reps)
pair.set_activations("pass")
out["timed_pass"] = time_interleaved({"int8 target, activations per pass": pair.target_lm, "ort4 target": ort_target}, args.reps)
print(json.dumps({k: out[k] for k in ("timed_row", "timed_pass")}), flush=True)
if args.out:
    pathlib.Path(args.out, f"results-{args.threads}t.json").write_text(json.dumps(out, indent=1))
