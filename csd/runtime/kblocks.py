"""A GGUF file's blocks as their integers and scales, and repacked into the layout of the k-quant kernel
(``kernels/kquant.c``): tiles of 16 output rows by 4 input columns, so that one 512-bit register holds 64 weight
bytes. Nothing is rounded a second time: unpacked, the integers give back the ``gguf`` package's dequantised
weights bit for bit (``tests/test_kquant.py``)."""
from __future__ import annotations

import numpy as np
import torch

QK = 256
TILE = 16
Q4_0, Q5_0, Q8_0, Q4_K, Q6_K = 2, 6, 8, 12, 14        # ggml's type numbers
KNOWN = {Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
BLOCK = {Q4_0: 32, Q5_0: 32, Q8_0: 32, Q4_K: QK, Q6_K: QK}        # columns a row's blocks come in
B32_BYTES = {Q4_0: 18, Q5_0: 22, Q8_0: 34}             # bytes of a block of 32 columns
B32_OFFSET = {Q4_0: 8, Q5_0: 16, Q8_0: 128}            # w = d * (u - offset), u the stored unsigned integer


def _tiles(a: np.ndarray) -> np.ndarray:
    """(N, ...) -> (N/16, 16, ...) with N padded to a multiple of 16 by zero rows."""
    n = a.shape[0]
    pad = -n % TILE
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return a.reshape(-1, TILE, *a.shape[1:])


def q4k_unpack(raw: np.ndarray) -> dict[str, np.ndarray]:
    """A Q4_K tensor's bytes (N, K/256 * 144) as its integers: q (N, K) 0..15, sc and m (N, K/32) 0..63,
    d and dmin (N, K/256) float16 (w = d * sc * q - dmin * m)."""
    n = raw.shape[0]
    blk = raw.reshape(n, -1, 144)
    d = blk[..., 0:2].copy().view(np.float16)[..., 0]
    dmin = blk[..., 2:4].copy().view(np.float16)[..., 0]
    s = blk[..., 4:16].astype(np.uint8)
    sc = np.empty((*s.shape[:2], 8), np.uint8)
    m = np.empty_like(sc)
    sc[..., :4], m[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    m[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = blk[..., 16:144].reshape(n, -1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, -1)          # (chunk, low/high, 32): columns in order
    return {"q": q, "sc": sc.reshape(n, -1), "m": m.reshape(n, -1), "d": d, "dmin": dmin}


def q6k_unpack(raw: np.ndarray) -> dict[str, np.ndarray]:
    """A Q6_K tensor's bytes (N, K/256 * 210) as its integers: u = q + 32 (N, K) 0..63, sc (N, K/16) int8,
    d (N, K/256) float16 (w = d * sc * (u - 32))."""
    n = raw.shape[0]
    blk = raw.reshape(n, -1, 210)
    ql = blk[..., 0:128].reshape(n, -1, 2, 64)
    qh = blk[..., 128:192].reshape(n, -1, 2, 32)
    sc = blk[..., 192:208].copy().view(np.int8)
    d = blk[..., 208:210].copy().view(np.float16)[..., 0]
    lo, hi = ql[..., :32], ql[..., 32:]
    u = np.stack([(lo & 15) | ((qh & 3) << 4), (hi & 15) | (((qh >> 2) & 3) << 4),
                  (lo >> 4) | (((qh >> 4) & 3) << 4), (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=3)
    return {"u": u.reshape(n, -1).astype(np.uint8), "sc": sc.reshape(n, -1), "d": d}


def q4k_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    n, k = p["q"].shape
    q = p["q"].reshape(n, k // 32, 32).astype(np.float32)
    d = np.repeat(p["d"].astype(np.float32), 8, axis=1)[..., None]
    dm = np.repeat(p["dmin"].astype(np.float32), 8, axis=1)[..., None]
    return (d * p["sc"][..., None] * q - dm * p["m"][..., None]).reshape(n, k)


def q6k_dequantize(p: dict[str, np.ndarray]) -> np.ndarray:
    n, k = p["u"].shape
    u = p["u"].reshape(n, k // 16, 16).astype(np.float32) - 32
    d = np.repeat(p["d"].astype(np.float32), 16, axis=1)[..., None]
    return (d * p["sc"][..., None] * u).reshape(n, k)


def q4k_pack(raw: np.ndarray) -> dict[str, torch.Tensor]:
    """The kernel's layout of a Q4_K tensor (its bytes, N rows): the file's own nibble bytes, transposed."""
    n = raw.shape[0]
    blk = raw.reshape(n, -1, 144)
    nb = blk.shape[1]
    u = q4k_unpack(raw)
    qs = _tiles(blk[..., 16:144].reshape(n, nb, 4, 8, 4))                  # (T, 16, nb, p, i, c)
    qw = np.ascontiguousarray(qs.transpose(0, 2, 3, 4, 1, 5))              # (T, nb, p, i, 16, c)
    sc = np.ascontiguousarray(_tiles(u["sc"].reshape(n, nb, 8)).transpose(0, 2, 3, 1))   # (T, nb, 8, 16)
    m = np.ascontiguousarray(_tiles(u["m"].reshape(n, nb, 8)).transpose(0, 2, 3, 1))
    d = np.ascontiguousarray(_tiles(u["d"]).transpose(0, 2, 1))                          # (T, nb, 16)
    dmin = np.ascontiguousarray(_tiles(u["dmin"]).transpose(0, 2, 1))
    return {"qw": torch.from_numpy(qw), "sc": torch.from_numpy(sc), "m": torch.from_numpy(m),
            "d": torch.from_numpy(d.view(np.int16)), "dmin": torch.from_numpy(dmin.view(np.int16))}


def q6k_pack(raw: np.ndarray) -> dict[str, torch.Tensor]:
    """The kernel's layout of a Q6_K tensor (its bytes, N rows), still 6 bits a weight: "qw" the low 4 bits two to
    a byte, "m" the top 2 bits four to a byte (kernels/kquant.c says where each sits), "sc" and "d" as stored."""
    n = raw.shape[0]
    u = q6k_unpack(raw)
    nb = u["d"].shape[1]
    cols = u["u"].reshape(n, nb, 4, 2, 8, 4)                   # column 64c + 32h + 4i + b: (c, h, i, b)
    lo4, hi2 = cols & 15, cols >> 4
    nib = (lo4[:, :, :, 0] | (lo4[:, :, :, 1] << 4)).astype(np.uint8)                     # (n, nb, c, i, b)
    hi2 = hi2.reshape(n, nb, 4, 2, 2, 4, 4)                                               # (c, h, i >> 2, i & 3, b)
    top = np.zeros((n, nb, 4, 4, 4), np.uint8)
    for h in range(2):
        for i2 in range(2):
            top |= (hi2[:, :, :, h, i2] << (2 * i2 + 4 * h)).astype(np.uint8)
    qw = np.ascontiguousarray(_tiles(nib).transpose(0, 2, 3, 4, 1, 5))                   # (T, nb, c, i, 16, b)
    tops = np.ascontiguousarray(_tiles(top).transpose(0, 2, 3, 4, 1, 5))                 # (T, nb, c, i & 3, 16, b)
    sc = np.ascontiguousarray(_tiles(u["sc"].reshape(n, nb, 16)).transpose(0, 2, 3, 1))   # (T, nb, 16, 16)
    d = np.ascontiguousarray(_tiles(u["d"]).transpose(0, 2, 1))
    return {"qw": torch.from_numpy(qw), "m": torch.from_numpy(tops), "sc": torch.from_numpy(sc),
            "d": torch.from_numpy(d.view(np.int16))}


def b32_unpack(qtype: int, raw: np.ndarray) -> dict[str, np.ndarray]:
    """A Q4_0, Q5_0 or Q8_0 tensor's bytes as u = q + offset (N, K) and d (N, K/32) float16: w = d * (u - offset),
    the offset 8 for Q4_0, 16 for Q5_0 and 128 for Q8_0 (``B32_OFFSET``)."""
    n = raw.shape[0]
    blk = raw.reshape(n, -1, B32_BYTES[qtype])
    d = blk[..., 0:2].copy().view(np.float16)[..., 0]
    if qtype == Q8_0:
        u = (blk[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    elif qtype == Q4_0:
        qs = blk[..., 2:18]
        u = np.concatenate([qs & 15, qs >> 4], axis=-1)
    else:
        qh = blk[..., 2:6].copy().view(np.uint32)[..., 0]
        qs = blk[..., 6:22]
        hi = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)      # (n, nb, 32)
        u = np.concatenate([qs & 15, qs >> 4], axis=-1) | (hi << 4)
    return {"u": u.reshape(n, -1), "d": d}


def b32_dequantize(qtype: int, p: dict[str, np.ndarray]) -> np.ndarray:
    n, k = p["u"].shape
    u = p["u"].reshape(n, k // 32, 32).astype(np.float32) - B32_OFFSET[qtype]
    return (u * p["d"].astype(np.float32)[..., None]).reshape(n, k)


def b32_pack(qtype: int, raw: np.ndarray) -> dict[str, torch.Tensor]:
    """The kernel's layout of a Q4_0, Q5_0 or Q8_0 tensor: Q8_0 a byte a weight; Q4_0 and Q5_0 their low 4 bits two
    to a byte, Q5_0's 5th bits as one 64-bit mask per 4 columns of a tile (kernels/kquant.c)."""
    n = raw.shape[0]
    un = b32_unpack(qtype, np.asarray(raw))
    nb = un["d"].shape[1]
    u = un["u"].reshape(n, nb, 32)
    d = np.ascontiguousarray(_tiles(un["d"]).transpose(0, 2, 1))                       # (T, nb, 16)
    out = {"d": torch.from_numpy(d.view(np.int16))}
    if qtype == Q8_0:
        qw = _tiles(u.reshape(n, nb, 8, 4)).transpose(0, 2, 3, 1, 4)                  # (T, nb, i, 16, b)
        out["qw"] = torch.from_numpy(np.ascontiguousarray(qw))
        return out
    lo4, hi = (u & 15).reshape(n, nb, 2, 4, 4), (u >> 4).reshape(n, nb, 8, 4)
    nib = (lo4[:, :, 0] | (lo4[:, :, 1] << 4)).astype(np.uint8)                        # (n, nb, i, b)
    out["qw"] = torch.from_numpy(np.ascontiguousarray(_tiles(nib).transpose(0, 2, 3, 1, 4)))
    if qtype == Q4_0:
        return out
    bits = np.ascontiguousarray(_tiles(hi).transpose(0, 2, 3, 1, 4)).reshape(-1, nb, 8, 64)   # (T, nb, j, 16 x 4)
    out["m"] = torch.from_numpy(np.packbits(bits, axis=-1, bitorder="little"))        # (T, nb, j, 8 bytes)
    return out


PACK = {Q4_K: q4k_pack, Q6_K: q6k_pack, Q4_0: lambda raw: b32_pack(Q4_0, raw), Q5_0: lambda raw: b32_pack(Q5_0, raw),
        Q8_0: lambda raw: b32_pack(Q8_0, raw)}
