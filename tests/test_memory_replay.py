"""The memory-policy replay (bench.memory_replay, bench.memory_stream) on hand-made streams: blocks decided by
csd.rule.decide, rescues only once a pattern reached lambda, capacities and the sketch as they should be, the
recovery measure, and the stream's reference texts."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from csd.bench.memory_replay import Arm, CountMinSketch, recovery, replay_run, run_arm, table
from csd.bench.memory_stream import gsm8k_solution, truncate
from csd.memory import CorrectionMemory, MemoryPolicy
from csd.rule import Rescue

RULE = Rescue.of(True, True, lam=2, tau=0.01)


def item(topic: str, pattern: tuple[int, int], n: int = 12, gap: float = -1.0) -> dict:
    """n positions; every third the draft proposes pattern[0] where the target wants pattern[1]."""
    d, t = [], []
    for i in range(n + 1):
        t.append(pattern[1] if i % 3 == 0 else 50 + i)
        d.append(pattern[0] if i % 3 == 0 else 50 + i)
    return {"topic": topic, "item_id": topic, "ref": t[:n], "d": d, "t": t,
            "gap": [gap if a != b else 0.0 for a, b in zip(d, t)]}


def test_a_pattern_is_rescued_only_once_the_memory_saw_it_lambda_times():
    stream = {"items": [item("code", (1, 2)) for _ in range(3)]}
    res = run_arm(stream, CorrectionMemory("p"), RULE, gamma=6)
    first, second, third = res["per_item"]
    assert first["rescued"] == 2 and first["divergences"] == 4   # the first two occurrences are rejected
    assert second["rescued"] == third["rescued"] == 3 and res["memory"].count(1, 2) == 10   # the bonus token's
    # position (after six kept) is the target's own, never decided: 3 of the 4 divergences are met
    assert first["passes"] > second["passes"]                      # rescues lengthen the blocks
    far = run_arm(stream | {"items": [item("code", (1, 2), gap=-9.0)]}, CorrectionMemory("p"), RULE, 6)
    assert far["per_item"][0]["rescued"] == 0                      # the gate: gap below log tau


def test_a_capacity_of_one_pattern_forgets_the_first_topic():
    stream = {"items": [item("code", (1, 2)), item("code", (1, 2)), item("prose", (3, 4)), item("code", (1, 2))]}
    res = run_arm(stream, CorrectionMemory("p", policy=MemoryPolicy(capacity=1)), RULE, 6)
    assert [r["size"] for r in res["per_item"]] == [1, 1, 1, 1]
    assert res["per_item"][3]["rescued"] < res["per_item"][1]["rescued"]   # (1, 2) had to be learned again
    full = run_arm(stream, CorrectionMemory("p"), RULE, 6)
    assert full["per_item"][3]["rescued"] == 3 and full["per_item"][3]["carried"] == 0


def test_the_sketch_never_counts_below_the_truth():
    sk, truth = CountMinSketch(8), Counter()
    for k in range(40):
        sk.observe(k % 13, k % 7)
        truth[(k % 13, k % 7)] += 1
    assert all(sk.count(*p) >= c for p, c in truth.items()) and sk.nbytes == 32


def test_recovery_counts_items_to_ninety_percent_of_the_topics_level():
    rescued = [5, 5, 5, 5, 0, 0, 5, 10, 10, 10, 10, 10, 0, 0, 0, 0]
    tokens = [100] * 16
    # the second topic (items 4-11) levels at 10 per 100 tokens (its second half); windows of 3 of its own items:
    # 0, 0, 5/3, 15/3, 25/3 < 9, then 30/3 >= 9 at its sixth item; the third topic has no rescues
    assert recovery(rescued, tokens, [0, 4, 12], w=3) == [6, "-"]
    assert recovery([1, 1, 0, 3, 3, 3], [100] * 6, [0, 2], w=2) == [3]
    assert recovery([1, 1, 0, 3, 3, 3], [100] * 6, [0, 2]) == [None]    # the window's early 0 keeps it under 2.7


def test_replay_run_writes_results_and_a_chart(tmp_path):
    items = [item(tp, (1 + k, 2 + k)) for k, tp in enumerate(("humaneval", "gsm8k", "prose")) for _ in range(4)]
    stream = {"pair": "p", "target_repr": "int8", "draft_repr": "int8", "special": [], "max_text_tokens": 12,
              "items": items}
    (tmp_path / "stream.json.gz").write_bytes(gzip.compress(json.dumps(stream).encode()))
    out = replay_run(tmp_path, lam=2, half_lives=(4, 16))
    assert (tmp_path / "memory.html").stat().st_size > 1000
    back = json.loads((tmp_path / "results.json").read_text())
    names = [p["name"] for p in back["scenarios"]["empty"]["policies"]]
    assert names[0] == "unbounded" and any(n.startswith("half-life 4") for n in names) and len(names) == 9
    unbounded = back["scenarios"]["empty"]["policies"][0]
    assert unbounded["share_of_unbounded_rescues"] == 1 and unbounded["final_patterns"] == 3
    assert "| unbounded |" in table(out, "empty")


def test_the_reference_texts():
    assert gsm8k_solution("He has 2*3=<<2*3=6>>6 apples.\n#### 6") == "He has 2*3=6 apples.\nThe answer is 6."
    row = {"ref": [1, 2, 3], "d": [1, 2, 3, 4], "t": [1, 2, 3, 4], "gap": [0, 0, 0, 0]}
    assert truncate(row, 2) == {"ref": [1, 2], "d": [1, 2, 3], "t": [1, 2, 3], "gap": [0, 0, 0]}


@pytest.mark.parametrize("arm", [Arm("sketch", None, 64)])
def test_the_sketch_arm_runs_like_a_memory(arm):
    from csd.bench.memory_replay import new_memory
    sk = new_memory(arm, "p", None)
    res = run_arm({"items": [item("code", (1, 2)) for _ in range(2)]}, sk, RULE, 6)
    assert res["per_item"][1]["rescued"] == 3 and res["per_item"][1]["unearned"] == 0
