"""The benchmark harness: datasets, graders, summaries, and one smoke run on the real embedded pair."""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter

import pytest

from csd.evaluation.datasets import (
    DatasetError,
    gsm8k_split,
    load_champ,
    load_dataset,
    load_file,
    load_gsm8k,
    load_humaneval,
    load_prose,
)
from csd.evaluation.graders import grade


# -- loaders and seeds -------------------------------------------------------------------------
def test_dataset_counts():
    assert len(load_gsm8k(split=None)) == 1319
    evals = load_gsm8k()                      # the benchmark never draws the calibration split
    assert 900 < len(evals) < 1100 and all(gsm8k_split(it.item_id) == "eval" for it in evals)
    assert len(load_humaneval()) == 164
    assert len(load_champ()) == 270
    assert len(load_prose()) >= 100
    assert len({it.item_id for it in load_gsm8k(split=None)}) == 1319


def test_prose_is_disjoint_from_calibration():
    from csd.corpus import default_corpus, pydoc_topics

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
    from csd.bench.results import ItemResult
    return ItemResult(ds, iid, method, 0, wall, tokens, passes, None, **kw)


def test_summary_speedups_and_pairing():
    from csd.bench.results import check_targets, summarize

    recs = [
        _rec("a", "1", "ar", 10.0, 10, 10, correct=True), _rec("a", "1", "sd", 5.0, 10, 4, drafted=12, accepted=8,
                                                               rescued=0, correct=True),
        _rec("a", "2", "ar", 10.0, 20, 20, correct=False), _rec("a", "2", "sd", 4.0, 10, 3, drafted=12, accepted=9,
                                                                rescued=0, correct=True),
        _rec("a", "3", "ar", 99.0, 10, 10),                              # sd never finished item 3: excluded
    ]
    s = summarize(recs, ["ar", "sd"])["a"]
    assert s["ar"]["n"] == s["sd"]["n"] == 2
    # a speed-up is a ratio of tok/s (20 tokens in 9 s over AR's 30 in 20 s), not of summed walls (20/9)
    assert s["sd"]["speedup_over_ar"] == pytest.approx((20 / 9) / (30 / 20))
    assert s["ar"]["speedup_over_ar"] == pytest.approx(1.0) and "speedup_over_ar_ci95" not in s["ar"]
    assert s["sd"]["target_passes"] == 7 and s["sd"]["mean_accepted_length"] == pytest.approx(20 / 7)
    assert s["sd"]["acceptance_rate"] == pytest.approx(17 / 24)
    assert s["sd"]["accuracy"] == 1.0 and s["ar"]["accuracy"] == 0.5
    assert s["sd"]["accuracy_vs_ar"] == {"n": 2, "gained": 1, "lost": 0, "diff": 0.5, "p_value": 1.0}
    assert s["sd"]["accuracy_ci95"][0] < 1.0 == s["sd"]["accuracy_ci95"][1]
    assert s["ar"]["acceptance_rate"] is None
    t = check_targets(s)
    assert t["csd_over_ar"]["value"] is None and t["csd_over_ar"]["met"] is None
    assert t["csd_share_of_bound"]["value"] is None


def test_share_of_the_bound_is_judged_only_where_the_bound_is_under_2x():
    from csd.bench.results import check_targets
    stats = {"csd": {"speedup_over_ar": 1.36}}
    low = check_targets(stats, bound=1.66)["csd_share_of_bound"]
    assert low["value"] == pytest.approx(1.36 / 1.66) and low["met"] is True
    assert check_targets(stats, bound=1.75)["csd_share_of_bound"]["met"] is False        # 78% of 1.75x
    high = check_targets(stats, bound=2.1)["csd_share_of_bound"]
    assert high["value"] == pytest.approx(1.36 / 2.1) and high["met"] is None           # 2x is the goal there
    assert check_targets(stats)["csd_share_of_bound"]["value"] is None                   # no profile


