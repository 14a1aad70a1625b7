"""How a model's weights are held: a float dtype, or dynamic int8 (CPU), smoothed first.

``to_repr`` turns a float32 transformers model into one of ``TARGET_REPRS``. For int8 it folds the
activation maxima into the weights first when it is given them (``csd.smoothing``, SmoothQuant),
then replaces every Linear layer by torch's dynamic int8 one (``quantize_int8``). The lean decode
path (``csd.lm``) quantises its fused layers with the same call, and builds them a layer per thread
(``in_threads``). Nothing here loads a model or knows a pair: the loader (``csd.models``) and the
measurements (``csd.profile``) call it.
"""
from __future__ import annotations

import functools

import torch

from .smoothing import smooth

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# How the target's weights are held: a float dtype, or int8 (dynamic int8 Linear layers, CPU only).
TARGET_REPRS = ("float32", "bfloat16", "float16", "int8")
BUILD_THREADS = max(1, min(4, torch.get_num_threads()))
# How an int8 target scales its activations: "row" (per token: RowInt8Linear; a verify pass computes
# for each token what a 1-token step does, so greedy SD == AR) or "pass" (torch's dynamic op: one scale
# for all the tokens of a pass).
INT8_ACTIVATIONS = ("row", "pass")
INT8_ACTIVATIONS_DEFAULT = "pass"


def in_threads(fn, items: list) -> list:
    """``[fn(x) for x in items]`` on up to ``BUILD_THREADS`` threads: quantising and packing weights
    runs in ATen ops that release the GIL and use one core each, so a layer per core builds a model
    1.5x faster on 2 cores (the same results: each layer is built by the same calls)."""
    n = min(BUILD_THREADS, len(items))
    if n <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(n, thread_name_prefix="csd-build") as ex:
        return list(ex.map(fn, items))


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation (per-channel weights) of every Linear layer. Activations are
    quantised per pass with one scale for the whole pass, so a 7-token verify pass and a 1-token
    step round differently: greedy SD may differ from AR in this representation (measured, not
    assumed; float32 is the exact reference)."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    def quantize(m: torch.nn.Module) -> torch.nn.Module:
        with warnings.catch_warnings():   # torch.ao's deprecation notices: the API still works in torch 2.13
            warnings.simplefilter("ignore")
            return quantize_dynamic(m, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                    inplace=True)   # in place: no second float copy of the weights in memory

    model = model.float()
    # the decoder blocks (the longest ModuleList) one per thread, then what is left (the output layer):
    # each block is quantised by the same call as in one pass over the model, so the weights are too
    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len, default=None)
    if blocks is not None:
        in_threads(quantize, list(blocks))
    return quantize(model)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows and one float32 scale per row (symmetric, zero point 0): what ``quantize_int8`` makes of a
    Linear layer's weight (torch's per-channel weight observer), so that a layer converted on its own
    (``csd.convert``) holds the very int8 values of the whole-model path."""
    import warnings

    from torch.ao.quantization.observer import PerChannelMinMaxObserver
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    w = weight.detach().float()
    obs(w)
    scales, zero_points = obs.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scales.double(), zero_points, 0, torch.qint8)
    return q.int_repr(), scales.to(torch.float32)


def int8_weight(rows: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The per-channel quantised tensor torch's int8 ops take, from int8 ``rows`` and their ``scales``
    (symmetric: zero points 0)."""
    import warnings
    with warnings.catch_warnings():      # torch's notice that quantised tensors move to torchao: they work in 2.13
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(rows.contiguous(), scales.double(),
                                                        torch.zeros(rows.shape[0], dtype=torch.long), 0)


