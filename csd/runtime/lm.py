"""The calls the decode loop makes on a model (``new_cache``, ``forward``, ``crop``). ``HFLM`` wraps a transformers
causal LM and its ``DynamicCache`` (the float32 reference: greedy SD equals ``generate``). ``LeanLM`` is a gpt-fast
style path for Llama-family models: fused QKV and gate/up projections, a preallocated cache cropped by moving its
length, a draft's reduced-vocabulary output layer. An int8 target's fused projections stack the same int8 rows and
scales, so it computes what the transformers int8 model computes (``tests/test_target_impl.py``)."""
from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..protocols import ids_tensor
from .quant import RowInt8Linear, in_threads, int8_weight, quantize_int8, release_memory
from .smoothing import heads

log = logging.getLogger(__name__)


class LM:
    """A causal LM as the decode loop sees it. ``vocab_ids`` is None for a full output layer, else
    the token id of each logit row (a reduced vocabulary). ``length`` and ``crop`` serve a cache that
    counts its tokens in ``n`` (the lean and static paths'); ``HFLM`` has its own."""
    vocab_ids: torch.Tensor | None = None
    impl = "hf"
    captures = 0       # graphs captured so far (csd.runtime.static): a block that captured one is not a cost sample

    def new_cache(self):
        raise NotImplementedError

    def forward(self, cache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        """Feed ``ids`` (a list, or a 1-D tensor on the model's device) after what ``cache`` holds;
        float32 logits of the last ``keep`` positions, (keep, V)."""
        raise NotImplementedError

    def length(self, cache) -> int:
        return cache.n

    def crop(self, cache, length: int) -> None:
        """Drop everything after the first ``length`` tokens (those are overwritten before a query sees them)."""
        if not 0 <= length <= cache.n:
            raise ValueError(f"cannot crop a cache of {cache.n} tokens to {length}")
        cache.n = length

    def release(self, cache) -> None:
        """The run that made ``cache`` is over (a batched model stops waiting for it: ``csd.runtime.batch``)."""

    @property
    def device(self) -> torch.device:
        raise NotImplementedError


class HFLM(LM):
    """A transformers model with a ``DynamicCache``; sliding-window layers record their past so that a
    rollback can restore them (``crop_dynamic_cache``)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"   # transformers 5.2x / older

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().out_features)

    def new_cache(self):
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        cache.activate_past_recording()     # a no-op for full-attention layers
        return cache

    def forward(self, cache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        x = ids_tensor(ids, self.model.device).view(1, -1)
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{self._cache_kwarg: cache})
        return out.logits[0].float()

    def length(self, cache) -> int:
        return cache.get_seq_length()

    def crop(self, cache, length: int) -> None:
        crop_dynamic_cache(cache, length)


def crop_dynamic_cache(cache, length: int) -> None:
    """Keep the first ``length`` tokens of a transformers ``DynamicCache`` by slicing each layer. Not
    ``DynamicCache.crop``: its argument changed meaning across releases (5.24: minus the tokens to drop;
    before: the length to keep). A layer of another kind uses its own ``crop``, checked."""
    held = cache.get_seq_length()
    if not 0 <= length <= held:
        raise ValueError(f"cannot crop a cache of {held} tokens to {length}")
    from transformers import cache_utils
    full, sliding = getattr(cache_utils, "DynamicLayer", None), getattr(cache_utils, "DynamicSlidingWindowLayer", None)
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.dim() < 3 or keys.numel() == 0:
            continue                         # holds nothing (not reached yet, or a layer that shares another's cache)
        if type(layer) is full:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]
        elif type(layer) is sliding:
            _crop_sliding(layer, length)
        else:
            layer.crop(length - layer.get_seq_length())
            if layer.get_seq_length() != length:
                import transformers
                raise RuntimeError(f"{type(layer).__name__}.crop of transformers {transformers.__version__} left "
                                   f"{layer.get_seq_length()} tokens where {length} were asked for")
    if cache.get_seq_length() != length:
        raise RuntimeError(f"cropping the cache to {length} tokens left {cache.get_seq_length()}")


def _crop_sliding(layer, length: int) -> None:
    """A ``DynamicSlidingWindowLayer`` holds the last ``keys.shape[-2]`` of ``cumulative_length``
    positions; keep those before ``length``, at most the window's last ``sliding_window - 1``."""
    held, stored, window = layer.cumulative_length, layer.keys.shape[-2], layer.sliding_window
    kept = max(0, stored - (held - length))  # stored positions that lie before ``length``
    if kept < min(length, window - 1):
        raise RuntimeError(f"a sliding-window layer holding {stored} of {held} positions cannot be cropped to "
                           f"{length}: it did not record its past (activate_past_recording)")
    start = max(0, kept - (window - 1))
    layer.keys, layer.values = layer.keys[..., start:kept, :], layer.values[..., start:kept, :]
    layer.cumulative_length = length


# -- the lean path -------------------------------------------------------------------------------
LEAN_MODEL_TYPES = ("qwen2", "llama")


def lean_unsupported(cfg) -> str | None:
    """None if ``LeanLM`` can run a model of this transformers config, else why not (then ``HFLM`` runs it)."""
    if getattr(cfg, "model_type", None) not in LEAN_MODEL_TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r} (only the default RoPE is implemented)"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    return None


