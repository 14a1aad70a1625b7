"""Online Correction Memory (OCM) of Calibrated Speculative Decoding (arXiv 2604.13634): counts of
divergence patterns (draft token x~, target token t*), updated in ``observe`` only; a pattern is a rescue
candidate once its count reaches lambda. A memory file records its pair (another pair's is refused) and,
in ``meta["calibration"]``, how it was calibrated.

The paper's memory only grows. A ``MemoryPolicy`` (kept in the file's ``policy`` block; a file without one is
unbounded) may bound it to ``capacity`` patterns, the smallest count going first (ties: the least recently
seen), and may let counts halve every ``half_life`` observed divergences (docs/memory.md: the measurement that
chose the rule).
"""
from __future__ import annotations

import heapq
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .fileio import read_or_raise, write_json
from .numbers import CAPACITY, HALF_LIFE, Field, grouped
from .representation import Representation
from .rule import top_share

DEFAULT_MEMORY_FILE = Path(__file__).parent / "data" / "default_memory.json.gz"

FORMAT = "csd-explorer-memory"
VERSION = 1
PATTERN_BYTES = 12        # a pattern on the device: two int32 token ids and a float32 count (docs/scale.md)
EVICT = ("count", "recent")   # when full: the smallest count goes (ties: least recent), or the least recent
PRUNE = 1 / 8             # a decayed count below this (a single sighting three half-lives ago) is forgotten
RESCALE = 1               # half-lives between two rescalings of the stored values (and prunings of faded patterns)


class MemoryFileError(ValueError):
    """A file is not a correction memory, or belongs to another model pair."""


def _checked(field: Field, value):
    """A policy value as ``field`` reads it; text is refused here (a file's "10" is not a number of patterns)."""
    if isinstance(value, str):
        raise ValueError(field.refusal(f'got "{value[:40]}"'))
    return field.read(value)


@dataclass(frozen=True)
class MemoryPolicy:
    """What the memory forgets. The default, neither set, is the paper's memory that only grows."""
    capacity: int | None = None      # the most patterns kept; None: unbounded
    half_life: float | None = None   # counts halve every this many observed divergences; None: never
    evict: str = "count"             # which pattern goes when full (EVICT; docs/memory.md says why "count")

    def __post_init__(self):
        _checked(CAPACITY, self.capacity)
        _checked(HALF_LIFE, self.half_life)
        if self.evict not in EVICT:
            raise ValueError(f"the eviction rule must be one of {', '.join(EVICT)}, got {self.evict!r}")

    @property
    def unbounded(self) -> bool:
        return self.capacity is None and self.half_life is None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data) -> MemoryPolicy:
        """A file's ``policy`` block (None: unbounded); ``MemoryFileError`` naming what is wrong."""
        if data is None:
            return cls()
        if not isinstance(data, dict) or set(data) - {"capacity", "half_life", "evict"}:
            raise MemoryFileError("malformed memory policy: expected an object with capacity, half_life and "
                                  f"evict, got {str(data)[:80]}")
        try:
            return cls(data.get("capacity"), data.get("half_life"), data.get("evict", "count"))
        except ValueError as e:
            raise MemoryFileError(f"malformed memory policy: {e}") from None

    @property
    def label(self) -> str:
        """A short name (the store's runs, the CSV): "unbounded", "capacity 1000", "half-life 500", ..."""
        parts = [f"capacity {self.capacity}" + (" (least recent)" if self.evict == "recent" else "")] \
            if self.capacity else []
        parts += [f"half-life {grouped(self.half_life).replace(',', '')}"] if self.half_life else []
        return ", ".join(parts) or "unbounded"

    def describe(self) -> str:
        """The policy in words (the app, the command line)."""
        parts = []
        if self.capacity:
            evicted = "smallest count" if self.evict == "count" else "least recent"
            parts.append(f"capacity {grouped(self.capacity)} patterns (the {evicted} goes)")
        if self.half_life:
            parts.append(f"counts halve every {grouped(self.half_life)} divergences")
        return ", ".join(parts) or "unbounded (the paper's)"


UNBOUNDED = MemoryPolicy()


def policy_from(capacity, half_life, names: tuple[str, str] = ("the capacity", "the half-life")) -> MemoryPolicy:
    """A policy from typed values (text or numbers; None or "" leaves it unset) read by ``csd.numbers``' fields, a
    value out of their range refused with its sentence (``NumberError``) naming it as ``names`` say (a flag, a box)."""
    cap = replace(CAPACITY, name=names[0]).read(capacity)
    return MemoryPolicy(cap, replace(HALF_LIFE, name=names[1]).read(half_life))


