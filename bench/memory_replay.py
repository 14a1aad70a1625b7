"""Every memory policy over one collected stream (``bench.memory_stream``; how it decides: docs/memory.md): each
policy's memory starts as the scenario says, learns online and decides every block with ``csd.rule.decide``."""
from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from csd.config import CSDConfig
from csd.events import RESCUED
from csd.memory import DEFAULT_MEMORY_FILE, PATTERN_BYTES, CorrectionMemory, MemoryPolicy
from csd.representation import Representation
from csd.rule import BlockScores, Rescue, decide
from csd.runtime.profile import machine_name

from .io import md_table, write_json

CAPACITY_SHARES = (0.01, 0.10, 0.50)    # of the unbounded memory's final size
WINDOW = 10                             # items in the rolling rescue rate (recovery, chart)
RESULTS, CHART = "results.json", "memory.html"


class CountMinSketch:
    """The third eviction candidate: no list of patterns at all, ``depth`` rows of ``width`` counters; a pattern's
    count is the smallest of its cells (never below the true count, above it where patterns collide)."""

    def __init__(self, cells: int, depth: int = 2):
        self.width, self.depth = max(1, cells // depth), depth
        self.rows = [[0] * self.width for _ in range(depth)]

    def _cells(self, d: int, t: int):
        return [(r, hash((r, d, t)) % self.width) for r in range(self.depth)]

    def count(self, d: int, t: int) -> int:
        return min(self.rows[r][c] for r, c in self._cells(d, t))

    def observe(self, d: int, t: int, n: int = 1) -> None:
        for r, c in self._cells(d, t):
            self.rows[r][c] += n

    def __len__(self) -> int:
        return self.width * self.depth         # cells, each the bytes of one counter

    @property
    def nbytes(self) -> int:
        return 4 * len(self)


@dataclass(frozen=True)
class Arm:
    """One line of the chart: a policy (or the sketch with ``sketch_bytes``) and its label."""
    name: str
    policy: MemoryPolicy | None = None
    sketch_bytes: int = 0


def walk_item(row: dict, memory, rescue: Rescue, gamma: int, origin: dict, topic: str, seen: Counter) -> dict:
    """One item's blocks: decide, count what was kept, let the memory observe. ``origin``: the topic that first
    showed each pattern (a rescue by a pattern from another topic is carried over); ``seen``: every pattern's true
    count on this walk (a rescue whose pattern the paper's memory would not know at lambda is unearned)."""
    d, t, gap, ref = row["d"], row["t"], row["gap"], row["ref"]
    n, p = len(ref), 0
    out = {"tokens": 0, "passes": 0, "rescued": 0, "divergences": 0, "carried": 0, "rescued_ref": 0, "unearned": 0}
    while p < n:
        g = min(gamma, n - p)
        s = BlockScores(t_star=t[p:p + g + 1], z_t=[0.0] * (g + 1), z_x=gap[p:p + g])
        dec = decide(d[p:p + g], s, memory.count, rescue)
        for i, v in enumerate(dec.verdicts):
            if v.status == RESCUED:
                out["rescued"] += 1
                out["rescued_ref"] += v.x_tilde == ref[p + i]
                out["carried"] += origin.get((v.x_tilde, v.t_star), topic) != topic
                out["unearned"] += seen[(v.x_tilde, v.t_star)] < rescue.lam
        for pattern in dec.observed:
            memory.observe(*pattern)
            origin.setdefault(pattern, topic)
            seen[pattern] += 1
        out["divergences"] += len(dec.observed)
        out["tokens"] += min(dec.n_kept + 1, n - p)
        out["passes"] += 1
        p += dec.n_kept + 1
    return out


def run_arm(stream: dict, memory, rescue: Rescue, gamma: int, start: CorrectionMemory | None = None) -> dict:
    """The arm over the whole stream: per item what ``walk_item`` counts, the memory's size after it."""
    origin: dict = {k: "start" for k, _c in start.items()} if start else {}
    seen = Counter(dict(start.items()) if start else {})
    per_item = []
    for row in stream["items"]:
        r = walk_item(row, memory, rescue, gamma, origin, row["topic"], seen)
        per_item.append({**r, "size": len(memory), "bytes": memory.nbytes})
    return {"per_item": per_item, "memory": memory}


def rolling(values: list[float], weights: list[float], w: int = WINDOW) -> list[float]:
    """A weighted rolling mean over the last ``w`` items (rescues per 100 tokens over ``w`` items' tokens)."""
    out = []
    for i in range(len(values)):
        a = max(0, i - w + 1)
        tot = sum(weights[a:i + 1])
        out.append(100 * sum(values[a:i + 1]) / tot if tot else 0.0)
    return out


def recovery(rescued: list[int], tokens: list[int], starts: list[int], w: int = WINDOW) -> list:
    """After each topic change: the items until the rescue rate over the new topic's items alone (the last ``w``,
    never reaching back over the change) first reaches 90% of that topic's own level (its rate over its second
    half); "-" when the topic has no rescues there."""
    out, bounds = [], starts + [len(rescued)]
    for a, b in zip(bounds[1:-1], bounds[2:]):
        mid = (a + b) // 2
        level = 100 * sum(rescued[mid:b]) / max(1, sum(tokens[mid:b]))
        if level <= 0:
            out.append("-")
            continue
        rate = rolling(rescued[a:b], tokens[a:b], w)
        out.append(next((k + 1 for k, r in enumerate(rate) if r >= 0.9 * level), None))
    return out


def summarize(arm: Arm, res: dict, starts: list[int], topics: list[str]) -> dict:
    items, mem = res["per_item"], res["memory"]
    tot = {k: sum(r[k] for r in items) for k in ("tokens", "passes", "rescued", "divergences", "carried",
                                                 "rescued_ref", "unearned")}
    rate = rolling([r["rescued"] for r in items], [r["tokens"] for r in items])
    per_topic = {}
    for topic, a, b in zip(topics, starts, starts[1:] + [len(items)]):
        seg = items[a:b]
        tok = sum(r["tokens"] for r in seg)
        per_topic[topic] = {"rescues_per_100": 100 * sum(r["rescued"] for r in seg) / max(1, tok),
                            "tokens_per_pass": tok / max(1, sum(r["passes"] for r in seg)),
                            "carried_over_share": sum(r["carried"] for r in seg) / max(1, sum(r["rescued"] for r in seg))}
    file_bytes = (len(gzip.compress(json.dumps(mem.to_dict()).encode(), mtime=0))
                  if isinstance(mem, CorrectionMemory) else mem.nbytes)
    return {"name": arm.name, "policy": arm.policy.to_dict() if arm.policy else {"count_min_sketch_bytes": arm.sketch_bytes},
            "rescues_per_100": 100 * tot["rescued"] / max(1, tot["tokens"]),
            "tokens_per_pass": tot["tokens"] / max(1, tot["passes"]), **tot,
            "rescues_matching_reference": tot["rescued_ref"] / max(1, tot["rescued"]),
            "final_patterns": len(mem), "final_bytes": mem.nbytes, "file_bytes_gz": file_bytes,
            "peak_patterns": max(r["size"] for r in items), "per_topic": per_topic,
            "recovery_items": recovery([r["rescued"] for r in items], [r["tokens"] for r in items], starts),
            "series": {"size": [r["size"] for r in items], "rescues_per_100_rolling": [round(x, 3) for x in rate],
                       "rescued": [r["rescued"] for r in items], "tokens": [r["tokens"] for r in items]}}


def arms_for(final_size: int, half_lives: tuple[float, ...]) -> list[Arm]:
    """The policies compared, sized from the unbounded memory's final size."""
    arms = [Arm("unbounded", MemoryPolicy())]
    for share in CAPACITY_SHARES:
        cap = max(1, round(share * final_size))
        arms.append(Arm(f"capacity {share:.0%} ({cap:,}), smallest count", MemoryPolicy(capacity=cap)))
    cap10 = max(1, round(0.10 * final_size))
    arms.append(Arm(f"capacity 10% ({cap10:,}), least recent", MemoryPolicy(capacity=cap10, evict="recent")))
    arms.append(Arm(f"count-min sketch, bytes of 10% ({cap10 * PATTERN_BYTES:,} B)", None, cap10 * PATTERN_BYTES))
    for h in half_lives:
        arms.append(Arm(f"half-life {h:,g}", MemoryPolicy(half_life=h)))
    arms.append(Arm(f"capacity 10% ({cap10:,}) + half-life {half_lives[-1]:,g}",
                    MemoryPolicy(capacity=cap10, half_life=half_lives[-1])))
    return arms


def new_memory(arm: Arm, pair_id: str, start: CorrectionMemory | None):
    if arm.policy is None:
        sk = CountMinSketch(arm.sketch_bytes // 4)
        for (d, t), c in (start.items() if start else ()):
            sk.observe(d, t, c)
        return sk
    mem = start.copy() if start else CorrectionMemory(pair_id)
    mem.set_policy(arm.policy)
    return mem


def run_scenario(stream: dict, start: CorrectionMemory | None, rescue: Rescue, gamma: int,
                 half_lives: tuple[float, ...]) -> dict:
    topics = list(dict.fromkeys(r["topic"] for r in stream["items"]))
    starts = [next(i for i, r in enumerate(stream["items"]) if r["topic"] == tp) for tp in topics]
    base = run_arm(stream, new_memory(Arm("unbounded", MemoryPolicy()), stream["pair"], start), rescue, gamma, start)
    final = len(base["memory"])
    out, unbounded_rescues = [], None
    for arm in arms_for(final, half_lives):
        res = base if arm.name == "unbounded" else run_arm(stream, new_memory(arm, stream["pair"], start), rescue,
                                                           gamma, start)
        s = summarize(arm, res, starts, topics)
        unbounded_rescues = unbounded_rescues or s["rescued"]
        s["share_of_unbounded_rescues"] = (s["rescued"] - s["unearned"]) / max(1, unbounded_rescues)
        out.append(s)
    sd = run_arm(stream, CorrectionMemory(stream["pair"]), Rescue(use_ocm=False, use_scg=False), gamma)["per_item"]
    return {"topics": topics, "starts": starts, "unbounded_final_patterns": final, "policies": out,
            "sd_tokens_per_pass": sum(r["tokens"] for r in sd) / sum(r["passes"] for r in sd)}


def replay_run(run: Path, lam: float | None = None, tau: float | None = None,
               half_lives: tuple[float, ...] | None = None) -> dict:
    """Replay every policy over ``run/stream.json.gz`` in two scenarios (an empty memory at the start; the
    shipped memory at the start) and write ``results.json`` and the chart."""
    t0 = time.perf_counter()
    stream = json.loads(gzip.decompress((run / "stream.json.gz").read_bytes()))
    d = CSDConfig()
    lam, tau = d.lam if lam is None else lam, d.tau if tau is None else tau
    rescue = Rescue.of(True, True, lam, tau, special=stream["special"])
    per_topic_div = sum(sum(a != b for a, b in zip(r["d"], r["t"])) for r in stream["items"]) / 3
    half_lives = half_lives or (round(per_topic_div / 4, -1), round(per_topic_div, -1))
    out = {"what": "teacher-forced replay of memory policies over a stream that changes topic (docs/memory.md)",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_name('cpu'), "gamma": d.gamma, "lam": lam, "tau": tau, "half_lives": list(half_lives),
           "stream": {"items": len(stream["items"]), "pair": stream["pair"],
                      "representation": Representation.of(stream).as_dict(), "max_text_tokens": stream["max_text_tokens"],
                      "positions": sum(len(r["ref"]) for r in stream["items"]), "read_s": stream.get("read_s")},
           "scenarios": {"empty": run_scenario(stream, None, rescue, d.gamma, half_lives)}}
    shipped = CorrectionMemory.load(DEFAULT_MEMORY_FILE)
    if shipped.pair_id == stream["pair"]:               # the shipped memory is the embedded pair's
        out["scenarios"]["shipped"] = run_scenario(stream, shipped, rescue, d.gamma, half_lives)
    out["replay_s"] = time.perf_counter() - t0
    write_json(run / RESULTS, out)
    from .memory_chart import memory_figure
    memory_figure(out).write_html(run / CHART, include_plotlyjs="cdn", full_html=True)
    return out


def fmt_recovery(items: list) -> str:
    """Items to recover after each change; "-": no rescues in that topic's second half; "never"."""
    return ", ".join("never" if k is None else str(k) for k in items)


def table(out: dict, scenario: str) -> str:
    """The scenario as a Markdown table (docs/memory.md)."""
    sc = out["scenarios"][scenario]
    head = ["policy", "rescues / 100 tokens", "share of unbounded rescues", "tokens / pass", "patterns at the end",
            "bytes (device)", "file (gz)", "unearned rescues", "rescued = reference", "carried over (prose)",
            "recovery (items)"]
    rows = [[p["name"], f"{p['rescues_per_100']:.2f}", f"{p['share_of_unbounded_rescues']:.1%}",
             f"{p['tokens_per_pass']:.3f}", f"{p['final_patterns']:,}", f"{p['final_bytes']:,}",
             f"{p['file_bytes_gz']:,}", f"{p['unearned']:,}", f"{p['rescues_matching_reference']:.1%}",
             f"{p['per_topic'][sc['topics'][-1]]['carried_over_share']:.1%}", fmt_recovery(p["recovery_items"])]
            for p in sc["policies"]]
    return "\n".join([*md_table(head, rows), f"\nSD (no rescue): {sc['sd_tokens_per_pass']:.3f} tokens / pass."])


if __name__ == "__main__":     # python -m csd.bench.memory_replay RUN: print the tables of a replayed run
    import sys
    res = json.loads((Path(sys.argv[1]) / RESULTS).read_text())
    for name in res["scenarios"]:
        print(f"\n## {name}\n\n{table(res, name)}")
