"""Products on a GGUF file's own blocks (Q4_K and Q6_K, and a small model's Q4_0, Q5_0 and Q8_0), one token's row
at a time: the kernel ``kernels/kquant.c``, compiled for this CPU on first use and called through ctypes.

A weight keeps the file's integers and scales (w = d * sc * q - dmin * m for Q4_K, w = d * sc * q for Q6_K,
w = d * q for the blocks of 32); the activations are quantised per row and 256 columns (32 for the blocks of 32)
to int8, as llama.cpp does. Every row of a product is computed by the same instructions whatever the number of
rows or threads, so a verify pass gives each token exactly what a 1-token pass gives it (``tests/test_kquant.py``).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import torch

from .hugepages import Arena
from .kblocks import BLOCK, KNOWN, PACK, Q4_0, Q4_K, TILE
from .lm import LeanLM

SOURCE = Path(__file__).with_name("kernels") / "kquant.c"
log = logging.getLogger(__name__)


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or run here (no C compiler, or a build that fails)."""


# -- the compiled kernel -------------------------------------------------------------------------------
_libs: dict[str, ctypes.CDLL] = {}
# how each build of the kernel is compiled: for this CPU (AVX-512 VNNI, else AVX2, else plain C), its plain C loops,
# and its AVX2 path on a CPU that has AVX-512 too (the tests hold the three to the same rules and bits)
VARIANTS = {"native": ["-march=native"], "portable": [], "avx2": ["-march=native", "-mno-avx512f"]}
# which build the models run on: "native" unless the environment asks for another, to measure the AVX2 path on a
# CPU with AVX-512 (docs/cpu.md, "The AVX2 path"); the choice is part of the engine's digest (csd.runtime.profile)
VARIANT_ENV = "CSD_KQUANT_VARIANT"
_lock = threading.Lock()


def _build_dir() -> Path:
    from ..fileio import cache_dir
    return cache_dir() / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def library(variant: str | None = None):
    """The compiled kernel (built once per source and CPU into the cache), or KernelUnavailable. ``variant``: one of
    ``VARIANTS``; by default ``CSD_KQUANT_VARIANT``, else "native"."""
    variant = variant or os.environ.get(VARIANT_ENV) or "native"
    if variant not in VARIANTS:
        raise KernelUnavailable(f"{VARIANT_ENV}={variant!r} names no build of the k-quant kernel: one of "
                                f"{', '.join(VARIANTS)}")
    with _lock:
        if variant in _libs:
            return _libs[variant]
        cc = _compiler()
        if cc is None:
            raise KernelUnavailable("no C compiler (cc or gcc) on PATH to build the k-quant kernel")
        # -ffp-contract=off: a multiply and an add stay two roundings in every build (one with FMA would fuse them
        # where one without could not), so the builds give the same bits
        flags = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", *VARIANTS[variant]]
        key = hashlib.sha256(SOURCE.read_bytes() + " ".join([cc, *flags]).encode() + _cpu_flags().encode())
        out = _build_dir() / f"kquant-{key.hexdigest()[:16]}.so"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            done = subprocess.run([cc, *flags, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True)
            if done.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise KernelUnavailable(f"building the k-quant kernel failed: {done.stderr.strip()[:400]}")
            os.replace(tmp, out)
        lib = ctypes.CDLL(str(out))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.kq_simd.restype = i32
        lib.kq_linear.argtypes = [p, i64, i64, p, i32, p, i64, i32]
        lib.kq_attend.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, i32]
        lib.kq_layer.argtypes = [p, i64, i64, p, i64, i64, i64, i64, i32, p, p, p, p, p, i64, p, ctypes.c_float,
                                 ctypes.c_float, i32]
        lib.kq_layer.restype = None
        lib.kq_rms.argtypes = [p, p, p, i64, i64, ctypes.c_float]
        lib.kq_rms.restype = None
        lib.kq_linear.restype = None
        _libs[variant] = lib
        return lib


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def simd_width() -> int:
    """512 where the kernel runs on AVX-512 VNNI, 256 on AVX2 (with FMA and F16C), else 0 (its portable C loops:
    correct, slow)."""
    return int(library().kq_simd())


