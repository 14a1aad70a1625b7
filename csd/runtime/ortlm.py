"""The draft on ONNX Runtime (issue 52, ``--draft-dtype ort4``): its decoder layers as one ONNX graph whose
products are ONNX Runtime's 4-bit ``MatMulNBits`` (groups of 32 input columns, each with a float32 scale and
a 4-bit zero point; activations in int8, accuracy level 4), with the norms, RoPE and the attention over the
cache in the same graph: one call a step instead of some twenty torch ops a layer. The embedding and the
int8 output layer stay torch's (``LeanLM``). A draft's representation only: it changes what the draft
proposes, never what the target verifies. Float zero points, which would hold a GGUF Q4_K block exactly,
take a dequantising path 25x slower in ONNX Runtime 1.32, so the weights are quantised again (min-max).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from .lm import LeanCache, LeanLM, ids_tensor
from .quant import release_memory

GROUP = 32           # input columns sharing a scale and zero point
ORT_FORMAT = 1       # bump when the graph or the weights' layout changes: the cache key carries it


class NBits(NamedTuple):
    """A linear layer's weights as ``MatMulNBits`` takes them: ``q`` (N, K/32, 16) uint8, two 4-bit levels a
    byte, the first low; ``scales`` (N, K/32) float32; ``zeros`` (N, ceil(K/64)) uint8, two zero points a
    byte; ``bias`` (N,) or None. A weight is (q - zero) * scale."""
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bias: torch.Tensor | None = None


def quantize_nbits(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``NBits``' q, scales and zeros of a float weight (N, K): per group its range widened to hold 0 (as
    ONNX Runtime's own quantiser does), 15 levels across it, the zero point on a level."""
    n, k = weight.shape
    if k % group:
        raise ValueError(f"a {n}x{k} weight cannot be held in groups of {group} columns")
    w = weight.detach().float().view(n, k // group, group)
    lo, hi = w.amin(-1, keepdim=True).clamp(max=0), w.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    zero = (-lo / scale).round_().clamp_(0, 15)
    q = (w / scale + zero).round_().clamp_(0, 15).to(torch.uint8)
    z = zero.view(n, -1).to(torch.uint8)
    z = torch.cat([z, z.new_zeros(n, z.shape[1] % 2)], 1)
    return ((q[..., 0::2] | (q[..., 1::2] << 4)).contiguous(), scale.view(n, -1).contiguous(),
            (z[:, 0::2] | (z[:, 1::2] << 4)).contiguous())


def dequantize_nbits(nb: NBits) -> torch.Tensor:
    """The float weights (N, K) that ``nb`` holds."""
    q = torch.stack([nb.q & 15, nb.q >> 4], -1).flatten(-2).float()                # (N, K/32, 32)
    z = torch.stack([nb.zeros & 15, nb.zeros >> 4], -1).flatten(-2)[:, :q.shape[1]].float()
    return ((q - z[..., None]) * nb.scales[..., None]).flatten(1)


@functools.cache
def ort_missing() -> str | None:
    """None where ONNX Runtime and ``MatMulNBits`` run here (checked once on a small product), else why not."""
    try:
        import onnx  # noqa: F401 - builds the graph
        import onnxruntime  # noqa: F401
    except ImportError as e:
        return f"{e.name or 'onnxruntime'} is not installed"
    try:
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(16, 64, generator=g), torch.randn(2, 64, generator=g)
        nb = NBits(*quantize_nbits(w))
        from onnx import TensorProto, helper
        b = _Builder()
        y = b.matmul("x", nb, "w")
        graph = helper.make_graph(b.nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], b.inits)
        got = _session(graph, 1).run(None, {"x": x.numpy()})[0]
    except Exception as e:      # noqa: BLE001 - any failure means: not here
        return f"ONNX Runtime's MatMulNBits does not run here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if not np.allclose(got, (x @ dequantize_nbits(nb).t()).numpy(), atol=0.1, rtol=0.05):   # int8 activations
        return "ONNX Runtime's MatMulNBits gives wrong products here"
    return None


def ort_version() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


def _session(graph, threads: int):
    import onnxruntime as ort
    from onnx import helper
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")   # torch runs between the calls
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


