"""Online Correction Memory (OCM) of Calibrated Speculative Decoding (arXiv 2604.13634): counts of
divergence patterns (draft token x~, target token t*), updated in ``observe`` only; a pattern is a rescue
candidate once its count reaches lambda. A memory file records its pair (another pair's is refused) and,
in ``meta["calibration"]``, how it was calibrated.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from .rule import top_share
from .runtime.fileio import read_or_raise, write_json

DEFAULT_MEMORY_FILE = Path(__file__).parent / "data" / "default_memory.json.gz"

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
        return top_share(self._counts.values(), fraction)

    def copy(self) -> CorrectionMemory:
        return CorrectionMemory(self.pair_id, dict(self._counts), dict(self.meta))

    # -- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "pair": self.pair_id, "meta": self.meta,
                "counts": [[d, t, c] for (d, t), c in self.top()]}

    @classmethod
    def from_dict(cls, data: dict, expected_pair: str | None = None) -> CorrectionMemory:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MemoryFileError("not a CSD Explorer correction-memory file")
        if data.get("version") != VERSION:
            raise MemoryFileError(f"unsupported memory file version {data.get('version')!r}")
        meta = {} if data.get("meta") is None else data["meta"]
        if not isinstance(meta, dict):
            raise MemoryFileError(f"malformed memory file: 'meta' must be an object, not {type(meta).__name__}")
        if not isinstance(data.get("pair", ""), str):
            raise MemoryFileError("malformed memory file: 'pair' must be a string")
        rows = data.get("counts")
        if not isinstance(rows, list):
            raise MemoryFileError("malformed memory file: 'counts' must be a list of [draft_id, target_id, count]")
        counts = {}
        for n, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in row)):
                raise MemoryFileError(f"malformed memory counts: entry {n} is {str(row)[:60]}, "
                                      "expected [draft_id, target_id, count] of whole numbers")
            d, t, c = row
            if d < 0 or t < 0 or c < 0:
                raise MemoryFileError(f"malformed memory counts: entry {n} has a negative id or count ({row})")
            counts[(d, t)] = counts.get((d, t), 0) + c
        mem = cls(data.get("pair", ""), counts, meta)
        if expected_pair is not None:
            mem.check_pair(expected_pair)
        return mem

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a killed process leaves the old file or the new one, never half)."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, expected_pair: str | None = None) -> CorrectionMemory:
        path = Path(path)
        raw = read_or_raise(path, MemoryFileError, "memory file ")
        if not raw.strip():
            raise MemoryFileError(f"{path} is empty: not a CSD Explorer correction-memory file")
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MemoryFileError(f"{path} is not a CSD Explorer correction-memory file (not JSON)") from None
        return cls.from_dict(data, expected_pair)

    def check_pair(self, pair_id: str) -> None:
        """Refuse a memory of another model pair (``MemoryFileError``)."""
        if self.pair_id != pair_id:
            raise MemoryFileError(
                f"this memory belongs to model pair {self.pair_id!r}, not to {pair_id!r}")

    def mismatch(self, pair) -> str | None:
        """None if the memory was calibrated with the pair's representations (or does not say), else a
        sentence naming the difference (shown, never refused)."""
        cal = (self.meta.get("calibration") or [{}])[-1]
        if not isinstance(cal, dict):
            return None
        diffs = []
        for key, have in (("target_repr", pair.target_repr), ("draft_repr", pair.draft_dtype)):
            want = cal.get(key)
            if want and have and want != have:
                diffs.append(f"{key.split('_')[0]} {want} (loaded: {have})")
        if not diffs:
            return None
        return "the correction memory was calibrated with " + ", ".join(diffs)

    def __repr__(self) -> str:
        return f"CorrectionMemory(pair={self.pair_id!r}, patterns={len(self)}, total={self.total})"


def default_memory(pair) -> CorrectionMemory:
    """The shipped memory for the embedded pair; an empty memory for any other pair."""
    if pair.is_embedded and DEFAULT_MEMORY_FILE.exists():
        return CorrectionMemory.load(DEFAULT_MEMORY_FILE, expected_pair=pair.pair_id)
    return CorrectionMemory(pair.pair_id)
