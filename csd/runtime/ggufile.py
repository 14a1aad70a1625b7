"""A GGUF file read quickly (format: github.com/ggml-org/ggml, docs/gguf.md, versions 2 and 3): the header
walked once, skipping the tokenizer's long arrays by their lengths (the ``gguf`` package's reader makes
300,000 numpy views of them, 15 s a file on 2 cores); a tensor's rows are a slice of one ``np.memmap``."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
KEEP_ARRAY = 64          # arrays longer than this are skipped (the tokenizer's), not kept


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # as numpy holds it: (rows, columns), columns last
    qtype: int
    offset: int                 # in the file
    nbytes: int


class GGUFFile:
    def __init__(self, path: str | Path):
        import gguf
        self.path = Path(path)
        self.map = buf = np.memmap(self.path, dtype=np.uint8, mode="r")
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path.name} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path.name}: GGUF version {version} (2 and 3 are read)")
        pos = 24
        self.fields: dict = {}
        self.spans: dict[str, tuple[int, int]] = {}     # each entry's bytes, for digests
        for _ in range(n_kv):
            start = pos
            key, pos = self._string(pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.fields[key], pos = self._value(vtype, pos)
            self.spans[key] = (start, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
            pos += 8 * n_dims
            qtype, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            infos.append((name, dims, qtype, offset))
        align = int(self.fields.get("general.alignment", 32))
        data = -(-pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, qtype, offset in infos:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
            rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
            if dims[0] % block:
                raise ValueError(f"{name}: a row of {dims[0]} is not a whole number of {block}-value blocks")
            row_bytes = dims[0] // block * size
            shape = tuple(reversed(dims)) if len(dims) > 1 else (dims[0],)
            self.tensors[name] = TensorInfo(name, shape, qtype, data + offset, rows * row_bytes)
        end = max((t.offset + t.nbytes for t in self.tensors.values()), default=data)
        if end > len(buf):
            raise ValueError(f"{self.path.name} is truncated: its tensors end at byte {end}, the file at {len(buf)}")

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self.map, pos)
        return bytes(self.map[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def _value(self, vtype: int, pos: int):
        if vtype in SCALARS:
            fmt = SCALARS[vtype]
            return struct.unpack_from(fmt, self.map, pos)[0], pos + struct.calcsize(fmt)
        if vtype == STRING:
            return self._string(pos)
        if vtype != ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        etype, count = struct.unpack_from("<IQ", self.map, pos)
        pos += 12
        if etype in SCALARS and count > KEEP_ARRAY:     # a fixed size: skipped in one step
            return None, pos + count * struct.calcsize(SCALARS[etype])
        items = []
        for _ in range(count):
            if etype == STRING and count > KEEP_ARRAY:      # skipped by its length, not decoded
                pos += 8 + struct.unpack_from("<Q", self.map, pos)[0]
            else:
                v, pos = self._value(etype, pos)
                items.append(v)
        return (items if count <= KEEP_ARRAY else None), pos

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as stored, one row a line: (rows, bytes per row), a view of the map."""
        t = self.tensors[name]
        rows = t.shape[0] if len(t.shape) > 1 else 1
        return self.map[t.offset:t.offset + t.nbytes].reshape(rows, -1)

    def dequantize(self, name: str, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """A tensor (or some of its rows) as float32, in a new array."""
        import gguf
        t = self.tensors[name]
        raw = self.raw(name) if rows is None else self.raw(name)[rows]
        out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.qtype))
        shape = t.shape if rows is None else (-1, *t.shape[1:])
        return np.array(out, dtype=np.float32).reshape(shape)

    def digest(self, prefix: str, skip: tuple[str, ...] = ()) -> str:
        """sha256 of the metadata entries whose keys start with ``prefix`` (keys in ``skip`` left out)."""
        h = hashlib.sha256()
        for key in sorted(self.spans):
            if key.startswith(prefix) and key not in skip:
                a, b = self.spans[key]
                h.update(bytes(self.map[a:b]))
        return h.hexdigest()
