"""Issue 52: the target on ONNX Runtime with greedy SD == AR. Its 4-bit ``MatMulNBits`` products are row-exact,
ONNX Runtime's ``GroupQueryAttention`` is not (target_ort.py), so here the decoder is cut at each attention: one
ONNX Runtime call from one attention to the next (29 calls a pass), the attention in torch one query at a time
(``LeanLM._attend``), the int8 output layer with activations per token. This script checks (1) a pass of 6 tokens
against six 1-token steps and against passes of 2 and 4, bit for bit; (2) greedy SD == AR on two chat prompts;
(3) resident memory; (4) its 1- and 6-token passes against the int8 target's (activations per token, then per
pass), in turn, wall and CPU ms. Not wired into the engine (docs/cpu.md says why). From the repository root:

    python docs/bench/ort-target-xeon/target_rows.py [--threads 2] [--reps 20] [--out docs/bench/ort-target-xeon]
"""
import argparse
import gc
import json
import os
import pathlib
import time

import numpy as np
import psutil
import torch

from csd.runtime import ortlm
from csd.runtime.convert import FORMAT, cached_lean
from csd.runtime.lm import LeanCache, LeanLM, ids_tensor
from csd.runtime.ortlm import NBits, _session
from csd.runtime.profile import machine_name, time_interleaved
from csd.runtime.quant import release_memory
from csd.runtime.refs import resolve


class Builder(ortlm._Builder):
    def matmul(self, x, nb: NBits, name, out=None):
        y = super().matmul(x, nb, name)
        return self("Identity", [y], [out]) if out else y


def segments(lm: LeanLM) -> list:
    """Segment 0: x -> qkv (layer 0's input norm and q/k/v); i in 1..L-1: a, res -> qkv, res_out (layer i-1 after
    its attention, layer i up to its q/k/v); L: a, res -> hidden (the final norm)."""
    from onnx import TensorProto, helper
    hidden, n_qkv, t, eps = lm._hidden_shape[0], (lm.n_heads + 2 * lm.n_kv) * lm.head_dim, [1, "T"], float(lm.eps)
    val = lambda d: [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in d.items()]  # noqa: E731
    out = []
    for i in range(lm.n_layers + 1):
        b = Builder(external=True)
        if i == 0:
            h = b("SimplifiedLayerNormalization", ["x", b.init("ln1", lm.layers[0][0].float().numpy())], epsilon=eps, axis=-1)
            ins, outs = {"x": [*t, hidden]}, {"qkv": [*t, n_qkv]}
        else:
            _, _, o, ln2, gu, down = lm.layers[i - 1]
            h = b("SkipSimplifiedLayerNormalization", [b.matmul("a", o, "o"), "res", b.init("ln2", ln2.float().numpy())],
                  ["g", "", "", "s"], domain="com.microsoft", epsilon=eps)
            g, u = b("Split", [b.matmul(h, gu, "gu"), b.ints(lm.inter, lm.inter)], 2, axis=-1)
            x = b.matmul(b("Mul", [b("Mul", [g, b("Sigmoid", [g])]), u]), down, "down")
            ins = {"a": [*t, lm.q_size], "res": [*t, hidden]}
            if i == lm.n_layers:
                b("SkipSimplifiedLayerNormalization", [x, "s", b.init("norm", lm.norm.float().numpy())], ["hidden"],
                  domain="com.microsoft", epsilon=eps)
                outs = {"hidden": [*t, hidden]}
            else:
                h = b("SkipSimplifiedLayerNormalization", [x, "s", b.init("ln1", lm.layers[i][0].float().numpy())],
                      ["h", "", "", "res_out"], domain="com.microsoft", epsilon=eps)
                outs = {"qkv": [*t, n_qkv], "res_out": [*t, hidden]}
        if i < lm.n_layers:
            b.matmul(h, lm.layers[i][1], "qkv", out="qkv")
        out.append((helper.make_graph(b.nodes, f"segment{i}", val(ins), val(outs), b.inits), b.weights))
    return out


