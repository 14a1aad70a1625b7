"""tools.exactness, the tool behind docs/exactness.md, on a tiny int8 model with the tokenizer's whole
vocabulary: per token, SD writes AR's tokens; the pass timings come back for both modes."""
from __future__ import annotations

import pytest

from conftest import tiny_model
from csd.models import load_pair
from tools.exactness import agree, main, nudge, passes


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory, qwen_tokenizer):
    d = tmp_path_factory.mktemp("wide")
    tiny_model(4, vocab=len(qwen_tokenizer)).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    return lambda dtype="int8": load_pair(str(d), str(d), dtype=dtype, target_impl="lean", int8_smoothing=False,
                                          int8_activations="pass")


def test_agree_counts_items_where_sd_writes_ar_per_mode(wide_pair, one_thread):
    out = agree(wide_pair(), per_dataset=1, max_new_tokens=6)
    assert set(out) == {"pass", "row"} and all(out[m]["items"] == 3 for m in out)
    assert out["row"]["same"] == 3                     # per token: exact, whatever the draft proposed
    assert all(r["first_difference"] is None for r in out["row"]["per_item"])


def test_passes_times_both_modes_interleaved(wide_pair, one_thread):
    out = passes(wide_pair(), rounds=1)
    assert {k for k in out if not k.startswith("row_over")} == {"pass_1", "pass_7", "row_1", "row_7"}
    assert all(v["n"] == 3 and 0 < v["min_ms"] <= v["median_ms"] <= v["max_ms"] for k, v in out.items()
               if isinstance(v, dict))
    assert out["row_over_pass_7"] > 0


def test_nudge_measures_each_representation_and_the_static_engine(wide_pair, one_thread):
    """float32 moves a little under the nudge and its static engine stays with the eager one; every
    representation is measured on the same 30 rows (3 prompts, passes of 2 and 8); the pair is left
    per pass, as loaded."""
    pair = wide_pair()
    out = nudge(pair, wide_pair("float32").target_lm)["per_representation"]
    assert set(out) == {"int8 per pass", "int8 per token", "float32"}
    assert all(r["nudge_top1_flips"].endswith("of 30") and r["static_vs_eager_top1_flips"].endswith("of 30")
               for r in out.values())
    f = out["float32"]
    assert 0 < f["nudge_max_logit_change"] < 1e-2 and f["static_vs_eager_max_logit_diff"] < 1e-3
    assert pair.int8_activations == "pass" and not pair.target_lm.per_row


def test_bad_input_is_refused_before_any_model(capsys):
    with pytest.raises(SystemExit):
        main(["agree", "--per-dataset", "0"])
    assert "must be >= 1" in capsys.readouterr().err
