"""The cost model of speculative decoding on one machine (measured by ``csd.runtime.profile``) and its arithmetic:
a block's time, the ideal speed-up bound at each block length, the expected one at an acceptance rate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass
class CostModel:
    """Median ms: ``verify_ms[k]`` a target pass of k tokens (after ``csd.runtime.profile.CONTEXT`` cached ones),
    ``draft_ms`` one draft token. A block's whole cost adds the host's share: ``pass_overhead_ms`` for
    any pass (the host's time and the transfer of its result beyond the pass itself), and
    ``draft_overhead_ms`` for a block that drafts (the drafting loop's host time, beyond its steps)."""
    verify_ms: dict[int, float]
    draft_ms: float
    key: dict = field(default_factory=dict)
    measured_at: str = ""
    pass_overhead_ms: float = 0.0
    draft_overhead_ms: float = 0.0

    def __post_init__(self):
        self.verify_ms = monotone(self.verify_ms)

    def verify(self, k: int) -> float:
        """Time of a k-token pass, interpolated between the measured lengths (linear beyond them)."""
        ks = sorted(self.verify_ms)
        if k in self.verify_ms:
            return self.verify_ms[k]
        lo = max((x for x in ks if x < k), default=ks[0])
        hi = min((x for x in ks if x > k), default=None)
        if hi is None:   # beyond the longest measured pass: extend the last segment's slope
            a, b = ks[-2], ks[-1]
            return self.verify_ms[b] + (k - b) * max(0.0, (self.verify_ms[b] - self.verify_ms[a]) / (b - a))
        w = (k - lo) / (hi - lo)
        return (1 - w) * self.verify_ms[lo] + w * self.verify_ms[hi]

    def plain_ms(self) -> float:
        """One plain target step, the host's share included: what a token costs without a draft."""
        return self.verify(1) + self.pass_overhead_ms

    @property
    def ar_tokens_per_s(self) -> float:
        return 1000.0 / self.plain_ms()

    def block_ms(self, g: int) -> float:
        """A block of g drafted tokens and its verify pass, the host's share included (g = 0: a plain step)."""
        return g * self.draft_ms + self.verify(g + 1) + self.pass_overhead_ms + (self.draft_overhead_ms if g else 0.0)

    def bound(self, g: int) -> float:
        """Ideal speed-up over AR at block length g: every draft token accepted."""
        return (g + 1) / self.block_ms(g) * self.plain_ms()

    def best_bound(self, g_max: int = 32) -> tuple[int, float]:
        g = max(range(1, g_max + 1), key=self.bound)
        return g, self.bound(g)

    def expected(self, g: int, acceptance: float) -> float:
        """Expected speed-up over AR at block length g when each draft token is kept independently with
        probability a (the textbook model): (1 - a^(g+1)) / (1 - a) tokens per block."""
        a = min(max(acceptance, 0.0), 1.0)
        tokens = g + 1 if a >= 1.0 else (1 - a ** (g + 1)) / (1 - a)
        return tokens / self.block_ms(g) * self.plain_ms()

    def best_expected(self, acceptance: float, g_max: int = 32) -> tuple[int, float]:
        g = max(range(1, g_max + 1), key=lambda x: self.expected(x, acceptance))
        return g, self.expected(g, acceptance)

    def shared(self, runs: int) -> CostModel:
        """The costs one of ``runs`` runs pays where they share every pass (``csd.runtime.batch``). If each run
        brings a block of k tokens, a pass holds runs * k rows and a run's share of it is verify(runs * k) / runs:
        the weights' reading is split between the runs, and each row costs what a row costs in a pass of that
        many. On a CPU that is the arithmetic of a compute-bound pass: a small pass's cheap extra rows (hidden
        behind the weights' reading) are not what a run's rows cost among 8. The draft's step is split the same
        way, in the target's proportion (the profile times the draft at one token only). One run: these costs."""
        if runs <= 1:
            return self
        verify_ms = {k: self.verify(runs * k) / runs for k in self.verify_ms}
        alone = self.verify(1)
        draft_ms = self.draft_ms
        if alone > 0:
            draft_ms = self.draft_ms * (self.verify(runs) / runs) / alone      # what the run pays of one step
        return replace(self, verify_ms=verify_ms, draft_ms=draft_ms)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verify_ms"] = {str(k): v for k, v in self.verify_ms.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls({int(k): float(v) for k, v in d["verify_ms"].items()}, float(d["draft_ms"]), d.get("key", {}),
                   d.get("measured_at", ""), float(d.get("pass_overhead_ms", 0.0)),
                   float(d.get("draft_overhead_ms", 0.0)))


def monotone(verify_ms: dict[int, float]) -> dict[int, float]:
    """A shorter pass timed slower than a longer one (noise of a shared machine) takes the longer one's time."""
    out, floor = {}, float("inf")
    for k in sorted(verify_ms, reverse=True):
        floor = min(floor, verify_ms[k])
        out[k] = floor
    return dict(sorted(out.items()))
