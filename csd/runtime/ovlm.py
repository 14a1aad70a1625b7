"""The target on OpenVINO (issue 52, ``--dtype ov4``): its decoder layers, final norm and output layer as one
OpenVINO graph. The layers' products hold 4-bit weights in groups (the ort4 draft's ``quantize_nbits``: a float32
scale and a 4-bit zero point a group), the output layer its int8 rows; attention reads the project's own KV
cache in place and hands back the new keys and values, which torch writes. Attention spans a multiple of
``KEY_BLOCK`` keys, the rest masked: OpenVINO's attention rounds a row by the length it spans, so without it a
verify pass and 1-token steps differed; with it, where the products are row-independent (the Intel Xeon measured),
each token's row is what a pass of one gives it (docs/exactness.md)."""
from __future__ import annotations

import functools

import numpy as np
import torch

from .lm import LeanCache, LeanLM
from .ortlm import GraphLM, NBits, quantize_nbits
from .quant import release_memory

KEY_BLOCK = 64


@functools.cache
def ov_missing() -> str | None:
    """None where OpenVINO compiles and runs a 4-bit product here (checked once), else why not."""
    try:
        import openvino as ov
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    try:
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(16, 128, generator=g), torch.randn(2, 128, generator=g)
        nb = NBits(*quantize_nbits(w))
        xp = _ops().parameter([-1, 128], np.float32, name="x")
        got = ov.Core().compile_model(ov.Model([_fc(xp, nb)], [xp]), "CPU")({"x": x.numpy()})[0]
    except Exception as e:      # noqa: BLE001 - any failure means: not here
        return f"OpenVINO does not run a 4-bit product here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    from .ortlm import dequantize_nbits
    if not np.allclose(got, (x @ dequantize_nbits(nb).t()).numpy(), atol=0.1, rtol=0.05):
        return "OpenVINO gives wrong 4-bit products here"
    return None


def _ops():
    import openvino.opset13 as ops
    return ops


def _i64(*v: int):
    return _ops().constant(np.array(v, dtype=np.int64))


def _axis(v: int):
    return _ops().constant(np.int64(v))


def _fc(x, nb: NBits):
    """x @ W.T (+ bias) with W held as 4-bit levels, zero points and scales: OpenVINO's compressed product."""
    import openvino as ov
    ops = _ops()
    (n, blocks), group = nb.scales.shape, 2 * nb.q.shape[2]
    q = ov.Tensor(nb.q.numpy(), ov.Shape([n, blocks, group]), ov.Type.u4)   # the bytes in place: u4, first level low
    z = torch.stack([nb.zeros & 15, nb.zeros >> 4], -1).flatten(-2)[:, :blocks, None]
    w = ops.multiply(ops.subtract(ops.convert(ops.constant(q), ov.Type.f32),
                                  ops.convert(ops.constant(z.numpy(), ov.Type.u4), ov.Type.f32)),
                     ops.constant(nb.scales[..., None].numpy()))
    y = ops.matmul(x, ops.reshape(w, _i64(n, blocks * group), False), False, True)
    return y if nb.bias is None else ops.add(y, ops.constant(nb.bias.float().numpy()))