class RowInt8Linear(torch.nn.Module):
    """A dynamic int8 linear layer whose activations are quantised per row (per token), not per pass.

    torch's dynamic int8 op (``quantized::linear_dynamic``) takes one scale and zero point from the
    minimum and maximum of the whole input, so a token rounds differently next to other tokens: a
    7-token verify pass does not compute for a token what a 1-token step computes, and greedy SD can
    leave AR. Here each row is first divided by its own largest magnitude, and two input columns that
    hold +1 and -1 (with zero weights) are appended, so that every pass's minimum and maximum are
    exactly -1 and +1: the op's scale and zero point are the same for any pass, each row is rounded on
    its own, the int8 product is exact (int32), and the row's output is scaled back by its magnitude.
    A row's result is then the same bit for bit whatever else is in the pass. The weights are the
    dynamic layer's int8 values and scales, with zero columns appended (padded to a multiple of 8).

    ``per_row = False`` (the app's exact mode off) feeds the rows as they are, zero-padded: one scale
    for the pass, as torch's dynamic layer takes it (the same bits without a bias; with one, added
    after the product here and inside it there: within 1e-6)."""

    def __init__(self, rows: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = rows.shape
        pad = -(self.in_features + 2) % 8 + 2
        padded = torch.zeros(self.out_features, self.in_features + pad, dtype=torch.int8)
        padded[:, :self.in_features] = rows           # the only copy of the rows before they are packed
        self.packed = torch.ops.quantized.linear_prepack(int8_weight(padded, scales), None)
        self.sentinel = torch.zeros(1, pad)
        self.sentinel[0, :2] = torch.tensor([1.0, -1.0])
        self.bias = None if bias is None else bias.detach().to(torch.float32)
        self.per_row = True

    @classmethod
    def from_dynamic(cls, mod: torch.nn.Module) -> RowInt8Linear:
        """From torch's dynamic int8 Linear, or a module holding its packed weights as ``packed``."""
        packed = mod.packed if hasattr(mod, "packed") else mod._packed_params._packed_params
        w, b = torch.ops.quantized.linear_unpack(packed)
        if w.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric):
            raise ValueError("only per-channel int8 weights can be quantised per row")
        if bool((w.q_per_channel_zero_points() != 0).any()):
            raise ValueError("only symmetric int8 weights (zero points 0) can be quantised per row")
        return cls(w.int_repr(), w.q_per_channel_scales(), b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.per_row:
            s = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30)
            xs = torch.cat([rows / s, self.sentinel.expand(rows.shape[0], -1)], 1)
            y = torch.ops.quantized.linear_dynamic(xs, self.packed, True).mul_(s)
        else:
            xs = torch.cat([rows, rows.new_zeros(rows.shape[0], self.sentinel.shape[1])], 1)
            y = torch.ops.quantized.linear_dynamic(xs, self.packed, True)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


def release_memory(collect: bool = True) -> None:
    """Hand freed memory back to the system. After a candidate copy of a model is dropped, glibc keeps
    its pages (the quantising threads' arenas especially), and the next copy is placed beside them:
    choosing among three copies of the 1.5B target then held 21 GB resident on a 24 GB machine; packing a
    layer of int8 rows leaves twice its size freed but held. ``collect``: run the garbage collector first."""
    import gc

    if collect:
        gc.collect()
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):    # not glibc (macOS, Windows, musl): nothing to trim
        pass


@functools.cache
def _libc():
    import ctypes
    import ctypes.util
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def to_repr(model: torch.nn.Module, name: str, copy: bool = False,
            maxima: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The model in a representation (float dtypes cast; int8 quantised). ``copy`` keeps the original.
    ``maxima`` (int8 only): activation maxima to smooth the model with first (``csd.smoothing``)."""
    import copy as copy_mod
    m = copy_mod.deepcopy(model) if copy else model
    if name == "int8":
        if maxima is not None:
            smooth(m, maxima)
        return quantize_int8(m).eval()
    return m.to(DTYPES[name]).eval()


def memory_gib(device: torch.device) -> float | None:
    """Memory held now: allocated on a CUDA device, else this process's resident set (None where unknown)."""
    if device.type == "cuda":
        return round(torch.cuda.memory_allocated(device) / 2**30, 2)
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return round(kb / 2**20, 2)
    except (OSError, StopIteration, ValueError):
        return None
