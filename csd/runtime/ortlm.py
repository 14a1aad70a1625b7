"""The draft on ONNX Runtime (issue 52, ``--draft-dtype ort4``): its decoder layers as one ONNX graph of 4-bit
``MatMulNBits`` products (``GROUPS``, a float32 scale and 4-bit zero point a group; int8 activations, accuracy
level 4), the norms and ``GroupQueryAttention`` (RoPE, attention over the cache, appended in place): one call a
step, not some twenty torch ops a layer. The embedding and int8 output layer stay torch's (``LeanLM``). It changes
what the draft proposes, never what the target verifies. Float zero points (a GGUF Q4_K block exactly) take a
dequantising path 25x slower in ONNX Runtime 1.32, so the weights are quantised again."""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from .lm import LeanCache, LeanLM, ids_tensor
from .quant import release_memory

GROUPS = (128, 32)   # input columns sharing a scale and zero point: the first that divides a weight's columns
ORT_FORMAT = 2       # bump when the cached weights' layout changes (the key carries it; the graph is built at load)


class NBits(NamedTuple):
    """A linear layer's weights as ``MatMulNBits`` takes them, in groups of G columns: ``q`` (N, K/G, G/2)
    uint8, two 4-bit levels a byte, the first low; ``scales`` (N, K/G) float32; ``zeros`` (N, ceil(K/G/2))
    uint8, two zero points a byte; ``bias`` (N,) or None. A weight is (q - zero) * scale."""
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bias: torch.Tensor | None = None


def quantize_nbits(weight: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``NBits``' q, scales and zeros of a weight (N, K) in groups of ``group`` columns (default: the first of
    ``GROUPS`` dividing K): each group's range widened to hold 0 (as ONNX Runtime does), 15 levels, zero on one."""
    n, k = weight.shape
    group = group or next((g for g in GROUPS if k % g == 0), GROUPS[-1])
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
    q = torch.stack([nb.q & 15, nb.q >> 4], -1).flatten(-2).float()                # (N, K/G, G)
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


def _session(graph, threads: int, weights: dict | None = None):
    """A session of ``graph``; ``weights``: the arrays its external initialisers name, taken in place."""
    import onnxruntime as ort
    from onnx import helper
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")   # torch runs between the calls
    so.log_severity_level = 3
    if weights:
        so.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


class _Builder:
    """Nodes and initialisers of a graph, each output named once."""

    def __init__(self, external: bool = False):
        self.nodes, self.inits, self.n = [], [], 0
        self.weights: dict[str, np.ndarray] | None = {} if external else None    # held outside the graph

    def init(self, name: str, arr) -> str:
        from onnx import TensorProto, helper, numpy_helper
        if self.weights is None or (arr := np.ascontiguousarray(arr)).size < 4096:
            self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:           # a placeholder, never read: the session takes the array itself (``_session``)
            self.inits.append(TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype),
                                          dims=arr.shape, data_location=TensorProto.EXTERNAL,
                                          external_data=[{"key": "location"}]))
            self.weights[name] = arr
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
        (n, blocks), group = nb.scales.shape, 2 * nb.q.shape[2]
        y = self("MatMulNBits", [x, self.init(f"{name}.q", nb.q.numpy()), self.init(f"{name}.s", nb.scales.numpy()),
                                 self.init(f"{name}.z", nb.zeros.numpy())], domain="com.microsoft",
                 K=blocks * group, N=n, bits=4, block_size=group, accuracy_level=4)
        return y if nb.bias is None else self("Add", [y, self.init(f"{name}.b", nb.bias.float().numpy())])