def target_graph(lm: LeanLM, head_rows: np.ndarray, head_scales: np.ndarray):
    """The model of ``lm`` (its layers ``NBits``): inputs ``x`` (T, hidden) the embedded tokens, ``cos``/``sin``
    (T, 1, D), ``mask`` (G*T, S+T) additive, the cache ``kc``/``vc`` (layers, KV, capacity, D) and ``held`` (1,),
    the S tokens it holds; outputs the logits (T, rows) and the pass's keys and values (layers, KV, T, D)."""
    import openvino as ov
    ops = _ops()
    nh, nkv, d, hidden = lm.n_heads, lm.n_kv, lm.head_dim, lm._hidden_shape[0]
    eps = ops.constant(np.float32(lm.eps))

    def rms(x, w):
        var = ops.reduce_mean(ops.multiply(x, x), _i64(-1), True)
        return ops.multiply(ops.divide(x, ops.sqrt(ops.add(var, eps))), ops.constant(w.float().numpy()))

    def rotate(t):              # (T, heads, D): x cos + rotate_half(x) sin
        a, b = ops.split(t, _axis(-1), 2).outputs()
        return ops.add(ops.multiply(t, cos), ops.multiply(ops.concat([ops.negative(b), a], -1), sin))

    x = x_in = ops.parameter([-1, hidden], np.float32, name="x")
    cos, sin = (ops.parameter([-1, 1, d], np.float32, name=n) for n in ("cos", "sin"))
    mask = ops.parameter([-1, -1], np.float32, name="mask")
    kc, vc = (ops.parameter([lm.n_layers, nkv, -1, d], np.float32, name=n) for n in ("kc", "vc"))
    held = ops.parameter([1], np.int64, name="held")
    tail = ops.subtract(ops.subtract(ops.gather(ops.shape_of(mask), _i64(1), _axis(0)), held),
                        ops.gather(ops.shape_of(x_in), _i64(0), _axis(0)))           # the mask's span less S + T
    pads = ops.concat([_i64(0), tail, _i64(0)], 0)
    new_k, new_v = [], []
    for li, (ln1, qkv, o, ln2, gate_up, down) in enumerate(lm.layers):
        h = ops.reshape(_fc(rms(x, ln1), qkv), _i64(0, nh + 2 * nkv, d), True)          # (T, H + 2 KV, D)
        q, k, v = ops.variadic_split(h, _axis(1), _i64(nh, nkv, nkv)).outputs()
        k, v = ops.transpose(rotate(k), _i64(1, 0, 2)), ops.transpose(v, _i64(1, 0, 2))  # (KV, T, D)
        new_k.append(ops.unsqueeze(k, _i64(0)))
        new_v.append(ops.unsqueeze(v, _i64(0)))
        kf, vf = (ops.pad(ops.concat([ops.slice(ops.gather(c, _axis(li), _axis(0)), _i64(0), held, _i64(1), _i64(1)),
                                      new], 1), _i64(0, 0, 0), pads, "constant")
                  for c, new in ((kc, k), (vc, v)))                                     # (KV, span, D)
        qg = ops.reshape(ops.transpose(rotate(q), _i64(1, 0, 2)), _i64(nkv, -1, d), False)   # (KV, G*T, D)
        a = ops.scaled_dot_product_attention(qg, kf, vf, mask, ops.constant(np.float32(lm.scaling)), causal=False)
        a = ops.reshape(ops.transpose(ops.reshape(a, _i64(nh, -1, d), False), _i64(1, 0, 2)), _i64(-1, nh * d), False)
        x = ops.add(x, _fc(a, o))
        gate, up = ops.split(_fc(rms(x, ln2), gate_up), _axis(-1), 2).outputs()
        x = ops.add(x, _fc(ops.multiply(ops.swish(gate), up), down))
    head = ops.multiply(ops.convert(ops.constant(head_rows), ov.Type.f32), ops.constant(head_scales[:, None]))
    logits = ops.matmul(rms(x, lm.norm), head, False, True)
    return ov.Model([logits, ops.concat(new_k, 0), ops.concat(new_v, 0)], [x_in, cos, sin, mask, kc, vc, held])


class OvLM(GraphLM):
    """A lean target whose pass is one OpenVINO call (``target_graph``); embedding, RoPE angles, the mask and
    the cache stay torch's, so a rollback is a crop as on the lean path."""

    @classmethod
    def from_lean(cls, lm: LeanLM, threads: int | None = None) -> OvLM:
        """From a ``LeanLM`` whose layers hold ``NBits`` (its output layer int8), whose levels the graph
        reads in place."""
        import openvino as ov
        out = cls.__new__(cls)
        out.__dict__.update(lm.__dict__)
        head = lm.head.packed if hasattr(lm.head, "packed") else lm.head._packed_params._packed_params
        w, _ = torch.ops.quantized.linear_unpack(head)
        rows = w.int_repr()[:, :lm._hidden_shape[0]].numpy().copy()
        model = target_graph(lm, rows, w.q_per_channel_scales().float().numpy())
        out.compiled = ov.Core().compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": threads or torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32"})      # not bf16 where the CPU has it: the weights' own products
        out.request = out.compiled.create_infer_request()
        out.shared, out.layers, lm.layers = lm.layers, [], []
        del model, rows
        release_memory()
        out.forward(out.new_cache(), [0], 1)    # OpenVINO lays its weights out at the first call (3 s): at load
        return out

    def _forward(self, cache: LeanCache, ids: torch.Tensor, keep: int) -> torch.Tensor:
        t, s = ids.numel(), cache.n
        self._grow(cache, s + t)
        cos, sin = self._rope(torch.arange(s, s + t))
        span = -(-(s + t) // KEY_BLOCK) * KEY_BLOCK
        mask = torch.zeros(t, span).masked_fill_(torch.ones(t, span, dtype=torch.bool).tril(s).logical_not(),
                                                 float("-inf")).repeat(self.n_heads // self.n_kv, 1)
        x = self.embed[ids].to(torch.float32)
        res = self.request.infer({"x": x.numpy(), "cos": cos.contiguous().numpy(), "sin": sin.contiguous().numpy(),
                                  "mask": mask.numpy(), "kc": cache.k.numpy(), "vc": cache.v.numpy(),
                                  "held": np.array([s], dtype=np.int64)}, share_inputs=True)
        cache.k[:, :, s:s + t] = torch.from_numpy(res[1])
        cache.v[:, :, s:s + t] = torch.from_numpy(res[2])
        cache.n = s + t
        return torch.from_numpy(res[0][-keep:].copy())