def test_pareto_wilson_mcnemar():
    from csd.bench.stats import mcnemar_exact, pareto, wilson

    p = pareto(Counter({(1, 2): 60, (3, 4): 20, (5, 6): 10, (7, 8): 5, (9, 10): 5}))
    assert p["patterns"] == 5 and p["divergences"] == 100
    assert p["top20_patterns"] == 1 and p["top20_share"] == pytest.approx(0.6)
    assert p["cumulative"][-1] == pytest.approx(1.0)
    assert pareto(Counter())["top20_share"] is None
    lo, hi = wilson(8, 10)                        # the textbook value: 0.490 .. 0.943
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson(0, 0) is None and wilson(0, 5)[0] == 0.0
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024) and mcnemar_exact(0, 10) == mcnemar_exact(10, 0)


def test_speedup_interval_over_items():
    from csd.bench.results import check_targets, summarize
    from csd.bench.stats import speedup

    # (tokens, wall, ref tokens, ref wall) per item: every item about 2x the reference's tok/s
    steady = [(10, 1.0, 10 - (i % 3), 2.0 - 0.2 * (i % 3)) for i in range(20)]
    value, (lo, hi) = speedup(steady)
    assert value == pytest.approx((200 / 20) / (sum(r[2] for r in steady) / sum(r[3] for r in steady)))
    assert 1.9 < lo <= value <= hi < 2.1
    mixed = [(30, 1.0, 10, 1.0), (5, 1.0, 10, 1.0)] * 5                # items disagree: the interval is wide
    v_m, (lo_m, hi_m) = speedup(mixed)
    assert v_m == pytest.approx(1.75) and lo_m < 1.75 < hi_m and hi_m - lo_m > 0.5
    assert speedup(mixed) == (v_m, [lo_m, hi_m])                        # seeded: a report renders the same
    # tokens count, not only time: the same wall with half the tokens is half the speed
    assert speedup([(5, 1.0, 10, 1.0), (5, 1.0, 10, 1.0)])[0] == pytest.approx(0.5)
    assert speedup([(20, 1.0, 10, 1.0)]) == (pytest.approx(2.0), None)  # one item: no interval
    assert speedup([]) == (None, None) and speedup([(1, 0.0, 1, 1.0)]) == (None, None)
    # the summary and the goals carry it for each speed-up, from the items' tokens and wall times
    recs = [_rec("a", str(i), "ar", 10.0, 10, 10) for i in range(6)] + \
        [_rec("a", str(i), "csd", 5.0 + i, 10, 4, drafted=12, accepted=8, rescued=1) for i in range(6)]
    s = summarize(recs, ["ar", "csd"])["a"]
    lo_s, hi_s = s["csd"]["speedup_over_ar_ci95"]
    assert s["csd"]["speedup_over_ar"] == pytest.approx(60 / 45) and lo_s < 60 / 45 < hi_s
    assert "speedup_over_ar_ci95" not in s["ar"]
    assert check_targets(s)["csd_over_ar"]["ci95"] == [lo_s, hi_s]


def test_where_answers_leave_sd():
    from csd.bench.report import leave_sd_lines
    from csd.bench.results import leaves_at

    def dec(ids):
        return "".join(chr(96 + i) for i in ids)

    assert leaves_at([1, 2, 3], [1, 2, 3], dec) is None
    assert leaves_at([1, 2, 3], [1, 5, 3], dec) == [1, "b", "e"]
    assert leaves_at([1, 2], [1, 2, 4], dec) == [2, "", "d"]            # past SD's end
    items = [{"dataset": "h", "item_id": str(i), "method": "csd", "leaves_sd_at": [3, "def", "from"]} for i in range(3)]
    items += [{"dataset": "g", "item_id": "9", "method": "csd", "leaves_sd_at": [0, "a|b", "`x\n"]},
              {"dataset": "g", "item_id": "8", "method": "ar", "leaves_sd_at": [1, "q", "r"]},
              {"dataset": "g", "item_id": "7", "method": "csd", "leaves_sd_at": None}]
    table = "\n".join(leave_sd_lines({"items": items}))
    assert "(4 answers differ" in table
    assert "| `def` | `from` | 3 | h 3 | 3 |" in table                      # grouped by the pair, most first
    assert "| `a\\|b` | `` `x\\n `` | 1 | g 1 | 0 |" in table            # escaped for a Markdown table
    assert "`q`" not in table                                          # AR is not a CSD column
    assert leave_sd_lines({"items": items[-2:]}) == []