class OrtRowsLM(LeanLM):
    @classmethod
    def from_lean(cls, lm: LeanLM, threads: int) -> "OrtRowsLM":
        out = cls.__new__(cls)
        out.__dict__.update(lm.__dict__)
        built = segments(lm)
        out.sessions = [_session(g, threads, w) for g, w in built]
        out.weights = [w for _, w in built]     # kept: ONNX Runtime may read them where it did not prepack
        out.layers = lm.layers = []
        out.per_row, out.head.per_row = True, True
        release_memory()
        return out

    def _run(self, i, ins, outs):
        bind = self.sessions[i].io_binding()
        for names, put in ((ins, bind.bind_input), (outs, bind.bind_output)):
            for name, arr in names.items():
                put(name, "cpu", 0, np.float32, tuple(arr.shape), arr.data_ptr())
        self.sessions[i].run_with_iobinding(bind)

    @torch.inference_mode()
    def forward_many(self, caches: list[LeanCache], ids: list, keeps: list[int]) -> list[torch.Tensor]:
        return [self._forward(c, i, k) for c, i, k in zip(caches, ids, keeps)]

    def _forward(self, cache, ids, keep):
        ids = ids_tensor(ids, "cpu")
        t, s = ids.numel(), cache.n
        self._grow(cache, s + t)
        h_q, h_qk, d = self.n_heads, self.n_heads + self.n_kv, self.head_dim
        cos, sin = self._rope(torch.arange(s, s + t))
        x = self.embed[ids][None].to(torch.float32).contiguous()
        qkv, a = torch.empty(1, t, (h_qk + self.n_kv) * d), torch.empty(1, t, self.q_size)
        res = [x, torch.empty_like(x)]
        self._run(0, {"x": x}, {"qkv": qkv})
        for li in range(self.n_layers):
            h = qkv.view(t, h_qk + self.n_kv, d)
            qk = self._rotate(h[:, :h_qk], cos, sin)
            cache.k[li, :, s:s + t] = qk[:, h_q:].transpose(0, 1)
            cache.v[li, :, s:s + t] = h[:, h_qk:].transpose(0, 1)
            att = self._attend(cache.k[li:li + 1], cache.v[li:li + 1], qk[:, :h_q].transpose(0, 1)[None], s)
            a.copy_(att.transpose(1, 2).reshape(1, t, self.q_size))
            if li + 1 < self.n_layers:
                self._run(li + 1, {"a": a, "res": res[0]}, {"qkv": qkv, "res_out": res[1]})
                res.reverse()
            else:
                self._run(li + 1, {"a": a, "res": res[0]}, {"hidden": x})
        cache.n = s + t
        return self.head(x[0, -keep:]).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory
    from csd.runtime.models import load_pair
    rss = lambda: round(psutil.Process(os.getpid()).memory_info().rss / 2**30, 2)  # noqa: E731
    out = {"machine": machine_name("cpu"), "threads": args.threads, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python docs/bench/ort-target-xeon/target_rows.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v)}
    ref = resolve("embedded", "target", None, False)
    ortlm.GROUPS = (32,)     # groups of 32: row-exact products (the draft's 128 are not, tests/test_ort_draft.py)
    key = {"format": FORMAT, "source": ref.identity(), "role": "target", "bits": "ort4", "ort_format": ortlm.ORT_FORMAT,
           "groups": 32}
    path = ref.int8_dir()
    before = rss()
    lm = OrtRowsLM.from_lean(cached_lean(path.with_name(f"{path.name}-ort4"), key, lambda: ref.source(None), ref.config(),
                                         rows=True, name="target", bits="ort4"), args.threads)
    gc.collect()
    out["resident_gib_ort_target"] = round(rss() - before, 2)
    prompt, block = [100 + i for i in range(40)], [7, 8, 9, 10, 11, 12]
    runs = {}
    for name, parts in (("6", [6]), ("1x6", [1] * 6), ("2+4", [2, 4])):
        c = lm.new_cache()
        lm.forward(c, prompt, 1)
        at, rows = 0, []
        for n in parts:
            rows.append(lm.forward(c, block[at:at + n], n))
            at += n
        runs[name] = torch.cat(rows)
    out["pass_of_6_equals_1x6_bitwise"] = bool(torch.equal(runs["6"], runs["1x6"]))
    out["pass_of_6_equals_2_then_4_bitwise"] = bool(torch.equal(runs["6"], runs["2+4"]))
    print(json.dumps({k: v for k, v in out.items() if k.startswith(("pass", "resident"))}), flush=True)
    before = rss()
    pair = load_pair(draft_weights="int8", activations="row")
    out["resident_gib_int8_pair"] = round(rss() - before, 2)
    int8_target, pair.target_lm = pair.target_lm, lm
    out["sd_equals_ar"] = []
    for text in ("Write a Python function that reverses a string.", "What is 17 times 23? Answer briefly."):
        ids, got = pair.encode_prompt(text, chat=True), {}
        for method in ("ar", "sd"):
            run = Decoder(pair).run(ids, CSDConfig(method=method, gamma=5, lookup=0, max_new_tokens=48), CorrectionMemory(pair.pair_id))
            list(run)
            got[method] = run
        out["sd_equals_ar"].append({"same": got["sd"].token_ids == got["ar"].token_ids, "tokens": len(got["ar"].token_ids),
                                    "passes_ar": got["ar"].metrics.target_forwards, "passes_sd": got["sd"].metrics.target_forwards})
    print(json.dumps(out["sd_equals_ar"]), flush=True)
    for tokens in (1, 6):
        pair.target_lm = int8_target
        pair.set_activations("row")
        row = time_interleaved({"int8, activations per token": int8_target, "ort4 rows": lm}, args.reps, tokens=tokens)
        pair.set_activations("pass")
        per_pass = time_interleaved({"int8, activations per pass": int8_target, "ort4 rows": lm}, args.reps, tokens=tokens)
        out[f"timed_{tokens}"] = {"row": row, "pass": per_pass}
        print(tokens, json.dumps(out[f"timed_{tokens}"]), flush=True)
    if args.out:
        pathlib.Path(args.out, f"results-rows-{args.threads}t.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
