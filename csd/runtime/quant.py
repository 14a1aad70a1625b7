"""How a model's weights are held: a float dtype, or dynamic int8 (CPU), smoothed first (``csd.runtime.smoothing``).
``to_repr`` turns a float32 transformers model into one of ``TARGET_REPRS``; nothing here loads a model.
"""
from __future__ import annotations

import functools
import gc
import warnings

import torch

from ..representation import ACTIVATIONS
from .smoothing import smooth

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_DRAFT_REPRS = ("int8", "ort4")     # a lean CPU draft's weights (ort4: csd.runtime.ortlm)
RETIRED_DRAFT_REPRS = {"int4": "ort4"}  # torch's int4 draft, slower than ort4 where both ran: its flag runs ort4
TARGET_REPRS = ("float32", "bfloat16", "float16", "int8", "ov4")   # ov4: 4-bit on OpenVINO (csd.runtime.ovlm)
BUILD_THREADS = max(1, min(4, torch.get_num_threads()))
INT8_ACTIVATIONS = ACTIVATIONS    # an int8 target's activations scaled per token ("row": SD == AR) or per pass
INT8_ACTIVATIONS_DEFAULT = "pass"


def in_threads(fn, items: list) -> list:
    """``[fn(x) for x in items]`` on up to ``BUILD_THREADS`` threads (quantising and packing release the GIL)."""
    n = min(BUILD_THREADS, len(items))
    if n <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(n, thread_name_prefix="csd-build") as ex:
        return list(ex.map(fn, items))


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation (per-channel weights, one activation scale a pass) of every Linear layer."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    def quantize(m: torch.nn.Module) -> torch.nn.Module:
        with warnings.catch_warnings():   # torch.ao's deprecation notices: the API still works in torch 2.13
            warnings.simplefilter("ignore")
            return quantize_dynamic(m, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                    inplace=True)   # in place: no second float copy of the weights in memory

    model = model.float()
    # the decoder blocks (the longest ModuleList) one per thread, then what is left
    blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len, default=None)
    if blocks is not None:
        in_threads(quantize, list(blocks))
    return quantize(model)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows and one float32 scale per row: the very values ``quantize_int8`` makes of a weight."""
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
    """The per-channel quantised tensor torch's int8 ops take, from int8 ``rows`` and their ``scales``."""
    with warnings.catch_warnings():      # torch's notice that quantised tensors move to torchao: they work in 2.13
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(rows.contiguous(), scales.double(),
                                                        torch.zeros(rows.shape[0], dtype=torch.long), 0)


class RowInt8Linear(torch.nn.Module):
    """A dynamic int8 linear layer whose activations are quantised per row (token), not per pass
    (docs/exactness.md): each row is divided by its largest magnitude and two sentinel columns, +1 and
    -1 with zero weights, fix every pass's range, so a row's result is the same whatever else is in the
    pass. ``per_row = False`` feeds the rows as they are: one scale a pass, as torch's dynamic layer."""

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
    """Hand freed memory back to the system (glibc keeps the pages of dropped weights otherwise).
    ``collect``: run the garbage collector first."""
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
    """The model in a representation; ``copy`` keeps the original; ``maxima`` (int8): smooth with these first."""
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