def test_an_older_run_of_the_embedded_pair_gains_where_answers_leave_sd(qwen_tokenizer):
    from csd.bench.results import fill_leaves_sd_at
    from csd.runtime.pair import EMBEDDED_PAIR_ID

    enc = qwen_tokenizer.encode
    sd_ids, csd_ids = enc("```python\ndef f(x):"), enc("```python\nfrom typing import *")

    def item(iid, method, ids):
        return {"dataset": "humaneval", "item_id": iid, "method": method, "order": 0, "wall_s": 1.0,
                "new_tokens": len(ids), "target_passes": 1, "draft_passes": None, "token_ids": ids}

    run = {"meta": {"models": {"pair_id": EMBEDDED_PAIR_ID}},
           "items": [item("1", "sd", sd_ids), item("1", "csd", csd_ids), item("2", "sd", sd_ids),
                     item("2", "csd", sd_ids)]}
    fill_leaves_sd_at(run)
    at = [it["leaves_sd_at"] for it in run["items"]]
    assert at[0] is None and at[3] is None                         # SD itself; an answer equal to SD's
    i = at[1][0]
    assert sd_ids[:i] == csd_ids[:i] and at[1][1:] == [qwen_tokenizer.decode([sd_ids[i]]),
                                                       qwen_tokenizer.decode([csd_ids[i]])]
    assert at[1][1].strip() == "def" and at[1][2].strip() == "from"
    other = {"meta": {"models": {"pair_id": "a->b"}}, "items": [item("1", "sd", sd_ids), item("1", "csd", csd_ids)]}
    fill_leaves_sd_at(other)                                     # another pair: no tokenizer at hand, left alone
    assert all("leaves_sd_at" not in it for it in other["items"])


def test_methods_and_sweep():
    from csd.bench.methods import make_methods, parse_sweep
    from csd.config import CSDConfig

    assert parse_sweep("lam=6,tau=0.01; lam=3,tau=0.1;lam=3,tau=0.1") == [{"lam": 6.0, "tau": 0.01},
                                                                          {"lam": 3.0, "tau": 0.1}]
    assert parse_sweep("gamma=auto;lam=2,gamma=4") == [{"gamma": "auto"}, {"lam": 2.0, "gamma": 4}]
    for bad in ("lam", "lam=x,tau=1", "lam=-1,tau=0.1", "lam=6,tau=2", "gamma=0", "speed=9", "int8_activations=x",
                "method=ar,gamma=4", "method=hf-ar,activations=pass"):
        with pytest.raises(ValueError):
            parse_sweep(bad)
    acts = make_methods("ar", CSDConfig(lookup=16), "method=ar,activations=pass;method=sd,activations=pass")
    assert [(c.name, c.cfg.method, c.cfg.lookup, c.acts) for c in acts] == [
        ("ar", "ar", 0, ""), ("ar[activations=pass]", "ar", 0, "pass"), ("sd[activations=pass]", "sd", 16, "pass")]
    cols = make_methods("sd,csd,hf-assisted,hf-assisted-fixed", CSDConfig(method="ar"),
                        "lam=6,tau=0.01;lam=2,tau=1;gamma=auto")
    assert [c.name for c in cols] == ["sd", "csd", "hf-assisted", "hf-assisted-fixed", "csd[lam=2,tau=1]",
                                      "csd[gamma=auto]"]
    assert cols[-1].cfg.gamma == "auto" and cols[-1].cfg.lam == 6
    assert cols[-2].cfg.lam == 2 and cols[-2].cfg.tau == 1 and cols[-2].reads_memory
    assert cols[2].hf == "defaults" and cols[3].hf == "fixed" and not cols[2].reads_memory
    with pytest.raises(ValueError, match="unknown method"):
        make_methods("sd,turbo", CSDConfig())


