"""Analyse's charts for a correction memory (the session's, e.g. an uploaded SGLang CSD table) instead of the
logged runs: its patterns by count, and this session's logged divergences (a memory holds no logit gaps)
re-counted with the memory's counts."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from csd.db.analytics import Divergences
from csd.memory import CorrectionMemory


def memory_pareto_rows(memory: CorrectionMemory, tokenizer, limit: int | None = None) -> list[dict]:
    """The memory's patterns as Pareto rows (``csd.db.analytics.ParetoRow``'s names), most counted first;
    shares over all its counts. Only the first ``limit`` rows are decoded (the chart shows 30)."""
    top = memory.top()
    total = sum(c for _, c in top) or 1
    rows, cum = [], 0
    for i, ((d, t), c) in enumerate(top):
        cum += c
        shown = limit is None or i < limit
        rows.append({"draft_id": d, "target_id": t, "count": c, "share": c / total, "cumulative_share": cum / total,
                     "draft_text": tokenizer.decode([d]) if shown else "",
                     "target_text": tokenizer.decode([t]) if shown else "",
                     "example_context": "(a memory holds counts, no contexts)"})
    return rows


def recount(d: Divergences, memory: CorrectionMemory) -> Divergences:
    """``d`` with each divergence's count taken from ``memory``: what the rule would have decided with it."""
    per_pattern = np.array([memory.count(a, b) for a, b in d.patterns], dtype=float)
    count = per_pattern[d.pattern] if len(d) else np.zeros(0)
    return replace(d, count=count)