def draft_graph(lm: LeanLM):
    """The decoder layers of ``lm`` (weights ``NBits``) and its final norm as one graph, and the weights its
    external initialisers name (``_session`` hands them over). Inputs: ``x`` (1, T, hidden)
    the embedded tokens, ``seqlens_k`` (1,) and ``total_len`` () int32 (tokens held after the pass, less one, and
    all), ``cos``/``sin`` (capacity, D/2) and each layer's cache ``past_k{i}``/``past_v{i}`` (1, KV, capacity, D);
    outputs ``hidden`` (1, T, hidden) normed and ``present_k{i}``/``present_v{i}``: bound to the cache's own
    memory, ``GroupQueryAttention`` (RoPE, causal attention over the cache) writes the new keys and values in place."""
    from onnx import TensorProto, helper
    nh, nkv, d, hidden, inter = lm.n_heads, lm.n_kv, lm.head_dim, lm._hidden_shape[0], lm.inter
    if d % 16:
        raise ValueError(f"ONNX Runtime's GroupQueryAttention needs a head size that is a multiple of 16, not {d}")
    b = _Builder(external=True)
    eps = float(lm.eps)
    x, res = "x", None
    for li, (ln1, qkv, o, ln2, gu, down) in enumerate(lm.layers):
        w1 = b.init(f"l{li}.ln1", ln1.float().numpy())
        if res is None:
            h, res = b("SimplifiedLayerNormalization", [x, w1], epsilon=eps, axis=-1), x
        else:
            h, res = b("SkipSimplifiedLayerNormalization", [x, res, w1], [f"h{li}", "", "", f"r{li}"],
                       domain="com.microsoft", epsilon=eps), f"r{li}"
        a = b("GroupQueryAttention", [b.matmul(h, qkv, f"l{li}.qkv"), "", "", f"past_k{li}", f"past_v{li}", "seqlens_k",
                                      "total_len", "cos", "sin"], [f"a{li}", f"present_k{li}", f"present_v{li}"],
              domain="com.microsoft", num_heads=nh, kv_num_heads=nkv, do_rotary=1, rotary_interleaved=0,
              scale=float(lm.scaling))
        w2 = b.init(f"l{li}.ln2", ln2.float().numpy())
        h, res = b("SkipSimplifiedLayerNormalization", [b.matmul(a, o, f"l{li}.o"), res, w2],
                   [f"g{li}", "", "", f"s{li}"], domain="com.microsoft", epsilon=eps), f"s{li}"
        g, u = b("Split", [b.matmul(h, gu, f"l{li}.gu"), b.ints(inter, inter)], 2, axis=-1)
        x = b.matmul(b("Mul", [b("Mul", [g, b("Sigmoid", [g])]), u]), down, f"l{li}.down")
    b("SkipSimplifiedLayerNormalization", [x, res, b.init("norm", lm.norm.float().numpy())], ["hidden"],
      domain="com.microsoft", epsilon=eps)
    f, kv = TensorProto.FLOAT, [1, nkv, "C", d]
    ins = [helper.make_tensor_value_info("x", f, [1, "T", hidden]),
           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
           helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
           *(helper.make_tensor_value_info(n, f, ["C", d // 2]) for n in ("cos", "sin")),
           *(helper.make_tensor_value_info(f"past_{c}{i}", f, kv) for i in range(lm.n_layers) for c in "kv")]
    outs = [helper.make_tensor_value_info("hidden", f, [1, "T", hidden]),
            *(helper.make_tensor_value_info(f"present_{c}{i}", f, kv) for i in range(lm.n_layers) for c in "kv")]
    return helper.make_graph(b.nodes, "draft", ins, outs, b.inits), b.weights


class GraphLM(LeanLM):
    """A lean model whose layers run as one call of another runtime (``OrtLM``, ``csd.runtime.ovlm.OvLM``): each
    sequence of a pass is its own call (``_forward``), and the rows are whatever that runtime makes them."""

    def int8_per_row(self) -> int:
        return 0

    @torch.inference_mode()
    def forward_many(self, caches: list[LeanCache], ids: list, keeps: list[int]) -> list[torch.Tensor]:
        return [self._forward(c, ids_tensor(i, "cpu"), k) for c, i, k in zip(caches, ids, keeps)]


class OrtLM(GraphLM):
    """A lean draft whose decoder layers run as one ONNX Runtime call (``draft_graph``); its cache is
    (layers, 1, KV, capacity, D), each layer's block bound as both the past and the present of its attention
    (IOBinding), so the session appends to it in place; ``cos``/``sin`` ride along, one row a position."""

    @classmethod
    def from_lean(cls, lm: LeanLM, threads: int | None = None) -> OrtLM:
        """From a ``LeanLM`` whose layers hold ``NBits``; the weights move into the session."""
        out = cls.__new__(cls)
        out.__dict__.update(lm.__dict__)
        graph, out.weights = draft_graph(lm)
        out.session = _session(graph, threads or torch.get_num_threads(), out.weights)
        out.layers = lm.layers = []  # held by the session now
        release_memory()             # the float copies made on the way
        return out

    def new_cache(self, capacity: int = 256) -> LeanCache:
        shape = (self.n_layers, 1, self.n_kv, capacity, self.head_dim)
        cache = LeanCache(torch.zeros(shape), torch.zeros(shape))
        freqs = torch.outer(torch.arange(capacity, dtype=torch.float32), self.inv_freq)
        cache.rope = freqs.cos().contiguous(), freqs.sin().contiguous()
        return cache

    def _grow(self, cache: LeanCache, need: int) -> None:
        cap = cache.k.shape[3]
        if need > cap:
            grown = self.new_cache(max(need, 2 * cap))
            grown.k[..., :cache.n, :], grown.v[..., :cache.n, :] = cache.k[..., :cache.n, :], cache.v[..., :cache.n, :]
            cache.k, cache.v, cache.rope = grown.k, grown.v, grown.rope

    def _forward(self, cache: LeanCache, ids: torch.Tensor, keep: int) -> torch.Tensor:
        t, s = ids.numel(), cache.n
        self._grow(cache, s + t)
        x = self.embed[ids].to(torch.float32).contiguous()
        lens = torch.tensor([s + t - 1], dtype=torch.int32), torch.tensor(s + t, dtype=torch.int32)
        out = torch.empty(1, t, self._hidden_shape[0])
        bind = self.session.io_binding()
        for name, arr, typ in (("x", x, np.float32), ("seqlens_k", lens[0], np.int32), ("total_len", lens[1], np.int32),
                               ("cos", cache.rope[0], np.float32), ("sin", cache.rope[1], np.float32)):
            bind.bind_input(name, "cpu", 0, typ, (1, *arr.shape) if name == "x" else tuple(arr.shape), arr.data_ptr())
        shape = tuple(cache.k.shape[1:])
        for i in range(self.n_layers):
            for c, buf in (("k", cache.k[i]), ("v", cache.v[i])):
                bind.bind_input(f"past_{c}{i}", "cpu", 0, np.float32, shape, buf.data_ptr())
                bind.bind_output(f"present_{c}{i}", "cpu", 0, np.float32, shape, buf.data_ptr())
        bind.bind_output("hidden", "cpu", 0, np.float32, tuple(out.shape), out.data_ptr())
        self.session.run_with_iobinding(bind)
        cache.n = s + t
        return self.head(out[0, -keep:]).float()