def kernel_missing() -> str | None:
    """Why ``--dtype gguf`` should not run here (the target then runs in int8), or None where it can."""
    try:
        width = simd_width()
    except (KernelUnavailable, OSError) as e:
        return str(e)
    if width == 0 and not os.environ.get("CSD_KQUANT_PORTABLE"):
        return ("this CPU has neither AVX-512 VNNI nor AVX2, and the k-quant kernel's portable loops are slower than "
                "int8 (CSD_KQUANT_PORTABLE=1 runs them anyway)")
    return None


# -- the product ------------------------------------------------------------------------------------


PACK_ROWS = 2048       # rows repacked at a time: a large matrix's integers unpacked whole took a first start past 4 GB


def _pack(qtype: int, raw, arena: Arena | None) -> dict[str, torch.Tensor]:
    """``PACK[qtype]`` of ``raw``'s rows, ``PACK_ROWS`` at a time (whole tiles), each piece written straight into
    its place in the arena (or in ordinary memory without one): a whole copy of the result never exists twice."""
    n = raw.shape[0]
    if n <= PACK_ROWS:
        packed = PACK[qtype](np.asarray(raw))
        return packed if arena is None else {k: arena.place(v) for k, v in packed.items()}
    tiles = -(-n // TILE)
    out: dict[str, torch.Tensor] = {}
    at = 0                          # tiles written so far
    for i in range(0, n, PACK_ROWS):
        piece = PACK[qtype](np.asarray(raw[i:i + PACK_ROWS]))
        step = -(-min(PACK_ROWS, n - i) // TILE)
        for k, v in piece.items():  # every packed tensor holds its rows' tiles along its first dimension
            per_tile = v.shape[0] // step
            if k not in out:
                shape = (tiles * per_tile, *v.shape[1:])
                out[k] = arena.empty(shape, v.dtype) if arena is not None else torch.empty(shape, dtype=v.dtype)
            out[k][at * per_tile:(at + step) * per_tile] = v
        at += step
    return out


class KQuantPart:
    """One GGUF matrix in the kernel's layout: its type, packed blocks and shape."""

    def __init__(self, qtype: int, raw: np.ndarray, in_features: int, arena: Arena | None = None):
        if qtype not in PACK:
            raise ValueError(f"the k-quant kernel takes {', '.join(KNOWN.values())}, not ggml type {qtype}")
        if in_features % BLOCK[qtype]:
            raise ValueError(f"{KNOWN[qtype]} rows hold whole blocks of {BLOCK[qtype]} values, not {in_features}")
        self.qtype, self.in_features, self.out_features = qtype, in_features, raw.shape[0]
        self.packed = _pack(qtype, raw, arena)      # in the arena: on 2 MB pages where Linux gives them
        self.padded = self.out_features + (-self.out_features % TILE)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.packed.values())


class _Part(ctypes.Structure):
    """``kq_part`` of kernels/kquant.c: one matrix of a fused product, by address."""
    _fields_ = [("qtype", ctypes.c_int32), ("n", ctypes.c_int64), ("col", ctypes.c_int64),
                ("qw", ctypes.c_void_p), ("sc", ctypes.c_void_p), ("mn", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("dmin", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


class _LayerWeights(ctypes.Structure):
    """``kq_layer_w`` of kernels/kquant.c: a decoder layer's norms and fused products, by address."""
    _fields_ = [("ln1", ctypes.c_void_p), ("ln2", ctypes.c_void_p), ("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("gu", ctypes.c_void_p), ("down", ctypes.c_void_p), ("n_qkv", ctypes.c_int32), ("n_o", ctypes.c_int32),
                ("n_gu", ctypes.c_int32), ("n_down", ctypes.c_int32)]


class KQuantLinear(torch.nn.Module):
    """``y = x @ W.T + bias`` with W the rows of one or more GGUF matrices (fused q/k/v, gate/up), each held
    as the file's own blocks of one family (Q4_K/Q6_K, or Q4_0/Q5_0/Q8_0). The activations are quantised once for
    all of them."""

    def __init__(self, parts: list[KQuantPart], bias: torch.Tensor | None = None, variant: str | None = None):
        super().__init__()
        if len({p.in_features for p in parts}) != 1:
            raise ValueError("fused k-quant matrices must take the same input width")
        if len({BLOCK[p.qtype] for p in parts}) != 1:
            raise ValueError("fused matrices must share a block family (Q4_K/Q6_K, or Q5_0/Q8_0)")
        self.parts, self.bias = parts, bias
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.padded = sum(p.padded for p in parts)
        self.lib = library(variant)
        # the parts as the kernel's records, made once: a call passes one address (biases padded to the tiles)
        biases = bias.to(torch.float32).split([p.out_features for p in parts]) if bias is not None else None
        self._biases, col = [], 0
        self._parts = (_Part * len(parts))()
        for i, p in enumerate(parts):
            b = None
            if biases is not None:
                b = torch.zeros(p.padded)
                b[:p.out_features] = biases[i]
                self._biases.append(b)
            k = p.packed
            self._parts[i] = _Part(p.qtype, p.padded, col, k["qw"].data_ptr(),
                                   k["sc"].data_ptr() if "sc" in k else None,
                                   k["m"].data_ptr() if "m" in k else None, k["d"].data_ptr(),
                                   k["dmin"].data_ptr() if "dmin" in k else None,
                                   b.data_ptr() if b is not None else None)
            col += p.padded

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.to(torch.float32).contiguous()
        rows = x2.shape[0]
        y = torch.empty((rows, self.padded), dtype=torch.float32)
        self.lib.kq_linear(x2.data_ptr(), rows, self.in_features, self._parts, len(self.parts), y.data_ptr(),
                           self.padded, torch.get_num_threads())
        if self.padded != self.out_features:
            keep, at = [], 0
            for p in self.parts:
                keep.append(y[:, at:at + p.out_features])
                at += p.padded
            y = torch.cat(keep, 1)
        return y.reshape(*shape[:-1], self.out_features)


# -- a whole decoder from a GGUF file -----------------------------------------------------------------
class KQuantLM(LeanLM):
    """A ``LeanLM`` whose products run on the GGUF's blocks and whose attention computes each query on its own
    in the kernel (``kq_attend``): a pass of any length gives each token what a 1-token step gives it."""

    impl = "kquant"

    def layer_records(self) -> None:
        """Each layer's weights as one record the kernel's ``kq_layer`` reads (made once)."""
        self._records = []
        for ln1, qkv, o, ln2, gu, down in self.layers:
            mods = (qkv, o, gu, down)
            if not all(isinstance(m, KQuantLinear) and m.padded == m.out_features for m in mods):
                self._records = None
                return
            self._records.append(_LayerWeights(
                ln1.data_ptr(), ln2.data_ptr(), *(ctypes.addressof(m._parts) for m in mods),
                *(len(m.parts) for m in mods)))
        self._inv_freq = self.inv_freq.to(torch.float32).contiguous()

    @torch.inference_mode()
    def forward_many(self, caches: list, ids: list, keeps: list[int]) -> list[torch.Tensor]:
        """Every decoder layer in one kernel call (``kq_layer``): the rows of all sequences together in the
        products, each sequence's own positions, cache and attention."""
        if getattr(self, "_records", None) is None:
            return super().forward_many(caches, ids, keeps)
        from ..protocols import ids_tensor
        ids = [ids_tensor(i, self._device) for i in ids]
        lens = [int(i.numel()) for i in ids]
        starts = [c.n for c in caches]
        for c, s, t in zip(caches, starts, lens):
            self._grow(c, s + t)
        x = self.embed[torch.cat(ids)].to(torch.float32).contiguous()            # (T, hidden)
        n = len(caches)
        offs = [0]
        for t in lens:
            offs.append(offs[-1] + t)
        i64 = ctypes.c_int64
        off, start = (i64 * (n + 1))(*offs), (i64 * n)(*starts)
        cap = (i64 * n)(*(c.k.shape[2] for c in caches))
        kb = (ctypes.c_void_p * n)(*(c.k.data_ptr() for c in caches))
        vb = (ctypes.c_void_p * n)(*(c.v.data_ptr() for c in caches))
        lib, threads = library(), torch.get_num_threads()
        for li, rec in enumerate(self._records):
            lib.kq_layer(x.data_ptr(), offs[-1], x.shape[1], ctypes.byref(rec), self.n_heads, self.n_kv,
                         self.head_dim, self.inter, n, off, start, kb, vb, cap, li, self._inv_freq.data_ptr(),
                         self.eps, self.scaling, threads)
        for c, s, t in zip(caches, starts, lens):
            c.n = s + t
        x = x[None]
        if n == 1:
            return [self.logits(x, keeps[0])]
        rows = torch.cat([torch.arange(b - k, b, device=self._device) for b, k in zip(offs[1:], keeps)])
        return list(self.logits(x[:, rows], len(rows)).split(keeps))

    def logits(self, x: torch.Tensor, keep: int) -> torch.Tensor:
        """The last norm in the kernel (``kq_rms``, the layers' own), then the output layer on its blocks: no step of
        the model is left to PyTorch's kernels, whose sums differ between AVX2 and AVX-512 CPUs."""
        rows = x[0, -keep:].to(torch.float32).contiguous()
        normed = torch.empty_like(rows)
        norm = self.norm.to(torch.float32).contiguous()
        library().kq_rms(rows.data_ptr(), norm.data_ptr(), normed.data_ptr(), rows.shape[0], rows.shape[1], self.eps)
        return self.head(normed).float()

    def _attend(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, start: int) -> torch.Tensor:
        _, h, t, d = q.shape
        q = q[0].contiguous()                                           # (H, t, D)
        out = torch.empty((1, t, h, d), dtype=torch.float32)
        lib = library()
        lib.kq_attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), h, k.shape[1], t, d,
                      k.shape[2], start, self.scaling, torch.get_num_threads())
        return out.transpose(1, 2)                                      # (1, H, t, D), as the callers read it

FOUR_BIT = (Q4_0, Q4_K)         # what a four-bit draft keeps as the file has it


class FourBitStore:
    """A draft's matrices re-rounded to Q4_0, kept in the cache (one safetensors file a model): gguf's quantiser
    took about 6 s a load for the embedded draft. Each entry holds a digest of the bytes it was rounded from, so a
    matrix whose bytes (or kept rows) changed is rounded again, never misread."""

    def __init__(self, f):
        from ..fileio import cache_dir
        self.path = cache_dir() / "q4_0" / f"{f.path.stem[:40]}-{f.digest('general.')[:16]}.safetensors"
        self.have: dict[str, tuple[str, np.ndarray]] = {}
        self.made: dict[str, tuple[str, np.ndarray]] = {}
        try:
            from safetensors import safe_open
            with safe_open(str(self.path), framework="np") as sf:
                digests = sf.metadata() or {}
                self.have = {k: (digests.get(k, ""), sf.get_tensor(k)) for k in sf.keys()}
        except Exception:           # none yet, or unreadable (a killed write, another format): rounded again
            self.have = {}

    def q4_0(self, name: str, raw: np.ndarray, weights) -> np.ndarray:
        """``name``'s Q4_0 bytes for its file bytes ``raw``, from the store or rounded now from ``weights()``."""
        import gguf
        from gguf.quants import quantize
        raw = np.ascontiguousarray(raw)
        digest = f"{hashlib.blake2b(raw.data, digest_size=16).hexdigest()}-{raw.shape[0]}"
        kept = self.have.get(name)
        if kept is not None and kept[0] == digest:
            return kept[1]
        q = np.asarray(quantize(weights(), gguf.GGMLQuantizationType.Q4_0))
        self.made[name] = (digest, q)
        return q

    def save(self) -> None:
        """Write what was rounded now beside what still holds (one file, replaced whole)."""
        if not self.made:
            return
        from safetensors.numpy import save_file
        entries = self.have | self.made
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            save_file({k: np.ascontiguousarray(a) for k, (_, a) in entries.items()}, str(tmp),
                      metadata={k: d for k, (d, _) in entries.items()})
            os.replace(tmp, self.path)
        except OSError as e:        # a full or read-only cache: the next load rounds again
            tmp.unlink(missing_ok=True)
            log.warning("cannot keep the 4-bit draft in %s (%s)", self.path.parent, e)


ARCHITECTURES = ("qwen2",)      # the tensor names and layouts this reader knows (llama permutes q and k rows)


def gguf_refusal(f) -> str | None:
    """Why the k-quant path cannot run this GGUF file (``csd.runtime.ggufile.GGUFFile``), or None."""
    arch = f.fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        return f"{f.path.name}: architecture {arch!r} (the k-quant path reads {', '.join(ARCHITECTURES)})"
    for name, t in f.tensors.items():
        if name.endswith(".weight") and len(t.shape) == 2 and name != "token_embd.weight" and t.qtype not in KNOWN:
            import gguf
            kind = gguf.GGMLQuantizationType(t.qtype).name
            return f"{f.path.name}: tensor {name} is {kind} (the k-quant path computes on {', '.join(KNOWN.values())})"
    return None


def lean_from_gguf(path, vocab_ids: torch.Tensor | None = None, four_bit: bool = False):
    """The decoder of a GGUF file as a ``LeanLM`` whose products run on the file's own blocks; ``vocab_ids``: the
    output rows kept (a draft's reduced vocabulary). ``four_bit`` (a draft only): its matrices of more than 4 bits
    a weight re-rounded to Q4_0 by gguf's own quantiser, to read fewer bytes a step."""
    from .embedded import gguf_config
    from .ggufile import GGUFFile
    from .pair import ModelLoadError
    f = GGUFFile(path)
    if why := gguf_refusal(f):
        raise ModelLoadError(why)
    config = gguf_config(f)

    store = FourBitStore(f) if four_bit else None
    arena = Arena()                 # every matrix of the model, one after another, on 2 MB pages where possible

    def part(name: str, rows=None) -> KQuantPart:
        t = f.tensors[name]
        raw = f.raw(name) if rows is None else f.raw(name)[rows]
        if store is not None and t.qtype not in FOUR_BIT:
            return KQuantPart(Q4_0, store.q4_0(name, raw, lambda: f.dequantize(name, rows)), t.shape[1], arena)
        return KQuantPart(t.qtype, raw, t.shape[1], arena)

    def floats(name: str) -> torch.Tensor | None:
        return torch.from_numpy(f.dequantize(name)) if name in f.tensors else None

    def biases(names: list[str]) -> torch.Tensor | None:
        got = [floats(n) for n in names]
        if all(b is None for b in got):
            return None
        sizes = [f.tensors[n.replace(".bias", ".weight")].shape[0] for n in names]
        return torch.cat([b if b is not None else torch.zeros(s) for b, s in zip(got, sizes)])

    try:
        lm = _decoder(f, config, part, floats, biases, vocab_ids)
    except ValueError as e:       # a fused product of two block families, a row that is no whole number of blocks
        raise ModelLoadError(f"{f.path.name}: {e}") from None
    if store is not None:
        store.save()
    return lm


def _decoder(f, config, part, floats, biases, vocab_ids):
    import gguf

    from .convert import QuantisedRows
    layers = []
    for i in range(config.num_hidden_layers):
        b = f"blk.{i}."
        qkv = [b + "attn_q", b + "attn_k", b + "attn_v"]
        layers.append((floats(b + "attn_norm.weight"),
                       KQuantLinear([part(n + ".weight") for n in qkv], biases([n + ".bias" for n in qkv])),
                       KQuantLinear([part(b + "attn_output.weight")]),
                       floats(b + "ffn_norm.weight"),
                       KQuantLinear([part(b + "ffn_gate.weight"), part(b + "ffn_up.weight")]),
                       KQuantLinear([part(b + "ffn_down.weight")])))
    head_name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    rows = None if vocab_ids is None else vocab_ids.numpy()
    head = KQuantLinear([part(head_name, rows)])
    emb = f.tensors["token_embd.weight"]
    embed = QuantisedRows(torch.from_numpy(np.array(f.raw("token_embd.weight"))),
                          gguf.GGMLQuantizationType(emb.qtype).name, emb.shape[1])
    lm = KQuantLM.from_parts(config, embed, layers, floats("output_norm.weight"), head, vocab_ids)
    lm.layer_records()
    lm.per_row = True          # rows exact end to end (the kernel attends each query on its own whatever per_row says)
    return lm