def test_harness_on_a_tiny_pair(tmp_path, qwen_tokenizer):
    """The whole harness, fast: a tiny target, its perturbed copy as the draft, a prompt file, a
    sweep; every output written, summaries paired, SD equal to AR (float32)."""
    from conftest import tiny_bench_pair
    from csd.bench.harness import BenchConfig, run_bench

    pair = tiny_bench_pair(qwen_tokenizer)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": "4"}) for i in range(3)))
    res = run_bench(pair, BenchConfig(str(prompts), None, "ar,sd,csd", 16, tmp_path / "out",
                                      sweep="lam=0,tau=1;lam=6,tau=0.01", show_bar=False))
    out = tmp_path / "out"
    for name in ("results.json", "results.md", "speedup.html", "divergences.html", "frontier.html",
                 "frontier.json", "memory_csd.json.gz", "memory_csd_lam=0_tau=1.json.gz"):
        assert (out / name).is_file(), name
    frontier_md = (out / "results.md").read_text().split("## Frontier (all items)")[1]
    assert "| csd[lam=0,tau=1] | " in frontier_md and "| sd | " in frontier_md
    s = res["summary"]["p"]
    assert set(s) == {"ar", "sd", "csd", "csd[lam=0,tau=1]"}
    assert all(s[m]["n"] == 3 for m in s) and s["sd"]["identical_to_ar"] == 3     # greedy SD is lossless in fp32
    for m in ("sd", "csd", "csd[lam=0,tau=1]"):
        assert s[m]["speedup_over_sd"] == pytest.approx(s[m]["tokens_per_s"] / s["sd"]["tokens_per_s"])
        assert 0 <= s[m]["eos_share"] <= 1 and s[m]["accuracy_ci95"] is not None
    assert {p["method"] for p in res["frontier"]} == set(s)
    assert res["summary"]["p"]["sd"]["tokens_per_s"] > 0          # the contract scripts read
    for it in res["items"]:                                        # where each answer leaves SD's, if it does
        assert (it["leaves_sd_at"] is None) == (it["method"] == "sd" or it["identical_to_sd"])
    # a run re-rendered by the current code: a run from before a figure existed gains it, nothing else moves
    from csd.bench.report import main as rerender
    md = (out / "results.md").read_text()
    assert "bootstrap interval over the items" in md
    old = json.loads((out / "results.json").read_text())
    for stats in old["summary"].values():
        for s_m in stats.values():
            for k in [k for k in s_m if k.endswith("_ci95") and k.startswith("speedup")]:
                del s_m[k]
    (out / "results.json").write_text(json.dumps(old))
    assert rerender([str(out)]) == 0
    assert (out / "results.md").read_text() == md
    assert json.loads((out / "results.json").read_text())["summary"] == json.loads(json.dumps(res["summary"]))
    assert rerender([str(tmp_path / "nowhere")]) == 2
    # runs of one set-up on different items pooled into one report: the speed-ups are over all the items
    other = json.loads((out / "results.json").read_text())
    for it in other["items"]:
        it["item_id"] += "b"
        it["wall_s"] *= 3 if it["method"] == "sd" else 1       # a second run where SD was slower
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "results.json").write_text(json.dumps(other))
    assert rerender([str(out), str(tmp_path / "run2"), "--out", str(tmp_path / "pooled")]) == 0
    pooled = json.loads((tmp_path / "pooled" / "results.json").read_text())
    ps, items = pooled["summary"]["p"], pooled["items"]
    assert pooled["status"] == "pooled" and ps["csd"]["n"] == 6 and len(pooled["meta"]["pooled_from"]) == 2
    tps = {m: sum(it["new_tokens"] for it in items if it["method"] == m)
           / sum(it["wall_s"] for it in items if it["method"] == m) for m in ("sd", "csd")}
    assert ps["csd"]["speedup_over_sd"] == pytest.approx(tps["csd"] / tps["sd"])
    lo, hi = ps["csd"]["speedup_over_sd_ci95"]
    assert lo <= ps["csd"]["speedup_over_sd"] <= hi
    assert "Pooled, run 2 of 2" in (tmp_path / "pooled" / "results.md").read_text()
    # the same items twice, a different set-up, or several runs without --out: refused, nothing written
    assert rerender([str(out), str(out), "--out", str(tmp_path / "twice")]) == 2
    other["meta"]["config"]["max_new_tokens"] = 99
    (tmp_path / "run2" / "results.json").write_text(json.dumps(other))
    assert rerender([str(out), str(tmp_path / "run2"), "--out", str(tmp_path / "mixed")]) == 2
    # an int8 target smoothed in one run only gives other answers: not one set-up either (a run from
    # before smoothing existed records none and counts as unsmoothed)
    other["meta"]["config"]["max_new_tokens"] = old["meta"]["config"]["max_new_tokens"]
    other["meta"].setdefault("models", {})["target_smoothing"] = "smoothquant alpha 0.5"
    (tmp_path / "run2" / "results.json").write_text(json.dumps(other))
    assert rerender([str(out), str(tmp_path / "run2"), "--out", str(tmp_path / "smoothed")]) == 2
    assert not any((tmp_path / d).exists() for d in ("twice", "mixed", "smoothed"))
    assert rerender([str(out), str(tmp_path / "run2")]) == 2


