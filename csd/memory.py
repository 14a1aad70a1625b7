"""Online Correction Memory (OCM) of Calibrated Speculative Decoding (arXiv 2604.13634).

Counts of divergence patterns keyed by (draft token id x~, target token id t*). A pattern is
a rescue candidate once its count reaches lambda. Updates happen in ``observe`` only.
A memory file records the model pair it belongs to; loading it for another pair is refused.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

FORMAT = "csd-explorer-memory"
VERSION = 1


class MemoryFileError(ValueError):
    """A file is not a correction memory, or belongs to another model pair."""


class CorrectionMemory:
    def __init__(self, pair_id: str, counts: dict[tuple[int, int], int] | None = None, meta: dict | None = None):
        self.pair_id = pair_id
        self._counts: Counter = Counter(counts or {})
        self.meta: dict = dict(meta or {})

    # -- the narrow surface used by the decode loop ------------------------------------------
    def count(self, x_tilde: int, t_star: int) -> int:
        return self._counts.get((x_tilde, t_star), 0)

    def is_candidate(self, x_tilde: int, t_star: int, lam: float) -> bool:
        return self.count(x_tilde, t_star) >= lam

    def observe(self, x_tilde: int, t_star: int, n: int = 1) -> None:
        if x_tilde != t_star:
            self._counts[(x_tilde, t_star)] += n

    # -- inspection --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._counts)

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def items(self):
        return self._counts.items()

    def top(self, n: int | None = None) -> list[tuple[tuple[int, int], int]]:
        return sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def n_candidates(self, lam: float) -> int:
        return sum(1 for c in self._counts.values() if c >= lam)

    def top_share(self, fraction: float = 0.2) -> float:
        """Share of all counted divergences covered by the top ``fraction`` of patterns."""
        counts = sorted(self._counts.values(), reverse=True)
        if not counts:
            return 0.0
        k = max(1, round(len(counts) * fraction))
        return sum(counts[:k]) / sum(counts)

    def copy(self) -> "CorrectionMemory":
        return CorrectionMemory(self.pair_id, dict(self._counts), dict(self.meta))

    def reset(self) -> None:
        self._counts.clear()

    def merge(self, other: "CorrectionMemory") -> None:
        self._check_pair(other.pair_id)
        self._counts.update(other._counts)

    # -- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "pair": self.pair_id, "meta": self.meta,
                "counts": [[d, t, c] for (d, t), c in self.top()]}

    @classmethod
    def from_dict(cls, data: dict, expected_pair: str | None = None) -> "CorrectionMemory":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MemoryFileError("not a CSD Explorer correction-memory file")
        if data.get("version") != VERSION:
            raise MemoryFileError(f"unsupported memory file version {data.get('version')!r}")
        try:
            counts = {(int(d), int(t)): int(c) for d, t, c in data["counts"]}
        except (KeyError, TypeError, ValueError) as e:
            raise MemoryFileError(f"malformed memory counts: {e}") from None
        mem = cls(str(data.get("pair", "")), counts, data.get("meta") or {})
        if expected_pair is not None:
            mem._check_pair(expected_pair)
        return mem

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a killed process leaves the old file or the new one, never half)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.to_dict()).encode()
        if path.suffix == ".gz":
            payload = gzip.compress(payload, mtime=0)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a memory file is a shareable data file
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, expected_pair: str | None = None) -> "CorrectionMemory":
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise MemoryFileError(f"cannot read memory file {str(path)!r}: {e.strerror}") from None
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except OSError as e:
                raise MemoryFileError(f"{path}: corrupt gzip: {e}") from None
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MemoryFileError(f"{path} is not a CSD Explorer correction-memory file (not JSON)") from None
        return cls.from_dict(data, expected_pair)

    def _check_pair(self, pair_id: str) -> None:
        if self.pair_id != pair_id:
            raise MemoryFileError(
                f"this memory belongs to model pair {self.pair_id!r}, not to {pair_id!r}")

    def __repr__(self) -> str:
        return f"CorrectionMemory(pair={self.pair_id!r}, patterns={len(self)}, total={self.total})"
