"""The CPU engine's measuring tools (issue 52): ``bench.cpu_profile`` sorts a real pass's ops by kind and counts
them per layer; ``bench.llama_side`` and ``cli.app_runs`` refuse bad input before running anything; the side by
side reports its ratios against llama.cpp's plain decoding; the app's runs load the real pair as the app does.
Nothing here compares speeds."""
from __future__ import annotations

import pytest

from conftest import tiny_model


def test_a_pass_profile_sorts_the_ops_and_counts_them_per_layer(one_thread):
    from csd.bench.cpu_profile import kind_of, profile_call
    from csd.runtime.lm import LeanLM
    lm = LeanLM(tiny_model(2, layers=3), int8=True)
    out = profile_call(lm, 1, reps=2)
    assert kind_of("quantized::linear_dynamic") == "matmul" and kind_of("aten::_fused_rms_norm") == "norm"
    assert out["ms_by_kind"]["matmul"] > 0 and 0 < out["share_outside_matmul"] < 1
    assert out["ops_per_call"] == pytest.approx(3 * out["ops_per_layer"], abs=1.0)
    six = profile_call(lm, 6, reps=2)
    assert six["ops_per_call"] >= out["ops_per_call"]       # a causal mask for a pass of several tokens


def test_the_side_by_side_refuses_a_missing_llama_bench(tmp_path, capsys):
    from csd.bench.llama_side import main
    with pytest.raises(SystemExit) as e:
        main(["--llama-bench", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "no such file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_side_by_side_table_is_relative_to_llama_cpps_plain_decoding():
    from csd.bench.llama_side import table
    res = {"machine": "m", "date": "d", "command": "c",
           "llama.cpp": {"target": {"tokens_per_s": 20.0, "stddev": 0.5, "command": "x", "build": "b"},
                         "draft": {"tokens_per_s": 40.0, "ms_per_token": 25.0}},
           "ours": {"command": "y",
                    "meta": {"representation": {"target": "int8", "draft": "ort4", "activations": "row"}},
                    "summary": {"ar": {"tokens_per_s": 10.0}, "sd": {"tokens_per_s": 16.0},
                                "csd": {"tokens_per_s": 15.0}},
                    "after_prompt": {"ar": 12.0, "sd": None, "csd": 18.0}}}
    md = table(res)
    assert "tok/s and x llama.cpp: AR 12.00 (0.60x); CSD 18.00 (0.90x)." in md
    assert "| this project, CSD | 15.00 | 0.75x | 66.7 |" in md
    assert "CSD over AR: 1.50x; SD over AR: 1.60x; CSD over SD: 0.94x" in md
    assert "(its defaults: target int8, activations per token, draft ort4)" in md      # what ran, from its record


def test_the_apps_runs_refuse_bad_input_before_loading_anything(tmp_path, capsys):
    from csd.cli.app_runs import main
    for argv, why in ((["--users", "1"], "--users at least 2"), (["--rounds", "0"], "at least 1"),
                      (["--llama-bench", str(tmp_path / "nope")], "no such file")):
        with pytest.raises(SystemExit) as e:
            main(["--out", str(tmp_path / "o"), *argv])
        assert e.value.code == 2 and why in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_apps_runs_load_what_the_app_loads_and_time_each_way(tmp_path):
    """The real pair, as ``python app.py`` loads it: a run alone on prepare's draft, runs at once on the app's
    batched draft; every run decodes its tokens. Speeds are only checked to be there, never compared."""
    import json
    import subprocess
    import sys

    from csd.runtime.profile import chosen_draft_weights
    out = tmp_path / "app"
    subprocess.run([sys.executable, "-m", "csd.cli.app_runs", "--out", str(out), "--prompts", "1", "--rounds", "1",
                    "--users", "2", "--tokens", "6"], check=True, timeout=900)
    res = json.loads((out / "app_runs.json").read_text())
    chosen = chosen_draft_weights()
    assert res["draft alone"] == chosen                         # the timed choice drafts a run alone
    assert res["representation"]["draft"] == "int8"             # runs at once draft in int8 on the CPU
    assert [len(res["summary"][k]["all"]) for k in ("alone", "at once")] == [1, 1]
    assert all(v["median"] > 0 for v in res["summary"].values())
    md = (out / "app_runs.md").read_text()
    assert "| a run alone (median of 1) |" in md and "| 2 runs at once, in all (median of 1) |" in md
def test_the_tokens_after_the_prompt_leave_out_its_reading():
    from csd.bench.llama_side import after_prompt
    items = [{"method": "ar", "new_tokens": 10, "wall_s": 2.0, "prefill_s": 1.0},
             {"method": "ar", "new_tokens": 30, "wall_s": 4.0, "prefill_s": 1.0},
             {"method": "sd", "new_tokens": 30, "wall_s": 4.0, "prefill_s": None}]
    assert after_prompt(items, "ar") == 40 / 4.0
    assert after_prompt(items, "sd") is None and after_prompt(items, "csd") is None      # not recorded, not run


def test_llama_cpps_prompt_and_generation_row_counts_only_the_new_tokens():
    """llama-bench's ``-pg 150,128`` counts the prompt's tokens and the new ones in its tok/s (this row is one it
    printed on 2026-12-07); the yardstick keeps the new ones, with the prompt's reading inside the time."""
    from csd.bench.llama_side import bench_row
    rows = [{"n_prompt": 0, "n_gen": 128, "avg_ts": 27.97, "stddev_ts": 1.67},
            {"n_prompt": 150, "n_gen": 128, "avg_ts": 38.592915, "stddev_ts": 1.82296, "avg_ns": 7211439793}]
    pg = bench_row(rows, 128, prompt=150)
    assert pg["tokens_per_s"] == pytest.approx(128 / 7.211439793, rel=0.01)
    assert pg["stddev"] == pytest.approx(1.82296 * 128 / 278) and pg["prompt"] == 150
    assert bench_row(rows, 128)["tokens_per_s"] == 27.97                      # tg alone: as llama-bench says
    with pytest.raises(RuntimeError, match="no pg row for 64 tokens"):
        bench_row(rows, 64, prompt=150)


def test_the_side_by_side_reads_a_run_of_one_dataset_as_of_several():
    """``--dataset chat.txt`` alone: results.json's summary holds that dataset's row and no "all" row (the side by
    side raised KeyError: 'all' there); several datasets: the "all" row."""
    from csd.bench.llama_side import our_figures
    items = [{"dataset": "chat", "item_id": "1", "method": m, "new_tokens": 8, "wall_s": 2.0, "prefill_s": 1.0,
              "prompt_tokens": 50} for m in ("ar", "sd", "csd")]
    one = our_figures({"summary": {"chat": {"csd": {"tokens_per_s": 4.0}}}, "meta": {}, "items": items})
    assert one["summary"]["csd"]["tokens_per_s"] == 4.0
    assert one["after_prompt"]["csd"] == 8.0 and one["prompt_tokens"] == 50
    several = our_figures({"summary": {"h": {"csd": {"tokens_per_s": 1.0}}, "all": {"csd": {"tokens_per_s": 3.0}}},
                           "meta": {}, "items": items})
    assert several["summary"]["csd"]["tokens_per_s"] == 3.0


def test_the_items_prompt_length_is_their_mean_each_item_once():
    from csd.bench.llama_side import prompt_length
    items = [{"dataset": "h", "item_id": "1", "method": m, "prompt_tokens": 100} for m in ("ar", "sd", "csd")]
    items.append({"dataset": "g", "item_id": "1", "method": "ar", "prompt_tokens": 151})
    assert prompt_length(items) == 126                      # (100 + 151) / 2, not weighted by methods
    assert prompt_length([{"dataset": "h", "item_id": "1", "prompt_tokens": None}]) is None      # an older record
    assert prompt_length([]) is None


def test_the_side_by_side_compares_whole_runs_with_llama_cpp_reading_the_prompt_too():
    from csd.bench.llama_side import table
    res = {"machine": "m", "date": "d", "command": "c", "tokens": 128,
           "llama.cpp": {"target": {"tokens_per_s": 20.0, "stddev": 0.5, "command": "x", "build": "b"},
                         "draft": {"tokens_per_s": 40.0, "ms_per_token": 25.0},
                         "target with prompt": {"tokens_per_s": 16.0, "stddev": 1.0, "prompt": 150, "command": "z"}},
           "ours": {"command": "y", "meta": {"representation": {"target": "gguf", "draft": "q4_0"}},
                    "summary": {"ar": {"tokens_per_s": 16.0}, "sd": {"tokens_per_s": 24.0},
                                "csd": {"tokens_per_s": 28.0}}}}
    md = table(res)
    assert "llama.cpp reading a 150-token prompt (the items' mean) and then generating 128 tokens (`z`) made " \
           "16.00 ± 1.00 new tokens a second; this project's runs, x that: AR 1.00x; SD 1.50x; CSD 1.75x." in md
    del res["llama.cpp"]["target with prompt"]
    assert "reading a" not in table(res)                    # an older run's record: no such line


def test_the_apps_runs_compare_with_llama_cpp_reading_the_chats_prompts_too():
    from csd.cli.app_runs import table
    res = {"machine": "m", "date": "d", "command": "c", "tokens": 128, "users": 8, "prompts": 6, "lookup": 16,
           "representation": {"target": "gguf", "draft": "int8"}, "draft alone": "q4_0",
           "summary": {"alone": {"median": 24.0, "all": [24.0]}, "at once": {"median": 30.0, "all": [30.0]}},
           "llama.cpp": {"tokens_per_s": 25.0, "stddev": 1.0},
           "llama.cpp with prompt": {"tokens_per_s": 20.0, "stddev": 0.5, "prompt": 140, "command": "pg"}}
    md = table(res)
    assert "| a run alone (median of 1) | 24.00 | 1.00x | 0.96x |" in md          # against tg128, no prompt
    assert "reading a 140-token prompt (the chats' mean) and then generating 128 tokens (`pg`) made 20.00 ± 0.50 " \
           "new tokens a second; a run alone 1.20x that, 8 runs at once in all 1.50x." in md
    del res["llama.cpp with prompt"]
    assert "reading a" not in table(res)
