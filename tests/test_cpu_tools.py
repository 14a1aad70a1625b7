"""The CPU engine's measuring tools (issue 52): ``bench.cpu_profile`` sorts a real pass's ops by kind and counts
them per layer; ``bench.llama_side`` refuses a missing llama-bench before running anything and reports its
ratios against llama.cpp's plain decoding. Tiny in-process models; nothing here times anything."""
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
                                "csd": {"tokens_per_s": 15.0}}}}
    md = table(res)
    assert "| this project, CSD | 15.00 | 0.75x | 66.7 |" in md
    assert "CSD over AR: 1.50x; SD over AR: 1.60x; CSD over SD: 0.94x" in md
    assert "(its defaults: target int8, activations per token, draft ort4)" in md      # what ran, from its record