@dataclass
class LeanCache:
    k: torch.Tensor        # (layers, kv_heads, capacity, head_dim)
    v: torch.Tensor
    n: int = 0             # tokens held


PER_QUERY_MAX = 40      # passes of up to this many tokens run their attention per query when per_row (verify passes)


def _is_int8(mod: torch.nn.Module) -> bool:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    return isinstance(mod, DynamicInt8Linear)


class PackedInt8Linear(torch.nn.Module):
    """torch's dynamic int8 ``Linear`` (version 4) on weights packed once, without its constructor (which
    packs a full-size placeholder first) and its per-call checks."""

    def __init__(self, packed, out_features: int):
        super().__init__()
        self.packed, self.out_features = packed, out_features

    @classmethod
    def from_int8(cls, rows: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> PackedInt8Linear:
        """From int8 rows and their per-row scales (``csd.runtime.quant.quantize_rows``), packed once."""
        return cls(torch.ops.quantized.linear_prepack(int8_weight(rows, scales), bias), rows.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


def _fuse(mods: list[torch.nn.Module], int8: bool) -> torch.nn.Module:
    """One Linear whose output rows are those of ``mods`` in order; dynamic int8 modules are fused by
    stacking their int8 rows and scales as they are, so the product computes what they compute."""
    if len(mods) == 1 and (_is_int8(mods[0]) or not int8):
        return mods[0]                      # nothing to fuse or quantise: the module serves as it is
    if all(_is_int8(m) for m in mods):
        ws = [m.weight() for m in mods]
        if any(w.qscheme() != torch.per_channel_affine for w in ws):
            raise ValueError("only per-channel int8 weights can be fused")
        w = torch._make_per_channel_quantized_tensor(
            torch.cat([x.int_repr() for x in ws]), torch.cat([x.q_per_channel_scales() for x in ws]),
            torch.cat([x.q_per_channel_zero_points() for x in ws]), 0)
        return PackedInt8Linear(torch.ops.quantized.linear_prepack(w, _cat_bias([m.bias() for m in mods])), w.shape[0])
    if not int8 and all(type(m) is torch.nn.Linear for m in mods):
        return _shared(mods)
    return _linear(torch.cat([m.weight for m in mods]), _cat_bias([m.bias for m in mods]), int8)


@torch.no_grad()
def _shared(mods: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One float Linear over the rows of ``mods``, whose weights become views of it (held once)."""
    w, b = torch.cat([m.weight for m in mods]), _cat_bias([m.bias for m in mods])
    sizes = [m.weight.shape[0] for m in mods]
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    if b is not None:
        lin.bias = torch.nn.Parameter(b, requires_grad=False)
    for m, wm, bm in zip(mods, w.split(sizes), b.split(sizes) if b is not None else [None] * len(mods)):
        m.weight = torch.nn.Parameter(wm, requires_grad=False)
        if bm is not None:
            m.bias = torch.nn.Parameter(bm, requires_grad=False)
    return lin.eval()


def _cat_bias(biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    return torch.cat(biases) if all(b is not None for b in biases) else None


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, int8: bool) -> torch.nn.Module:
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                          device=weight.device)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return quantize_int8(torch.nn.Sequential(lin))[0].eval() if int8 else lin.eval()


class LeanLM(LM):
    """A Llama-family decoder computing what its transformers model computes, with fewer, fused calls.
    ``vocab_ids``: the output rows kept (logit row i is token vocab_ids[i]); ``int8``: dynamic int8 layers."""

    impl = "lean"

    def __init__(self, model: torch.nn.Module, vocab_ids: torch.Tensor | None = None, int8: bool = False):
        if why := lean_unsupported(model.config):
            raise ValueError(f"the lean path cannot run this model: {why}")
        base = model.model

        def build(layer):
            with torch.no_grad():      # grad mode is per thread
                a, m = layer.self_attn, layer.mlp
                return (layer.input_layernorm.weight.detach(),
                        _fuse([a.q_proj, a.k_proj, a.v_proj], int8),
                        _fuse([a.o_proj], int8),                    # an int8 module is used as it is
                        layer.post_attention_layernorm.weight.detach(),
                        _fuse([m.gate_proj, m.up_proj], int8),
                        _fuse([m.down_proj], int8))

        layers = in_threads(build, list(base.layers))
        with torch.no_grad():
            vocab_ids = None if vocab_ids is None else vocab_ids.to(torch.long).to(model.device)
            head = model.get_output_embeddings()
            if _is_int8(head) and vocab_ids is not None:
                raise ValueError("a reduced vocabulary needs the float output layer")
            if not _is_int8(head):
                rows = head.weight if vocab_ids is None else head.weight.index_select(0, vocab_ids)
                head = _linear(rows.detach(), None, int8)
        self._setup(model.config, base.embed_tokens.weight.detach(), layers, base.norm.weight.detach(), head,
                    vocab_ids, next(model.parameters()).dtype, model.device)

    @classmethod
    def from_parts(cls, config, embed, layers: list[tuple], norm: torch.Tensor, head, vocab_ids=None,
                   dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> LeanLM:
        """A decoder from its parts (``csd.runtime.convert``): ``embed[ids]`` gives rows, each layer is (input norm,
        fused q/k/v, o, post-attention norm, fused gate/up, down), ``head`` the output layer."""
        lm = cls.__new__(cls)
        lm._setup(config, embed, layers, norm, head, vocab_ids, dtype, torch.device(device))
        return lm

    def _setup(self, cfg, embed, layers, norm, head, vocab_ids, dtype, device) -> None:
        self.n_heads, self.n_kv, self.head_dim = heads(cfg)
        self.scaling, self.eps = self.head_dim ** -0.5, cfg.rms_norm_eps
        self.dtype, self._device = dtype, device
        self.embed, self.layers, self.norm, self.head, self.vocab_ids = embed, layers, norm, head, vocab_ids
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                       device=self._device) / self.head_dim))
        self.n_layers, self.q_size, self.inter = len(self.layers), self.n_heads * self.head_dim, cfg.intermediate_size
        self.per_row = False     # int8_per_row(): a verify pass computes what 1-token steps compute
        self._hidden_shape = (cfg.hidden_size,)

    @property
    def vocab_size(self) -> int:
        """Rows of logits a pass returns (the reduced vocabulary's size where there is one)."""
        return int(self.vocab_ids.numel()) if self.vocab_ids is not None else int(self.head.out_features)

    @property
    def device(self) -> torch.device:
        return self._device

    def int8_per_row(self) -> int:
        """Make a pass of a few tokens compute bit for bit what 1-token steps compute (docs/exactness.md):
        int8 activations scaled per token (``csd.runtime.quant.RowInt8Linear``), and a pass of up to
        ``PER_QUERY_MAX`` tokens attends one query at a time. Returns how many layers changed."""
        def dynamic(m) -> bool:     # one to convert: not a norm weight, a float layer, or one converted before
            return isinstance(m, PackedInt8Linear) or _is_int8(m)

        changed = sum(dynamic(m) for layer in self.layers for m in layer) + dynamic(self.head)
        for i, layer in enumerate(self.layers):      # one layer at a time: its old packed weights go first
            self.layers[i] = tuple(RowInt8Linear.from_dynamic(m) if dynamic(m) else m for m in layer)
        if dynamic(self.head):
            self.head = RowInt8Linear.from_dynamic(self.head)
        release_memory()
        self.int8_rows(True)
        return changed

    def int8_rows(self, on: bool) -> None:
        """Switch converted layers between per-token scales (exact) and one scale per pass
        (``--int8-activations pass``), without touching the weights."""
        self.per_row = on
        for m in [*(m for layer in self.layers for m in layer), self.head]:
            if isinstance(m, RowInt8Linear):
                m.per_row = on

    def new_cache(self, capacity: int = 256) -> LeanCache:
        shape = (self.n_layers, self.n_kv, capacity, self.head_dim)
        return LeanCache(torch.zeros(shape, dtype=self.dtype, device=self._device),
                         torch.zeros(shape, dtype=self.dtype, device=self._device))

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # one fused kernel: 2x faster on the CPU than transformers' five elementwise ops, same values
        return F.rms_norm(x, self._hidden_shape, w, self.eps)

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the positions ``pos`` (T,), shaped (T, 1, D) to apply over all heads."""
        freqs = torch.outer(pos.to(torch.float32), self.inv_freq)               # (T, D/2)
        emb = torch.cat((freqs, freqs), -1)[:, None]                            # (T, 1, D)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((x[..., half:].neg(), x[..., :half]), -1) * sin

    def rows(self, cache: LeanCache, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the keys and values of the first ``n`` tokens ``cache`` holds (``csd.runtime.prompt_rows``)."""
        return cache.k[:, :, :n].clone(), cache.v[:, :, :n].clone()

    def load_rows(self, cache: LeanCache, k: torch.Tensor, v: torch.Tensor) -> None:
        """An empty ``cache`` takes the keys and values ``rows`` gave, as if it had read their tokens."""
        n = k.shape[2]
        self._grow(cache, n)
        cache.k[:, :, :n] = k
        cache.v[:, :, :n] = v
        cache.n = n

    def _grow(self, cache: LeanCache, need: int) -> None:
        cap = cache.k.shape[2]
        if need > cap:
            pad = (0, 0, 0, max(need, 2 * cap) - cap)
            cache.k, cache.v = F.pad(cache.k, pad), F.pad(cache.v, pad)

    def layers_over(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, write, attend,
                    rotate=None) -> torch.Tensor:
        """The decoder blocks over ``x`` (1, T, hidden); ``write(layer, k, v)`` stores keys and values
        (KV, T, D), ``attend(layer, q)`` attends the queries (1, H, T, D), ``rotate(x, cos, sin)`` applies
        RoPE (default ``_rotate``): where ``csd.runtime.static`` differs."""
        t = x.shape[1]
        h_q, h_qk = self.n_heads, self.n_heads + self.n_kv
        rotate = rotate or self._rotate
        for li, (ln1, qkv, o, ln2, gate_up, down) in enumerate(self.layers):
            h = qkv(self._rms(x, ln1)).view(t, h_qk + self.n_kv, self.head_dim)    # (T, H + 2 KV, D)
            qk = rotate(h[:, :h_qk], cos, sin)                    # queries and keys rotated in one go
            write(li, qk[:, h_q:].transpose(0, 1), h[:, h_qk:].transpose(0, 1))
            a = attend(li, qk[:, :h_q].transpose(0, 1)[None])                          # (1, H, T, D)
            x = x + o(a.transpose(1, 2).reshape(1, t, self.q_size))
            gu = gate_up(self._rms(x, ln2))
            x = x + down(F.silu(gu[..., :self.inter]) * gu[..., self.inter:])
        return x

    def logits(self, x: torch.Tensor, keep: int) -> torch.Tensor:
        """float32 logits of the last ``keep`` positions of the blocks' output (1, T, hidden)."""
        return self.head(self._rms(x[0, -keep:], self.norm)).float()               # (keep, V or len(vocab_ids))

    def forward(self, cache: LeanCache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
        return self.forward_many([cache], [ids], [keep])[0]

    @torch.inference_mode()
    def forward_many(self, caches: list[LeanCache], ids: list, keeps: list[int]) -> list[torch.Tensor]:
        """``forward`` for several sequences in one pass (``csd.runtime.batch``): their tokens are the rows of one
        product per layer, each with its own positions, cache and attention. A row's result is independent
        of the others only where the layers are per-row exact (``int8_per_row``)."""
        ids = [ids_tensor(i, self._device) for i in ids]
        lens = [i.numel() for i in ids]
        starts = [c.n for c in caches]
        for c, s, t in zip(caches, starts, lens):
            self._grow(c, s + t)
        x = self.embed[torch.cat(ids)][None]                                          # (1, T, hidden)
        pos = [torch.arange(s, s + t, device=self._device) for s, t in zip(starts, lens)]
        cos, sin = self._rope(torch.cat(pos))
        offs = [0, *itertools.accumulate(lens)]

        def write(li, k, v):
            for c, s, a, b in zip(caches, starts, offs, offs[1:]):
                c.k[li, :, s:s + b - a] = k[:, a:b]
                c.v[li, :, s:s + b - a] = v[:, a:b]

        def attend(li, q):
            parts = [self._attend(c.k[li:li + 1], c.v[li:li + 1], q[:, :, a:b], s)
                     for c, s, a, b in zip(caches, starts, offs, offs[1:])]
            return parts[0] if len(parts) == 1 else torch.cat(parts, 2)

        x = self.layers_over(x, cos, sin, write, attend)
        for c, s, t in zip(caches, starts, lens):
            c.n = s + t
        if len(caches) == 1:
            return [self.logits(x, keeps[0])]
        rows = torch.cat([torch.arange(b - k, b, device=self._device) for b, k in zip(offs[1:], keeps)])
        return list(self.logits(x[:, rows], len(rows)).split(keeps))

    def _attend(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, start: int) -> torch.Tensor:
        """The attention of one sequence's queries (1, H, t, D) over its cache, ``start`` tokens before them."""
        t = q.shape[2]
        end = start + t
        if self.per_row and 1 < t <= PER_QUERY_MAX:     # each query as a 1-token step computes it
            return torch.cat([F.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :start + i + 1],
                                                             v[:, :, :start + i + 1], scale=self.scaling,
                                                             enable_gqa=True) for i in range(t)], 2)
        # causal within the new tokens, everything cached is visible
        mask = torch.ones(t, end, dtype=torch.bool, device=self._device).tril(start) if t > 1 else None
        return F.scaled_dot_product_attention(q, k[:, :, :end], v[:, :, :end], attn_mask=mask,
                                              scale=self.scaling, enable_gqa=True)