class CorrectionMemory:
    def __init__(self, pair_id: str, counts: dict[tuple[int, int], float] | None = None, meta: dict | None = None,
                 policy: MemoryPolicy = UNBOUNDED):
        self.pair_id = pair_id
        self.meta: dict = dict(meta or {})
        self.policy = policy
        self.evicted = 0            # patterns this memory forgot (capacity or decay) since it was made
        self._v: dict = {}          # pattern -> stored value: its count times 2**(age / half_life); in recency order
        self._age = 0.0             # divergences observed since the stored values were last rescaled
        self._tick: dict = {}       # pattern -> when last seen (capacity: ties go least recent first)
        self._clock = 0
        self._heap: list = []       # (value, tick, pattern), lazily invalidated: the smallest count first
        for k, c in (counts or {}).items():
            if c > 0:
                self._put(k, c)
        self._trim(None)

    # -- the narrow surface used by the decode loop ------------------------------------------
    def count(self, x_tilde: int, t_star: int) -> float:
        v = self._v.get((x_tilde, t_star), 0)
        return v * self._decay() if v and self.policy.half_life else v

    def observe(self, x_tilde: int, t_star: int, n: int = 1) -> None:
        if x_tilde == t_star:
            return
        key, h = (x_tilde, t_star), self.policy.half_life
        if h:
            self._age += n
            if self._age > RESCALE * h:
                self._rescale()
        self._put(key, self._v.pop(key, 0) + (n * 2 ** (self._age / h) if h else n))
        self._trim(key)

    def set_policy(self, policy: MemoryPolicy) -> None:
        """Apply ``policy`` from now on (counts as they stand; a capacity below the size drops the weakest)."""
        self._rescale()
        self.policy = policy
        self._rescale()
        self._trim(None)

    # -- the policy's bookkeeping --------------------------------------------------------------
    def _decay(self) -> float:
        return 2 ** (-self._age / self.policy.half_life)

    def _put(self, key, value) -> None:
        self._v[key] = value
        if self.policy.capacity:
            self._clock += 1
            self._tick[key] = self._clock
            if self.policy.evict == "count":
                heapq.heappush(self._heap, (value, self._clock, key))
                if len(self._heap) > 2 * len(self._v) + 64:
                    self._heapify()

    def _heapify(self) -> None:
        self._heap = [(v, self._tick.get(k, 0), k) for k, v in self._v.items()]
        heapq.heapify(self._heap)

    def _drop(self, key) -> None:
        del self._v[key]
        self._tick.pop(key, None)
        self.evicted += 1

    def _trim(self, newcomer) -> None:
        """Drop the weakest patterns above the capacity; the pattern just seen (``newcomer``) stays."""
        cap, held = self.policy.capacity, None
        while cap and len(self._v) > cap:
            if self.policy.evict == "recent":
                self._drop(next(k for k in self._v if k != newcomer))
                continue
            v, tick, key = heapq.heappop(self._heap)
            if self._v.get(key) != v or self._tick.get(key) != tick:
                continue                                 # a stale entry: the pattern was seen again or dropped
            if key == newcomer:
                held = (v, tick, key)
                continue
            self._drop(key)
        if held:
            heapq.heappush(self._heap, held)

    def _rescale(self) -> None:
        """Fold the decay into the stored values (age 0 again) and forget counts below ``PRUNE``."""
        if self.policy.half_life and self._age:
            f = self._decay()
            for k in [k for k, v in self._v.items() if v * f < PRUNE]:
                self._drop(k)
            self._v = {k: v * f for k, v in self._v.items()}
        self._age = 0.0
        self._tick = {k: self._tick.get(k, 0) for k in self._v} if self.policy.capacity else {}
        if self.policy.capacity and self.policy.evict == "count":
            self._heapify()
        else:
            self._heap = []

    # -- inspection --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._v)

    @property
    def nbytes(self) -> int:
        """What the patterns take on a device (``PATTERN_BYTES`` each)."""
        return len(self._v) * PATTERN_BYTES

    @property
    def total(self) -> float:
        return sum(c for _k, c in self.items())

    def items(self):
        """(pattern, count as it stands), least recently seen first."""
        if not self.policy.half_life:
            return self._v.items()
        f = self._decay()
        return [(k, v * f) for k, v in self._v.items()]

    def top(self, n: int | None = None) -> list[tuple[tuple[int, int], float]]:
        return sorted(self.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def n_candidates(self, lam: float) -> int:
        return sum(1 for _k, c in self.items() if c >= lam)

    def top_share(self, fraction: float = 0.2) -> float:
        """Share of all counted divergences covered by the top ``fraction`` of patterns."""
        return top_share([c for _k, c in self.items()], fraction)

    def copy(self) -> CorrectionMemory:
        mem = CorrectionMemory(self.pair_id, None, dict(self.meta), self.policy)
        for k, c in self.items():
            mem._put(k, c)
        mem.evicted = self.evicted
        return mem

    # -- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The file: counts as they stand (decayed, to 4 decimals); a bounded memory lists its patterns least
        recently seen first (so that a reload keeps the order ties are broken in) and records its policy."""
        rows = self.top() if self.policy.unbounded else list(self.items())
        out = {"format": FORMAT, "version": VERSION, "pair": self.pair_id, "meta": self.meta,
               "counts": [[d, t, c if isinstance(c, int) else round(c, 4)] for (d, t), c in rows]}
        return out if self.policy.unbounded else {**out, "policy": self.policy.to_dict()}

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
        policy = MemoryPolicy.from_dict(data.get("policy"))
        mem = cls(data.get("pair", ""), _counts_of(data.get("counts"), policy), meta, policy)
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
        try:
            return cls.from_dict(data, expected_pair)
        except MemoryFileError as e:
            raise MemoryFileError(f"{path}: {e}") from None

    def check_pair(self, pair_id: str) -> None:
        """Refuse a memory of another model pair (``MemoryFileError``)."""
        if self.pair_id != pair_id:
            raise MemoryFileError(
                f"this memory belongs to model pair {self.pair_id!r}, not to {pair_id!r}")

    def mismatch(self, pair) -> str | None:
        """None if the memory was calibrated with the pair's representations (or does not say), else a
        sentence naming the difference. A mismatch is shown, never refused: the patterns of a pair
        barely depend on how its weights are held (int8 or float, 4-bit or not)."""
        cal = (self.meta.get("calibration") or [{}])[-1]
        if not isinstance(cal, dict):
            return None
        was, diffs = Representation.of(cal), []
        for key in ("target", "draft"):
            want, have = getattr(was, key), getattr(pair.rep, key)
            if want and have and want != have:
                diffs.append(f"{key} {want} (loaded: {have})")
        if not diffs:
            return None
        return "the correction memory was calibrated with " + ", ".join(diffs)

    def __repr__(self) -> str:
        return f"CorrectionMemory(pair={self.pair_id!r}, patterns={len(self)}, total={self.total:g}, " \
               f"policy={self.policy.describe()!r})"


def _count_value(c, policy: MemoryPolicy) -> bool:
    """A count in a file: a whole number; a memory whose counts decay may hold any finite number."""
    if isinstance(c, bool):
        return False
    return isinstance(c, int) or (policy.half_life is not None and isinstance(c, float) and math.isfinite(c))



def _counts_of(rows, policy: MemoryPolicy) -> dict[tuple[int, int], float]:
    """A memory file's ``counts`` rows, checked, as {(x~, t*): count} (a repeated pattern adds up)."""
    if not isinstance(rows, list):
        raise MemoryFileError("malformed memory file: 'counts' must be a list of [draft_id, target_id, count]")
    counts = {}
    for n, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in row[:2])
                and _count_value(row[2], policy)):
            raise MemoryFileError(f"malformed memory counts: entry {n} is {str(row)[:60]}, "
                                  "expected [draft_id, target_id, count] of whole numbers")
        d, t, c = row
        if d < 0 or t < 0 or c < 0:
            raise MemoryFileError(f"malformed memory counts: entry {n} has a negative id or count ({row})")
        counts[(d, t)] = counts.get((d, t), 0) + c
    return counts

def default_memory(pair) -> CorrectionMemory:
    """The shipped memory for the embedded pair; an empty memory for any other pair."""
    if pair.is_embedded and DEFAULT_MEMORY_FILE.exists():
        return CorrectionMemory.load(DEFAULT_MEMORY_FILE, expected_pair=pair.pair_id)
    return CorrectionMemory(pair.pair_id)