def test_bound_is_the_median_of_the_profiles_measured_beside_the_run(tmp_path, qwen_tokenizer):
    """With gamma auto the harness re-measures the profile beside the run (``bound_checks``) and judges
    CSD against the median bound; the policy keeps the profile it started with."""
    from conftest import tiny_model
    from csd.bench.harness import BenchConfig, run_bench
    from csd.costs import CostModel
    from test_engine_tiny import make_pair, perturbed

    target = tiny_model(2, vocab=1200)     # the profile times passes on token ids 100-1099
    pair = make_pair(qwen_tokenizer, target, perturbed(target, 0.05), eos=(7,))
    pair.encode_prompt = lambda prompt, chat=True: [ord(c) % 32 for c in prompt] or [1]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": "4"}) for i in range(2)))
    # a deliberately odd starting profile: a draft that costs nothing gives a bound far above any re-measurement
    given = CostModel({1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0}, 0.0)
    res = run_bench(pair, BenchConfig(str(prompts), None, "ar,csd", 8, tmp_path / "a", gamma="auto", bound_checks=2,
                                      show_bar=False), costs=given)
    checks = res["meta"]["profile_checks"]
    assert len(checks) == 2 and all(c["measured_at"] and c["draft_ms"] > 0 for c in checks)
    found = [given.best_bound()[1]] + [c["best_bound"]["speedup"] for c in checks]
    share = res["targets"]["csd_share_of_bound"]
    assert share["bound"] == pytest.approx(statistics.median(found)) and share["bound"] < found[0]
    assert share["value"] == pytest.approx(res["summary"]["p"]["csd"]["speedup_over_ar"] / share["bound"])
    md = (tmp_path / "a" / "results.md").read_text()
    assert md.count("re-measured beside the run") == 2 and "the median of 3 profiles" in md

    res0 = run_bench(pair, BenchConfig(str(prompts), None, "ar,csd", 8, tmp_path / "b", gamma="auto", bound_checks=0,
                                       show_bar=False), costs=given)
    assert "profile_checks" not in res0["meta"]
    assert res0["targets"]["csd_share_of_bound"]["bound"] == pytest.approx(found[0])


