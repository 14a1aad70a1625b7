"""bench.fidelity on the real pair: float32 is the reference, and within float32 SD is AR."""
import pytest

pytestmark = pytest.mark.slow


def test_fidelity_compares_representations_with_float32(real_pair):
    from bench.fidelity import run

    target_before = real_pair.target
    res = run(["float32", "int8"], ["prose", "gsm8k"], limit=1, max_new_tokens=12, pair=real_pair)
    s = res["summary"]
    assert s["float32"]["items"] == 2 and s["float32"]["sd_equals_ar"] == 2     # greedy SD is exact in float32
    assert "ar_identical_to_float32" not in s["float32"]                        # the reference
    i8 = s["int8"]
    assert 0 <= i8["ar_identical_to_float32"] <= 2 and 0 <= i8["sd_equals_ar"] <= 2
    assert 0 <= i8["mean_common_prefix"] <= i8["mean_answer_tokens"] <= 12
    f32, q = res["answers"]["float32"], res["answers"]["int8"]
    assert set(f32) == set(q) and len(f32) == 2
    for k in f32:
        assert 0 < len(f32[k]["ar"]) <= 12 and 0 < len(q[k]["ar"]) <= 12
        assert f32[k]["sd"] == f32[k]["ar"]
    assert i8["ar_identical_to_float32"] == sum(f32[k]["ar"] == q[k]["ar"] for k in f32)
    assert real_pair.target is target_before and real_pair.target_repr == "float32"     # the shared pair is untouched
    with pytest.raises(ValueError, match="reference is the float32 target"):
        from dataclasses import replace
        run(["float32"], ["prose"], 1, 4, pair=replace(real_pair, target_repr="int8"))
