"""Small statistics for the benchmark: binomial intervals, the paired test, a bootstrap interval of a
speed-up, the Pareto curve."""
from __future__ import annotations

import math
from collections import Counter

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
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_accuracy(pairs) -> dict:
    """(correct by m, correct by ref) per item graded by both: items m gained and lost against ref,
    with the exact McNemar p."""
    both = list(pairs)
    gained = sum(1 for x, a in both if x and not a)
    lost = sum(1 for x, a in both if a and not x)
    return {"n": len(both), "gained": gained, "lost": lost, "p_value": mcnemar_exact(gained, lost),
            "diff": (gained - lost) / len(both) if both else None}


def ratio_ci(pairs, reps: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval, over items, of sum(num) / sum(den) for paired (num, den) per
    item: how far a speed-up measured on these items could move on another draw of items like them
    (the answers, and with them the lengths and what can be copied, differ per item and method).
    Seeded, so a report renders the same twice; None with fewer than 2 items."""
    import numpy as np

    rows = np.array([(float(a), float(b)) for a, b in pairs]).reshape(-1, 2)
    if len(rows) < 2:
        return None
    pick = np.random.default_rng(seed).integers(0, len(rows), size=(reps, len(rows)))
    num, den = rows[pick, 0].sum(1), rows[pick, 1].sum(1)
    ratios = num[den > 0] / den[den > 0]
    if not len(ratios):
        return None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def pareto(counts: Counter) -> dict:
    """The divergence patterns' Pareto curve: cumulative share of divergences covered by the top
    patterns, and the share covered by the top 20% (the paper reports about 69%)."""
    values = sorted(counts.values(), reverse=True)
    total = sum(values)
    if not total:
        return {"patterns": 0, "divergences": 0, "top20_share": None, "cumulative": []}
    cum, acc = [], 0
    for v in values:
        acc += v
        cum.append(acc / total)
    return {"patterns": len(values), "divergences": total, "top20_patterns": max(1, round(len(values) * 0.2)),
            "top20_share": top_share(values), "cumulative": cum}