def test_cli_parser():
    from csd.cli.bench import add_parser, cmd_bench

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(["bench", "--dataset", "gsm8k,prose", "--limit", "3", "--methods", "ar,csd",
                           "--max-new-tokens", "32", "--out", "x", "--dtype", "float32", "--seed", "7"])
    assert (a.dataset, a.limit, a.methods, a.max_new_tokens, a.out, a.dtype, a.seed) == \
        ("gsm8k,prose", 3, "ar,csd", 32, "x", "float32", 7)
    assert a.func is cmd_bench


def test_cli_builds_the_bench_config():
    """``csd bench``'s flags become one BenchConfig: every setting the harness reads, with its default."""
    from csd.bench.harness import BenchConfig
    from csd.cli.bench import add_parser, bench_config

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(["bench", "--dataset", "gsm8k:3,prose", "--limit", "0", "--methods", "ar,csd", "--out", "x",
                           "--gamma", "4", "--lam", "3", "--tau", "0.1", "--sweep", "lam=2,tau=0.5",
                           "--memory-mode", "fresh", "--no-warmup", "--lookup", "0", "--bound-checks", "1"])
    a.command_line = "python -m csd bench ..."
    assert bench_config(a, ["ar", "csd"]) == BenchConfig(
        "gsm8k:3,prose", None, ("ar", "csd"), 128, "x", 0, gamma=4, lam=3.0, tau=0.1, sweep="lam=2,tau=0.5",
        memory_mode="fresh", warmup=False, command="python -m csd bench ...", gamma_max=16, lookup=0, bound_checks=1)
    with pytest.raises(ValueError, match="memory_mode"):
        BenchConfig("gsm8k", 1, memory_mode="sometimes").columns()


# -- the whole harness on the real embedded pair (float32, shared with the engine tests) ------------
def test_bench_smoke_real_pair(real_pair, tmp_path):
    from csd.bench.harness import BenchConfig, run_bench
    from csd.db.store import Store

    # One column per code path: the engine's AR (the reference), SD, CSD (with its memory) and
    # transformers' assisted generation (hf-assisted, at its defaults, takes the same path as -fixed but
    # for the schedule). One item per dataset, two in all: enough for the method order to rotate; seed 0
    # draws short prompts (93 and 122 tokens with the chat template: every column prefills them in
    # float32). No warm-up: it is untimed (nothing below reads it), it cost 110 of this test's 390 s in
    # float32, and test_harness_on_a_tiny_pair runs the harness with it
    methods = ["ar", "sd", "csd", "hf-assisted-fixed"]
    per_dataset, n_items, max_new = 1, 2, 8
    with Store.open("sqlite://") as store:
        res = run_bench(real_pair, BenchConfig("gsm8k,humaneval", per_dataset, ",".join(methods), max_new, tmp_path,
                                               seed=0, show_bar=False, warmup=False), store=store)
        from sqlalchemy import func, select

        from csd.db.models import RunRow
        with store.session() as s:
            runs = s.scalar(select(func.count()).select_from(RunRow).where(RunRow.kind == "bench"))
        assert runs == n_items * len(methods)

    for name in ("results.json", "results.md", "speedup.html", "divergences.html", "frontier.html",
                 "memory_csd.json.gz"):
        assert (tmp_path / name).is_file(), name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["status"] == res["status"] == "finished"
    assert on_disk["meta"]["dtype"] == "float32" and on_disk["meta"]["config"]["max_new_tokens"] == max_new
    items = on_disk["items"]
    assert len(items) == n_items * len(methods)
    assert Counter(it["dataset"] for it in items) == {"gsm8k": per_dataset * len(methods),
                                                      "humaneval": per_dataset * len(methods)}
    # the method order rotates from item to item
    orders = {}
    for it in items:
        orders.setdefault((it["dataset"], it["item_id"]), {})[it["method"]] = it["order"]
    assert len({tuple(o[m] for m in methods) for o in orders.values()}) > 1
    for it in items:
        assert it["wall_s"] > 0 and 1 <= it["new_tokens"] <= max_new
        assert it["prompt_tokens"] in (93, 122)                    # the prompt's length, for llama.cpp's -pg
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
    for ds in summary:        # the contract scripts read: summary[dataset][method]["tokens_per_s"]
        assert set(summary[ds]) == set(methods) and all(summary[ds][m]["tokens_per_s"] > 0 for m in methods)
    allm = summary["all"]
    assert allm["ar"]["speedup_over_ar"] == pytest.approx(1.0)
    assert allm["ar"]["target_passes"] == allm["ar"]["new_tokens"] == sum(
        it["new_tokens"] for it in items if it["method"] == "ar")
    for m in ("sd", "csd"):   # whether speculation saves passes is measured, not asserted (it depends on the CPU)
        assert allm[m]["target_passes"] <= allm[m]["new_tokens"]
        assert allm[m]["mean_accepted_length"] == pytest.approx(allm[m]["new_tokens"] / allm[m]["target_passes"])
        assert allm[m]["speedup_over_ar"] == pytest.approx(allm[m]["tokens_per_s"] / allm["ar"]["tokens_per_s"])
    md = (tmp_path / "results.md").read_text()
    for m in methods:
        assert f"| all | {m} | {n_items} |" in md
    html = (tmp_path / "speedup.html").read_text()
    # the pages share one plotly.js beside them (offline, no CDN), instead of 4.8 MB inline in each
    assert re.search(r'<script[^>]*\bsrc="plotly\.min\.js"', html) and len(html) < 200_000
    assert re.search(r"plotly\.js v\d", (tmp_path / "plotly.min.js").read_text(encoding="utf-8")[:500])


