"""csd.bench.rivals: the rivals' frontier from benchmark runs on the same items. Items made by hand, so
that every figure is known by construction: speeds as tokens/wall, grades, prose token ids."""
from __future__ import annotations

import pytest

from csd.bench.results import ResultsError
from csd.bench.rivals import PAPER, figure, frontier, markdown

AR_PROSE = [[1, 2, 3, 4], [5, 6, 7, 8]]


def item(ds, i, method, wall, correct=None, ids=None, tokens=10):
    return {"dataset": ds, "item_id": str(i), "method": method, "new_tokens": tokens, "wall_s": wall,
            "correct": correct, "token_ids": ids if ids is not None else list(range(tokens))}


def run(items, path, methods, settings=None):
    return {"_path": path, "items": items, "status": "finished",
            "meta": {"command": f"bench --methods {methods}", "machine": {"cpu": "test CPU"}, "dtype": "int8",
                     "config": {"settings": settings or {}}}}


def part1():
    items = []
    for i in range(2):
        items += [item("gsm8k", i, "ar", 2.0, True), item("gsm8k", i, "sd", 1.0, True),
                  item("gsm8k", i, "lossy", 0.5, i == 0)]                 # lossy loses item 1
        items += [item("prose", i, "ar", 2.0, ids=AR_PROSE[i], tokens=4),
                  item("prose", i, "sd", 1.0, ids=AR_PROSE[i], tokens=4),
                  item("prose", i, "lossy", 0.5, ids=AR_PROSE[i][:2] + [9, 9, 9, 9], tokens=6) if i == 0 else
                  item("prose", i, "lossy", 0.5, ids=AR_PROSE[i], tokens=4)]
    return run(items, "run1", "ar,sd,lossy", {
        "ar": {"method": "ar", "gamma": "auto", "lam": 6, "tau": 0.01, "lookup": 0},
        "lossy": {"method": "lossy", "gamma": "auto", "lam": 6, "tau": 0.01, "lookup": 16, "tau_lossy": 0.6}})


def part2(keys=2):
    items = []
    for i in range(keys):
        items += [item("gsm8k", i, "sd", 1.0, True), item("gsm8k", i, "topk", 0.8, True),
                  item("prose", i, "sd", 1.0, ids=AR_PROSE[i % 2], tokens=4),
                  item("prose", i, "topk", 0.8, ids=[0], tokens=4)]
    return run(items, "run2", "sd,topk")


def test_speed_quality_and_prose_agreement_per_rule():
    data = frontier([part1(), part2()])
    p = {x["method"]: x for x in data["points"]}
    assert list(p) == ["ar", "sd", "lossy", "topk"]                      # SD once, from the first run
    assert p["sd"]["speedup_over_ar"] == pytest.approx(2.0) and p["sd"]["speed_from"] == "same run"
    # lossy: (10+10+6+4 tokens) / 2 s against AR's 28 tokens / 8 s
    assert p["lossy"]["speedup_over_ar"] == pytest.approx((30 / 2.0) / (28 / 8.0))
    assert p["topk"]["speedup_over_ar"] == pytest.approx(1.25 * 2.0) and "times SD's x AR" in p["topk"]["speed_from"]
    assert p["lossy"]["accuracy"] == 0.5 and p["lossy"]["vs_ar"]["lost"] == 1 and p["sd"]["accuracy"] == 1.0
    assert p["lossy"]["per_dataset"]["gsm8k"] == {"n": 2, "correct": 1}
    assert p["sd"]["prose"] == {"n": 2, "identical": 2, "prefix_share": 1.0, "length_ratio": 1.0}
    assert p["lossy"]["prose"]["identical"] == 1 and p["lossy"]["prose"]["prefix_share"] == pytest.approx(0.75)
    assert p["lossy"]["prose"]["length_ratio"] == pytest.approx(10 / 8)
    assert p["topk"]["prose"]["identical"] == 0 and p["topk"]["prose"]["prefix_share"] == 0.0
    md = markdown(data)
    assert p["lossy"]["setting"] == "γ auto, copies 16, tau_lossy 0.6" and p["ar"]["setting"] == "no draft"
    assert p["topk"]["setting"] == ""                                    # not recorded by its run
    assert "| topk | – | 2.50x" in md and "†" in md.split("| topk |")[1].split("\n")[0]
    assert "The paper's figures, not ours" in md and all(f"| {x['method']} |" in md for x in PAPER)
    fig = figure(data)
    assert {t.name for t in fig.data} >= {"sd", "lossy", "topk", "paper: CSD"}


