"""Small statistics for the benchmark: binomial intervals, the paired test, the speed-up with its
bootstrap interval, the Pareto curve."""
from __future__ import annotations

import math
from collections import Counter
from itertools import accumulate

from csd.rule import top_share


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion k/n (95% by default); None when n = 0."""
    if n <= 0:
        return None
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar test on the discordant pairs of a paired comparison: the
    probability, if both methods were equally accurate, of a split at least this uneven."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_accuracy(pairs) -> dict:
    """(correct by m, correct by ref) per item graded by both: items m gained and lost against ref,
    with the exact McNemar p."""
    both = list(pairs)
    gained = sum(1 for x, a in both if x and not a)
    lost = sum(1 for x, a in both if a and not x)
    return {"n": len(both), "gained": gained, "lost": lost, "p_value": mcnemar_exact(gained, lost),
            "diff": (gained - lost) / len(both) if both else None}


def speedup(rows, reps: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float | None, list | None]:
    """The project's one speed-up: summed tokens / summed wall over a reference's on the same items, with
    a seeded percentile bootstrap interval over the items (docs/benchmarks.md). ``rows``: (tokens, wall_s,
    ref_tokens, ref_wall_s) per item. Returns (ratio or None, [lo, hi] or None with fewer than 2 items)."""
    import numpy as np

    a = np.array([[float(x) for x in r] for r in rows]).reshape(-1, 4)
    tok, wall, rtok, rwall = a.sum(0) if len(a) else (0.0, 0.0, 0.0, 0.0)
    if wall <= 0 or rwall <= 0 or rtok <= 0:
        return None, None
    ratio = float((tok / wall) / (rtok / rwall))
    if len(a) < 2:
        return ratio, None
    pick = np.random.default_rng(seed).integers(0, len(a), size=(reps, len(a)))
    s = a[pick].sum(1)                                  # (reps, 4): each draw's sums
    ok = (s[:, 1] > 0) & (s[:, 3] > 0) & (s[:, 2] > 0)
    draws = (s[ok, 0] / s[ok, 1]) / (s[ok, 2] / s[ok, 3])
    if not len(draws):
        return ratio, None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return ratio, [float(lo), float(hi)]


def pareto(counts: Counter) -> dict:
    """The divergence patterns' Pareto curve: cumulative share of divergences covered by the top
    patterns, and the share covered by the top 20% (the paper reports about 69%)."""
    values = sorted(counts.values(), reverse=True)
    total = sum(values)
    if not total:
        return {"patterns": 0, "divergences": 0, "top20_share": None, "cumulative": []}
    cum = [c / total for c in accumulate(values)]
    return {"patterns": len(values), "divergences": total, "top20_patterns": max(1, round(len(values) * 0.2)),
            "top20_share": top_share(values), "cumulative": cum}