def test_bench_interrupt_keeps_finished_items(real_pair, tmp_path):
    from csd.bench.harness import BenchConfig, run_bench

    def progress(msg, frac):
        if msg.startswith("gsm8k") and frac >= 2 / 6 - 1e-9:
            raise KeyboardInterrupt      # as if Ctrl-C hit as the second item starts

    with pytest.raises(KeyboardInterrupt):
        run_bench(real_pair, BenchConfig("gsm8k", 3, "ar,sd", 4, tmp_path, seed=0, warmup=False, show_bar=False),
                  progress=progress)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "interrupted"
    assert [it["method"] for it in res["items"]] == ["ar", "sd"]        # the first item, complete
    assert res["summary"]["gsm8k"]["ar"]["n"] == 1
    assert "interrupted" in (tmp_path / "results.md").read_text()


def test_per_dataset_item_counts():
    from csd.evaluation.datasets import item_range, validate_datasets

    assert item_range("gsm8k:40", 5) == ("gsm8k", 0, 40) and item_range("prose", 5) == ("prose", 0, 5)
    assert validate_datasets("gsm8k:40,humaneval:2") == ["gsm8k:40", "humaneval:2"]
    with pytest.raises(ValueError, match="unknown dataset"):
        validate_datasets("nope:3")
    with pytest.raises(ValueError, match="at least 1"):
        validate_datasets("gsm8k:0")


def test_an_item_range_draws_the_items_a_shorter_run_left_out():
    from csd.evaluation.datasets import item_range, load_dataset, validate_datasets

    assert item_range("gsm8k:16-40") == ("gsm8k", 15, 40) and item_range("gsm8k:40") == ("gsm8k", 0, 40)
    assert item_range("prose", 5) == ("prose", 0, 5)
    assert validate_datasets("gsm8k:16-40") == ["gsm8k:16-40"]
    whole = [it.item_id for it in load_dataset("gsm8k", 40)]
    first = [it.item_id for it in load_dataset("gsm8k", 15)]
    name, skip, stop = item_range("gsm8k:16-40")
    rest = [it.item_id for it in load_dataset(name, stop)[skip:]]
    assert first + rest == whole and len(rest) == 25
    with pytest.raises(ValueError, match="comes after"):
        item_range("gsm8k:40-16")
    with pytest.raises(ValueError, match="at least 1"):
        item_range("gsm8k:0-3")