class _Builder:
    """Nodes and initialisers of a graph, each output named once."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def init(self, name: str, arr) -> str:
        from onnx import numpy_helper
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def __call__(self, op: str, ins: list[str], outs: int | list[str] = 1, domain: str = "", **attrs):
        from onnx import helper
        self.n += 1
        names = outs if isinstance(outs, list) else [f"{op}_{self.n}_{i}" for i in range(outs)]
        self.nodes.append(helper.make_node(op, ins, names, domain=domain, **attrs))
        return names[0] if isinstance(outs, list) or len(names) == 1 else names     # named: the first

    def ints(self, *v: int) -> str:
        return self.init(f"c{len(self.inits)}", np.array(v, dtype=np.int64))

    def matmul(self, x: str, nb: NBits, name: str) -> str:
        n, blocks = nb.scales.shape
        y = self("MatMulNBits", [x, self.init(f"{name}.q", nb.q.numpy()), self.init(f"{name}.s", nb.scales.numpy()),
                                 self.init(f"{name}.z", nb.zeros.numpy())], domain="com.microsoft",
                 K=blocks * GROUP, N=n, bits=4, block_size=GROUP, accuracy_level=4)
        return y if nb.bias is None else self("Add", [y, self.init(f"{name}.b", nb.bias.float().numpy())])


def draft_graph(lm: LeanLM):
    """The decoder layers of ``lm`` (weights ``NBits``) and its final norm as one graph. Inputs: ``x`` (T, hidden)
    the embedded tokens, ``cos``/``sin`` (T, 1, D), ``mask`` (T, S + T) added to the scores, ``past_k``/``past_v``
    (S, layers, KV, D) the cache; outputs: ``hidden`` (T, hidden) normed, ``k``/``v`` (T, layers, KV, D) to
    append to it."""
    from onnx import TensorProto, helper
    b = _Builder()
    nh, nkv, d, hidden, inter = lm.n_heads, lm.n_kv, lm.head_dim, lm._hidden_shape[0], lm.inter
    eps = float(lm.eps)
    x, res, ks, vs = "x", None, [], []
    for li, (ln1, qkv, o, ln2, gu, down) in enumerate(lm.layers):
        w1 = b.init(f"l{li}.ln1", ln1.float().numpy())
        if res is None:
            h, res = b("SimplifiedLayerNormalization", [x, w1], epsilon=eps, axis=-1), x
        else:
            h, res = b("SkipSimplifiedLayerNormalization", [x, res, w1], [f"h{li}", "", "", f"r{li}"],
                       domain="com.microsoft", epsilon=eps), f"r{li}"
        t = b("Reshape", [b.matmul(h, qkv, f"l{li}.qkv"), b.ints(-1, nh + 2 * nkv, d)])
        qk, v = b("Split", [t, b.ints(nh + nkv, nkv)], 2, axis=1)
        x1, x2 = b("Split", [qk, b.ints(d // 2, d // 2)], 2, axis=2)
        rot = b("Concat", [b("Neg", [x2]), x1], axis=2)
        qk = b("Add", [b("Mul", [qk, "cos"]), b("Mul", [rot, "sin"])])
        q, k = b("Split", [qk, b.ints(nh, nkv)], 2, axis=1)
        ks.append(b("Unsqueeze", [k, b.ints(1)]))
        vs.append(b("Unsqueeze", [v, b.ints(1)]))
        layer = b.init(f"c{li}.layer", np.array(li, dtype=np.int64))                         # a scalar: drops the axis
        kk = b("Concat", [b("Gather", ["past_k", layer], axis=1), k], axis=0)                 # (S+T, KV, D)
        vv = b("Concat", [b("Gather", ["past_v", layer], axis=1), v], axis=0)
        kt = b("Reshape", [b("Transpose", [kk], perm=[1, 2, 0]), b.ints(nkv, 1, d, -1)])      # (KV, 1, D, S+T)
        vt = b("Reshape", [b("Transpose", [vv], perm=[1, 0, 2]), b.ints(nkv, 1, -1, d)])      # (KV, 1, S+T, D)
        q4 = b("Transpose", [b("Reshape", [q, b.ints(-1, nkv, nh // nkv, d)])], perm=[1, 2, 0, 3])  # (KV, G, T, D)
        s = b("Add", [b("Mul", [b("MatMul", [q4, kt]), b.init(f"c{li}.scale", np.float32(lm.scaling))]), "mask"])
        a = b("MatMul", [b("Softmax", [s], axis=-1), vt])                                      # (KV, G, T, D)
        a = b("Reshape", [b("Transpose", [a], perm=[2, 0, 1, 3]), b.ints(-1, nh * d)])
        w2 = b.init(f"l{li}.ln2", ln2.float().numpy())
        h, res = b("SkipSimplifiedLayerNormalization", [b.matmul(a, o, f"l{li}.o"), res, w2],
                   [f"g{li}", "", "", f"s{li}"], domain="com.microsoft", epsilon=eps), f"s{li}"
        g, u = b("Split", [b.matmul(h, gu, f"l{li}.gu"), b.ints(inter, inter)], 2, axis=1)
        x = b.matmul(b("Mul", [b("Mul", [g, b("Sigmoid", [g])]), u]), down, f"l{li}.down")
    b("SkipSimplifiedLayerNormalization", [x, res, b.init("norm", lm.norm.float().numpy())], ["hidden"],
      domain="com.microsoft", epsilon=eps)
    b("Concat", ks, ["k"], axis=1)
    b("Concat", vs, ["v"], axis=1)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("x", f, ["T", hidden]), helper.make_tensor_value_info("cos", f, ["T", 1, d]),
           helper.make_tensor_value_info("sin", f, ["T", 1, d]), helper.make_tensor_value_info("mask", f, ["T", "A"]),
           *(helper.make_tensor_value_info(n, f, ["S", lm.n_layers, nkv, d]) for n in ("past_k", "past_v"))]
    outs = [helper.make_tensor_value_info("hidden", f, ["T", hidden]),
            *(helper.make_tensor_value_info(n, f, ["T", lm.n_layers, nkv, d]) for n in ("k", "v"))]
    return helper.make_graph(b.nodes, "draft", ins, outs, b.inits)


class OrtLM(LeanLM):
    """A lean draft whose decoder layers run as one ONNX Runtime call (``draft_graph``); its cache is
    (capacity, layers, KV, D), so that what it holds and what a pass appends are each one contiguous block
    the session reads and writes in place (IOBinding)."""

    @classmethod
    def from_lean(cls, lm: LeanLM, threads: int | None = None) -> OrtLM:
        """From a ``LeanLM`` whose layers hold ``NBits``; the weights move into the session."""
        out = cls.__new__(cls)
        out.__dict__.update(lm.__dict__)
        out.session = _session(draft_graph(lm), threads or torch.get_num_threads())
        out.layers = lm.layers = []  # held by the session now
        release_memory()             # the graph's copies of the weights
        return out

    def new_cache(self, capacity: int = 256) -> LeanCache:
        shape = (capacity, self.n_layers, self.n_kv, self.head_dim)
        return LeanCache(torch.zeros(shape), torch.zeros(shape))

    def _grow(self, cache: LeanCache, need: int) -> None:
        cap = cache.k.shape[0]
        if need > cap:
            grown = self.new_cache(max(need, 2 * cap))
            grown.k[:cache.n], grown.v[:cache.n] = cache.k[:cache.n], cache.v[:cache.n]
            cache.k, cache.v = grown.k, grown.v

    def int8_per_row(self) -> int:
        return 0

    @torch.inference_mode()
    def forward_many(self, caches: list[LeanCache], ids: list, keeps: list[int]) -> list[torch.Tensor]:
        return [self._forward(c, i, k) for c, i, k in zip(caches, ids, keeps)]

    def _forward(self, cache: LeanCache, ids, keep: int) -> torch.Tensor:
        ids = ids_tensor(ids, "cpu")
        t, s = ids.numel(), cache.n
        self._grow(cache, s + t)
        x = self.embed[ids].to(torch.float32).contiguous()
        cos, sin = self._rope(torch.arange(s, s + t))
        mask = torch.zeros(t, s + t)
        if t > 1:
            mask[:, s:] = torch.full((t, t), float("-inf")).triu_(1)
        out = torch.empty(t, self._hidden_shape[0])
        bind = self.session.io_binding()
        for name, arr in (("x", x), ("cos", cos.contiguous()), ("sin", sin.contiguous()), ("mask", mask),
                          ("past_k", cache.k[:s]), ("past_v", cache.v[:s])):
            bind.bind_input(name, "cpu", 0, np.float32, tuple(arr.shape), arr.data_ptr())
        for name, arr in (("hidden", out), ("k", cache.k[s:s + t]), ("v", cache.v[s:s + t])):
            bind.bind_output(name, "cpu", 0, np.float32, tuple(arr.shape), arr.data_ptr())
        self.session.run_with_iobinding(bind)
        cache.n = s + t
        return self.head(out[-keep:]).float()
