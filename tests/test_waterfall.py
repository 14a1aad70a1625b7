"""The like-for-like rival (transformers' own generate, ``hf-ar``) and the speed waterfall of a run:
transformers' generate -> our AR -> SD -> SD + copies -> CSD + copies, each step a ratio of tok/s."""
from __future__ import annotations

import json

import pytest

from conftest import tiny_bench_pair
from csd.bench.waterfall import columns, waterfall, waterfall_lines


def _results(settings: dict, rows: dict) -> dict:
    """rows: {column: [(tokens, wall), ...]} per item, in item order."""
    items = [{"dataset": "d", "item_id": str(i), "method": m, "new_tokens": t, "wall_s": w}
             for m, per in rows.items() for i, (t, w) in enumerate(per)]
    return {"meta": {"config": {"settings": settings}}, "items": items}


SETTINGS = {"hf-ar": {"method": "ar", "hf": "generate"}, "ar": {"method": "ar", "hf": None, "lookup": 0},
            "sd": {"method": "sd", "hf": None, "lookup": 0}, "csd": {"method": "csd", "hf": None, "lookup": 0},
            "sd[lookup=16]": {"method": "sd", "hf": None, "lookup": 16},
            "csd[lookup=16]": {"method": "csd", "hf": None, "lookup": 16},
            "csd[lam=3]": {"method": "csd", "hf": None, "lookup": 16}}


def test_each_step_is_its_tok_s_over_the_step_above():
    res = _results(SETTINGS, {"hf-ar": [(10, 2.0), (10, 2.0)], "ar": [(10, 1.6), (10, 1.6)],
                              "sd": [(10, 1.0), (10, 1.0)], "sd[lookup=16]": [(10, 0.8), (10, 0.8)],
                              "csd[lookup=16]": [(12, 0.8), (8, 0.8)], "csd": [(1, 9.0), (1, 9.0)],
                              "csd[lam=3]": [(1, 9.0), (1, 9.0)]})
    assert [c for _, c in columns(res)] == ["hf-ar", "ar", "sd", "sd[lookup=16]", "csd[lookup=16]"]
    steps = waterfall(res)
    assert steps[0]["factor"] is None and steps[0]["tokens_per_s"] == pytest.approx(5.0)
    assert [s["factor"] for s in steps[1:]] == pytest.approx([1.25, 1.6, 1.25, 1.0])
    assert [s["over"] for s in steps[1:]] == ["hf-ar", "ar", "sd", "sd[lookup=16]"]
    md = "\n".join(waterfall_lines(res))
    assert "| the rule (CSD + copies) | `csd[lookup=16]` | 12.50 | 1.00x (" in md


def test_a_missing_step_is_skipped_and_one_step_is_no_waterfall():
    res = _results({k: SETTINGS[k] for k in ("ar", "sd[lookup=16]")},
                   {"ar": [(10, 2.0)], "sd[lookup=16]": [(10, 1.0)]})
    steps = waterfall(res)
    assert [s["column"] for s in steps] == ["ar", "sd[lookup=16]"] and steps[1]["factor"] == pytest.approx(2.0)
    assert waterfall_lines(_results({"ar": SETTINGS["ar"]}, {"ar": [(10, 2.0)]})) == []


def test_hf_ar_is_transformers_generate_on_the_target_alone(tmp_path, qwen_tokenizer, one_thread):
    """On a tiny float32 pair: hf-ar runs without the draft, writes AR's tokens (greedy, same model), and
    the report's waterfall starts from it and names it as transformers' row."""
    from csd.bench.harness import BenchConfig, run_bench

    pair = tiny_bench_pair(qwen_tokenizer)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": "4"}) for i in range(3)))
    res = run_bench(pair, BenchConfig(str(prompts), None, "hf-ar,ar,sd", 12, tmp_path / "out",
                                      sweep="method=sd,lookup=4", lookup=0, show_bar=False))
    hf = [it for it in res["items"] if it["method"] == "hf-ar"]
    assert len(hf) == 3 and all(it["identical_to_ar"] for it in hf)
    assert all(it["draft_passes"] == 0 and it["target_passes"] >= 1 for it in hf)
    s = res["summary"]["p"]
    assert s["ar"]["speedup_over_hf_ar"] == pytest.approx(s["ar"]["tokens_per_s"] / s["hf-ar"]["tokens_per_s"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Rows on transformers' generate, on the same pair, representation and prompts: hf-ar;" in md
    assert "| transformers' generate (AR) | `hf-ar` |" in md and "| our engine (AR) | `ar` |" in md
    assert "over `hf-ar`" in md and "| copies from the context (SD + copies) | `sd[lookup=4]` |" in md
