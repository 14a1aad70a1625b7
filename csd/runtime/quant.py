"""How a model's weights are held: a float dtype, or dynamic int8 (CPU), smoothed first (``csd.runtime.smoothing``).
``to_repr`` turns a float32 transformers model into one of ``TARGET_REPRS``; nothing here loads a model.
"""
from __future__ import annotations

import functools
import gc
import os
import threading
import warnings
from collections import Counter

import torch

from ..representation import ACTIVATIONS
from .smoothing import smooth

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# a lean CPU draft's weights (ort4: csd.runtime.ortlm; gguf: its GGUF file's own blocks, csd.runtime.kquant; q4_0:
# those blocks re-rounded to 4 bits, Q4_0, on the same kernel)
CPU_DRAFT_REPRS = ("int8", "ort4", "gguf", "q4_0")
RETIRED_DRAFT_REPRS = {"int4": "ort4"}  # torch's int4 draft, slower than ort4 where both ran: its flag runs ort4
# gguf: the GGUF file's own Q4_K / Q6_K blocks (csd.runtime.kquant); ov4: 4-bit on OpenVINO (csd.runtime.ovlm)
TARGET_REPRS = ("float32", "bfloat16", "float16", "int8", "gguf", "ov4")
CPU_TARGET_REPRS = ("int8", "gguf", "ov4")
BUILD_THREADS = max(1, min(4, torch.get_num_threads()))
INT8_ACTIVATIONS = ("auto", *ACTIVATIONS)   # auto: "row" (exact: greedy SD == AR) on every CPU; "pass" is opt-in
INT8_ACTIVATIONS_DEFAULT = "auto"


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


ROW_SCALE = float(torch.tensor(2 / 127))   # the scale fbgemm's dynamic op picks for a pass spanning [-1, 1]
KERNEL = os.environ.get("CSD_INT8_KERNEL", "auto")   # "fbgemm": never oneDNN (to measure both: docs/cpu.md)
PROBE_ROWS = (*range(1, 17), 24, 32, 40)    # the pass lengths a probe compares: verify passes up to gamma 15, and more
_EXACT: dict[tuple[int, int], bool] = {}
_PROBING = threading.Lock()         # the load builds layers on several threads: one probe a shape


def onednn_exact(rows: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether ``RowInt8Linear`` runs on oneDNN at this shape: a product of 7 rows costs it what one costs (fbgemm
    1.5x). oneDNN picks its kernel by shape and CPU, and some round a row by the others (small products, on the
    Xeon), so a shape goes to oneDNN only where its first layer gives fbgemm's bits in passes of ``PROBE_ROWS``."""
    if KERNEL == "fbgemm" or not hasattr(torch.ops.onednn, "qlinear_prepack"):
        return False
    shape = tuple(rows.shape)
    with _PROBING:
        if shape not in _EXACT:
            x = torch.randn(max(PROBE_ROWS), rows.shape[1], generator=torch.Generator().manual_seed(0)) * 3
            try:
                fb, od = (RowInt8Linear(rows, scales, None, onednn) for onednn in (False, True))
                _EXACT[shape] = all(torch.equal(fb.rows_as(per_row)(x[:m]), od.rows_as(per_row)(x[:m]))
                                    for per_row in (True, False) for m in PROBE_ROWS)
            except RuntimeError:         # no oneDNN int8 kernel on this CPU
                _EXACT[shape] = False
        return _EXACT[shape]


class RowInt8Linear(torch.nn.Module):
    """A dynamic int8 linear layer whose activations are quantised per row (token), not per pass
    (docs/exactness.md): each row is divided by its largest magnitude and two sentinel columns, +1 and
    -1 with zero weights, fix every pass's range, so a row's result is the same whatever else is in the
    pass. ``per_row = False`` feeds the rows as they are: one scale a pass, as torch's dynamic layer.
    On oneDNN (``onednn_exact``) the rows are quantised as fbgemm quantises them, without the sentinels."""

    def __init__(self, rows: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 onednn: bool | None = None):
        super().__init__()
        self.out_features, self.in_features = rows.shape
        self.bias = None if bias is None else bias.detach().to(torch.float32)
        self.per_row, self.onednn = True, onednn_exact(rows, scales) if onednn is None else onednn
        if self.onednn:
            self.packed = torch.ops.onednn.qlinear_prepack(rows.contiguous(), None)
            self.scales, self.zeros = scales.to(torch.float32), torch.zeros(self.out_features, dtype=torch.long)
            return
        pad = -(self.in_features + 2) % 8 + 2
        padded = torch.zeros(self.out_features, self.in_features + pad, dtype=torch.int8)
        padded[:, :self.in_features] = rows           # the only copy of the rows before they are packed
        self.packed = torch.ops.quantized.linear_prepack(int8_weight(padded, scales), None)
        self.sentinel = torch.zeros(1, pad)
        self.sentinel[0, :2] = torch.tensor([1.0, -1.0])

    def rows_as(self, per_row: bool) -> RowInt8Linear:
        self.per_row = per_row          # per token (True) or per pass
        return self

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
        s = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30) if self.per_row else None
        if self.onednn:     # fbgemm's quantisation (torch's op rounds as its kernel does), then oneDNN's product
            q = (torch.quantize_per_tensor(rows / s, ROW_SCALE, 64, torch.quint8) if self.per_row
                 else torch.quantize_per_tensor_dynamic(rows, torch.quint8, True))
            y = torch.ops.onednn.qlinear_pointwise(q.int_repr(), q.q_scale(), q.q_zero_point(), self.packed,
                                                   self.scales, self.zeros, None, 1.0, 0, torch.float32, "none", [], "")
        else:
            xs = [rows / s, self.sentinel.expand(len(rows), -1)] if self.per_row else \
                [rows, rows.new_zeros(len(rows), self.sentinel.shape[1])]
            y = torch.ops.quantized.linear_dynamic(torch.cat(xs, 1), self.packed, True)
        if self.per_row:
            y.mul_(s)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


def int8_kernels(lm) -> dict[str, int]:
    """How many of a lean model's int8 products run on each kernel, for every result's record."""
    mods = [*(m for layer in getattr(lm, "layers", ()) for m in layer), getattr(lm, "head", None)]
    return dict(Counter("onednn" if getattr(m, "onednn", False) else "fbgemm" for m in mods if hasattr(m, "packed")))


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
