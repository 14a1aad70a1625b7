"""The benchmark harness: datasets, graders, summaries, and one smoke run on the real embedded pair."""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter

import pytest

from bench.datasets import (DatasetError, load_champ, load_dataset, load_file, load_gsm8k, load_humaneval,
                            load_prose)
from bench.graders import (champ_checkable, extract_code, extract_final_number, grade, grade_champ, gsm8k_reference,
                           humaneval_program, numbers_equal)
from bench.sandbox import run_humaneval


# -- GSM8K -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("3 + 4 = 7 apples. The answer is 7.", "7"),
    ("She pays $1,250 in total.\nThe answer is $1,250.", "1250"),
    ("The answer is: **18**", "18"),
    ("Step 1: 5 * 3 = 15\nStep 2: 15 - 2 = 13\nSo the total is 13", "13"),
    ("The final result is \\boxed{42}.", "42"),
    ("The answer is -3.50 degrees", "-3.50"),
    ("The answer is 12. Check: 12 / 4 = 3", "12"),
    ("no number here", None),
])
def test_gsm8k_final_number(text, expected):
    assert extract_final_number(text) == expected


def test_gsm8k_reference_and_comparison():
    assert gsm8k_reference("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert gsm8k_reference("...\n#### 1,000") == "1000"
    assert numbers_equal("1000", "1,000")
    assert numbers_equal("1234.50", "1234.5")
    assert not numbers_equal("18", "19")
    assert not numbers_equal(None, "18")
    item = load_gsm8k()[0]
    assert item.grader == "number" and item.reference == gsm8k_reference("#### " + item.reference)
    assert grade(item, f"Some work.\nThe answer is {item.reference}.").correct is True
    assert grade(item, "The answer is 123456789.").correct is False


# -- HumanEval ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def humaneval():
    return {it.item_id: it for it in load_humaneval()}


def test_humaneval_canonical_passes_wrong_fails(humaneval):
    it = humaneval["HumanEval/0"]
    x = it.extra
    answer = f"Here is the function:\n```python\n{x['prompt']}{x['canonical_solution']}```\nIt works."
    assert grade(it, answer).correct is True                                     # full function in a block
    assert run_humaneval(humaneval_program(x["prompt"], x["canonical_solution"], x["entry_point"]),
                         x["test"], x["entry_point"]) == (True, "passed")        # a bare body
    ok, detail = run_humaneval(humaneval_program(x["prompt"], "    return True\n", x["entry_point"]),
                               x["test"], x["entry_point"])
    assert not ok and "AssertionError" in detail
    truncated = f"```python\n{x['prompt']}    for i in range(len("                # cut off mid-line
    assert grade(it, truncated).correct is False
    # a later block of the model's own tests is not the solution; a main guard does not run
    extra = (f"```python\n{x['prompt']}{x['canonical_solution']}```\nTests:\n```python\ndef test_it():\n"
             f"    assert False\n\nif __name__ == '__main__':\n    raise SystemExit(input())\n```")
    assert grade(it, extra).correct is True


def test_humaneval_timeout_kills_infinite_loop(humaneval):
    x = humaneval["HumanEval/0"].extra
    t0 = time.monotonic()
    ok, detail = run_humaneval(humaneval_program(x["prompt"], "    while True:\n        pass\n", x["entry_point"]),
                               x["test"], x["entry_point"], timeout=2)
    assert not ok and "timed out" in detail
    assert time.monotonic() - t0 < 6


def test_humaneval_sandbox_isolation(monkeypatch, tmp_path):
    """Runs in a fresh temporary cwd, without the caller's environment (proxies, PYTHONPATH)."""
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    program = ("import os, sys, tempfile\n"
               "def f():\n"
               "    assert 'HTTP_PROXY' not in os.environ and 'PYTHONPATH' not in os.environ\n"
               f"    assert os.getcwd() != {str(tmp_path)!r}\n"
               "    assert os.path.basename(os.getcwd()).startswith('csd-humaneval-')\n"
               "    open('left_behind.txt', 'w').write('x')\n"
               "    return 1\n")
    assert run_humaneval(program, "def check(fn):\n    assert fn() == 1\n", "f") == (True, "passed")
    assert not (tmp_path / "left_behind.txt").exists()
    # memory limit: allocating far beyond it fails instead of swapping the machine
    hog = "def f():\n    return len(bytearray(8 << 30))\n"
    ok, detail = run_humaneval(hog, "def check(fn):\n    fn()\n", "f")
    assert not ok and "MemoryError" in detail


def test_extract_code():
    text = "Sure.\n```python\nimport math\n```\nand\n```python\ndef g(x):\n    return x\n```\nDone"
    assert extract_code(text).startswith("def g(x)")
    assert extract_code("```\ndef h():\n    pass\n") == "def h():\n    pass\n"     # unterminated block
    two = "```python\ndef f(x):\n    return 1\n```\n```python\ndef test_f():\n    assert f(0)\n```"
    assert extract_code(two, "f").startswith("def f(x)") and extract_code(two).startswith("def test_f")
    assert extract_code("    return 1\n") == "    return 1\n"                        # no fence: raw text


# -- CHAMP -------------------------------------------------------------------------------------
def test_champ_grading():
    assert grade_champ("Thus ... The final answer is: 239.", "239").correct is True
    assert grade_champ("The final answer is: 240", "239").correct is False
    assert grade_champ("The final answer is: \\frac{1}{18}", "1/18").correct is True
    assert grade_champ("The final answer is: No, such a sequence cannot exist.", "No").correct is True
    assert grade_champ("The final answer is: Yes", "No").correct is False
    assert grade_champ("I could not finish", "239").correct is False
    assert grade_champ("The final answer is: x^3-1", "x^3-1").correct is None           # not checkable
    items = load_champ()
    kinds = Counter(champ_checkable(it.reference) for it in items)
    assert kinds["number"] >= 70 and kinds["yesno"] >= 10 and kinds[None] > 0


# -- loaders and seeds -------------------------------------------------------------------------
def test_dataset_counts():
    assert len(load_gsm8k()) == 1319
    assert len(load_humaneval()) == 164
    assert len(load_champ()) == 270
    assert len(load_prose()) >= 100
    assert len({it.item_id for it in load_gsm8k()}) == 1319


def test_prose_is_disjoint_from_calibration():
    from csd.calibrate import default_corpus, pydoc_topics

    calib = {name for name, _ in pydoc_topics("calibration")}
    items = load_prose()
    topics = {it.item_id.split("/")[1] for it in items}
    assert topics and not topics & calib
    corpus = "\n".join(default_corpus())
    for it in items:
        passage = it.prompt.split("\n\n", 1)[1]
        assert passage[:120] not in corpus and passage[-120:] not in corpus, it.item_id


def test_seed_fixes_items():
    a = [it.item_id for it in load_dataset("gsm8k", 20, seed=3)]
    b = [it.item_id for it in load_dataset("gsm8k", 20, seed=3)]
    c = [it.item_id for it in load_dataset("gsm8k", 20, seed=4)]
    assert a == b and a != c and len(set(a)) == 20
    assert [it.item_id for it in load_dataset("gsm8k", 5, seed=3)] == a[:5]       # a smaller limit is a prefix
    assert len(load_dataset("humaneval", None, seed=0)) == 164
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("no-such-dataset")


def test_user_file(tmp_path):
    j = tmp_path / "mine.jsonl"
    j.write_text('{"question": "What is 2+2?", "answer": "4"}\n\n{"prompt": "Write a haiku."}\n')
    items = load_file(j)
    assert [it.prompt for it in items] == ["What is 2+2?", "Write a haiku."]
    assert items[0].grader == "number" and items[0].reference == "4" and items[1].grader is None
    assert grade(items[0], "The answer is 4").correct is True
    t = tmp_path / "prompts.txt"
    t.write_text("first prompt\n\nsecond prompt\n")
    assert [it.prompt for it in load_dataset(str(t), seed=0)] in (["first prompt", "second prompt"],
                                                                  ["second prompt", "first prompt"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"answer": 3}\n')
    with pytest.raises(DatasetError, match="no 'prompt'"):
        load_file(bad)


# -- summaries (pure functions over records) -----------------------------------------------------
def _rec(ds, iid, method, wall, tokens, passes, **kw):
    from bench.harness import ItemResult
    return ItemResult(ds, iid, method, 0, wall, tokens, passes, None, **kw)


def test_summary_speedups_and_pairing():
    from bench.harness import check_targets, summarize

    recs = [
        _rec("a", "1", "ar", 10.0, 10, 10, correct=True), _rec("a", "1", "sd", 5.0, 10, 4, drafted=12, accepted=8,
                                                               rescued=0, correct=True),
        _rec("a", "2", "ar", 10.0, 20, 20, correct=False), _rec("a", "2", "sd", 4.0, 10, 3, drafted=12, accepted=9,
                                                                rescued=0, correct=True),
        _rec("a", "3", "ar", 99.0, 10, 10),                              # sd never finished item 3: excluded
    ]
    s = summarize(recs, ["ar", "sd"])["a"]
    assert s["ar"]["n"] == s["sd"]["n"] == 2
    assert s["sd"]["speedup_wall"] == pytest.approx(20.0 / 9.0)
    # per-item tok/s ratios: (10/5)/(10/10) = 2 and (10/4)/(20/10) = 1.25
    assert s["sd"]["speedup_tps_mean"] == pytest.approx((2 + 1.25) / 2)
    assert s["sd"]["target_passes"] == 7 and s["sd"]["mean_accepted_length"] == pytest.approx(20 / 7)
    assert s["sd"]["acceptance_rate"] == pytest.approx(17 / 24)
    assert s["sd"]["accuracy"] == 1.0 and s["ar"]["accuracy"] == 0.5
    assert s["sd"]["accuracy_vs_ar"] == {"n": 2, "gained": 1, "lost": 0, "diff": 0.5}
    assert s["ar"]["acceptance_rate"] is None
    t = check_targets(s)
    assert t["csd_over_ar"]["value"] is None and t["csd_over_ar"]["met"] is None


def test_pareto():
    from bench.harness import pareto

    p = pareto(Counter({(1, 2): 60, (3, 4): 20, (5, 6): 10, (7, 8): 5, (9, 10): 5}))
    assert p["patterns"] == 5 and p["divergences"] == 100
    assert p["top20_patterns"] == 1 and p["top20_share"] == pytest.approx(0.6)
    assert p["cumulative"][-1] == pytest.approx(1.0)
    assert pareto(Counter())["top20_share"] is None


def test_cli_parser():
    from cli.bench import add_parser, cmd_bench

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(["bench", "--dataset", "gsm8k,prose", "--limit", "3", "--methods", "ar,csd",
                           "--max-new-tokens", "32", "--out", "x", "--dtype", "float32", "--seed", "7"])
    assert (a.dataset, a.limit, a.methods, a.max_new_tokens, a.out, a.dtype, a.seed) == \
        ("gsm8k,prose", 3, "ar,csd", 32, "x", "float32", 7)
    assert a.func is cmd_bench


# -- the whole harness on the real embedded pair (float32, shared with the engine tests) ------------
def test_bench_smoke_real_pair(real_pair, tmp_path):
    from bench.harness import run_bench
    from db.store import Store

    methods = ["ar", "sd", "csd", "hf-assisted"]
    with Store.open("sqlite://") as store:
        res = run_bench(real_pair, "gsm8k,humaneval", 2, ",".join(methods), 12, tmp_path, seed=1, store=store,
                        show_bar=False)
        from db.models import Run
        from sqlalchemy import func, select
        with store.session() as s:
            runs = s.scalar(select(func.count()).select_from(Run).where(Run.kind == "bench"))
        assert runs == 2 * 2 * len(methods)

    for name in ("results.json", "results.md", "speedup.html", "divergences.html", "memory_csd.json.gz"):
        assert (tmp_path / name).is_file(), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["status"] == res["status"] == "finished"
    assert on_disk["meta"]["dtype"] == "float32" and on_disk["meta"]["config"]["max_new_tokens"] == 12
    items = on_disk["items"]
    assert len(items) == 2 * 2 * len(methods)
    assert Counter(it["dataset"] for it in items) == {"gsm8k": 8, "humaneval": 8}
    # the method order rotates from item to item
    orders = {}
    for it in items:
        orders.setdefault((it["dataset"], it["item_id"]), {})[it["method"]] = it["order"]
    assert len({tuple(o[m] for m in methods) for o in orders.values()}) > 1
    for it in items:
        assert it["wall_s"] > 0 and 1 <= it["new_tokens"] <= 12
        assert it["correct"] in (True, False)                      # both datasets are graded
        if it["method"] == "ar":
            assert it["target_passes"] == it["new_tokens"] and it["identical_to_ar"] is True
        elif it["method"] in ("sd", "csd"):
            # every target pass emits one token of its own, except a pass whose block ended at EOS
            kept = it["accepted"] + it["rescued"]
            assert kept + it["target_passes"] - 1 <= it["new_tokens"] <= kept + it["target_passes"]
            assert kept <= it["drafted"]
            if it["method"] == "sd":
                assert it["identical_to_ar"] is True          # greedy SD is lossless in float32
        else:   # hf-assisted: passes counted by hooks
            assert 1 <= it["target_passes"] <= it["new_tokens"]
    summary = on_disk["summary"]
    assert set(summary) == {"gsm8k", "humaneval", "all"}
    allm = summary["all"]
    assert allm["ar"]["speedup_wall"] == pytest.approx(1.0)
    assert allm["ar"]["target_passes"] == allm["ar"]["new_tokens"] == sum(
        it["new_tokens"] for it in items if it["method"] == "ar")
    for m in ("sd", "csd"):   # whether speculation saves passes is measured, not asserted (it depends on the CPU)
        assert allm[m]["target_passes"] <= allm[m]["new_tokens"]
        assert allm[m]["mean_accepted_length"] == pytest.approx(allm[m]["new_tokens"] / allm[m]["target_passes"])
        assert allm[m]["speedup_wall"] == pytest.approx(allm["ar"]["wall_s"] / allm[m]["wall_s"])
    md = (tmp_path / "results.md").read_text()
    for m in methods:
        assert f"| all | {m} | 4 |" in md
    html = (tmp_path / "speedup.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc=", html) and len(html) > 1_000_000           # plotly.js inline
    assert re.search(r"plotly\.js v\d", html)


def test_bench_interrupt_keeps_finished_items(real_pair, tmp_path):
    from bench.harness import run_bench

    def progress(msg, frac):
        if msg.startswith("gsm8k") and frac >= 2 / 6 - 1e-9:
            raise KeyboardInterrupt      # as if Ctrl-C hit as the second item starts

    with pytest.raises(KeyboardInterrupt):
        run_bench(real_pair, "gsm8k", 3, "ar,sd", 4, tmp_path, seed=0, progress=progress, warmup=False, show_bar=False)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "interrupted"
    assert [it["method"] for it in res["items"]] == ["ar", "sd"]        # the first item, complete
    assert res["summary"]["gsm8k"]["ar"]["n"] == 1
    assert "interrupted" in (tmp_path / "results.md").read_text()