def test_runs_must_share_items_and_one_must_have_ar():
    with pytest.raises(ResultsError, match="not the same items"):
        frontier([part1(), part2(keys=1)])
    with pytest.raises(ResultsError, match="no run has an AR column"):
        frontier([part2()])


def test_the_app_shows_the_frontier_escaped_and_says_when_there_is_none(tmp_path):
    import json

    from csd.ui import figures
    assert figures.rivals_table(None) == ""
    assert "frontier yet" in figures.make_rivals_figure(None).layout.annotations[0].text
    data = frontier([part1(), part2()])
    data["points"][2]["method"] = "<img src=x onerror=alert(1)>"
    (tmp_path / "rivals.json").write_text(json.dumps(data))
    loaded = figures.load_frontier(str(tmp_path / "rivals.json"))
    table = figures.rivals_table(loaded)
    assert "&lt;img src=x onerror=alert(1)&gt;" in table and "<img" not in table
    assert len(figures.make_rivals_figure(loaded).data) >= 4


def test_a_column_setting_names_what_its_rule_reads():
    from csd.bench.rivals import setting
    base = {"gamma": "auto", "lam": 6, "tau": 0.01, "lookup": 16, "tau_lossy": 0.6, "topk": 15, "delta": 0.5,
            "win_len": 6, "entropy_thre": 0.3}
    assert setting({**base, "method": "csd"}) == "γ auto, copies 16, λ 6, τ 0.01"
    assert setting({**base, "method": "csd", "gamma": 6, "lookup": 0}) == "γ 6, copies off, λ 6, τ 0.01"
    assert setting({**base, "method": "topk"}) == "γ auto, copies 16, topk 15, delta 0.5"
    assert setting({**base, "method": "fly", "gamma": 15}) == "γ 15, copies 16, win_len 6, entropy_thre 0.3"
    assert setting({**base, "method": "sd"}) == "γ auto, copies 16" and setting(None) == ""


def test_the_app_reads_the_committed_frontiers_shipped_with_the_package():
    """csd.bench.frontier: the Analyse tab's two frontiers are package data (an installed wheel has no
    docs/), the same data as the runs committed under docs/bench."""
    import json
    from pathlib import Path

    from csd.bench import frontier as shipped
    from csd.ui import figures
    from csd.ui.state import Settings
    root = Path(__file__).resolve().parents[1]
    for file, path, committed in ((shipped.FRONTIER_FILE, Settings.frontier_file, "docs/bench/frontier/frontier.json"),
                                  (shipped.RIVALS_FILE, Settings.rivals_file, "docs/bench/rivals/rivals.json")):
        data = shipped.load(file)
        assert data == figures.load_frontier(path) == json.loads((root / committed).read_text()) and data["points"]
    merged = shipped.load(shipped.FRONTIER_FILE)          # two runs joined: speed relative to SD in its own run
    table = figures.frontier_table(merged)
    assert "csd" in table and "× SD, same run" in table and "Merged from 2 runs" in table
    assert "| sd | 11.52 | 1.00x (run 1) |" in table
    assert "relative to SD" in figures.make_frontier_figure(merged).layout.xaxis.title.text
    assert len(figures.make_rivals_figure(shipped.load(shipped.RIVALS_FILE)).data) >= 4
