"""tools.fidelity on the real pair: float32 is the reference, and within float32 SD is AR; and
the pairing of two benchmark runs item by item (``--compare``)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT


def item(ds, iid, correct, ids, method="sd"):
    return {"dataset": ds, "item_id": iid, "method": method, "correct": correct, "token_ids": ids,
            "new_tokens": len(ids)}


def test_common_prefix_is_where_two_answers_first_differ():
    from csd.events import common_prefix
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([5], [6, 5]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0
    assert common_prefix([7, 8], [7, 8]) == 2


def test_compare_pairs_two_runs_item_by_item(tmp_path):
    from tools.fidelity import compare_runs
    a = {"meta": {"dtype": "float32"}, "frontier": [], "items": [
        item("gsm8k", "1", True, [1, 2, 3]), item("gsm8k", "2", True, [4, 5]), item("gsm8k", "3", False, [6]),
        item("prose", "p", None, [7, 8]), item("gsm8k", "9", True, [1], method="csd")]}
    b = {"meta": {"dtype": "int8"}, "frontier": [], "items": [
        item("gsm8k", "2", False, [4, 9, 9]), item("gsm8k", "1", True, [1, 2, 3]), item("gsm8k", "3", True, [5]),
        item("prose", "p", None, [7, 8]), item("gsm8k", "4", True, [1]), item("gsm8k", "9", False, [1], method="csd")]}
    s = compare_runs(a, b, "sd", ("float32", "int8"))["summary"]
    assert s["gsm8k"]["items"] == 3 and s["all"]["items"] == 4 and s["all"]["graded"] == 3   # item 4: b only
    assert (s["all"]["correct_float32"], s["all"]["correct_int8"]) == (2, 2)
    assert (s["all"]["only_float32"], s["all"]["only_int8"]) == (1, 1) and s["all"]["mcnemar_p"] == 1.0
    assert s["all"]["identical"] == 2 and s["all"]["mean_common_prefix"] == (3 + 1 + 0 + 2) / 4
    assert s["gsm8k"]["mean_tokens_int8"] == (3 + 3 + 1) / 3
    with pytest.raises(ValueError, match="no item in common"):
        compare_runs(a, b, "ar")
    # the command line: a directory or a file, and a clear error for a missing run
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "cmp.json"
    r = subprocess.run([sys.executable, "-m", "tools.fidelity", "--compare", str(tmp_path / "a"), str(tmp_path / "b.json"),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| all | 4 | 2/3 | 2/3 | 1 / 1 (p = 1.00) | 2 | 2 |" in r.stdout
    assert json.loads(out.read_text())["names"] == ["float32", "int8"]
    r = subprocess.run([sys.executable, "-m", "tools.fidelity", "--compare", str(tmp_path / "nope"), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no benchmark results at" in r.stderr
    # one side pooled from two runs of the same representation (a run extended by an item range)
    a1 = {**a, "items": a["items"][:2]}
    a2 = {**a, "items": a["items"][1:]}          # item 2 in both: taken once
    (tmp_path / "a1.json").write_text(json.dumps(a1))
    (tmp_path / "a2.json").write_text(json.dumps(a2))
    r = subprocess.run([sys.executable, "-m", "tools.fidelity", "--compare",
                        f"{tmp_path / 'a1.json'},{tmp_path / 'a2.json'}", str(tmp_path / "b.json"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| all | 4 | 2/3 | 2/3 | 1 / 1 (p = 1.00) | 2 | 2 |" in r.stdout
    (tmp_path / "b8.json").write_text(json.dumps({**b, "items": b["items"][:1]}))
    r = subprocess.run([sys.executable, "-m", "tools.fidelity", "--compare",
                        f"{tmp_path / 'a1.json'},{tmp_path / 'b8.json'}", str(tmp_path / "b.json"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must share a target representation" in r.stderr


@pytest.mark.slow
def test_fidelity_compares_representations_with_float32(real_pair):
    from tools.fidelity import run

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


@pytest.mark.slow
def test_teacher_forced_agreement_with_float32_answers(real_pair):
    """Fed float32's own greedy answers, float32 agrees with nearly every token (only near-ties between
    transformers' and the lean path's float order can flip): a misaligned feed would agree with few."""
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from tools.fidelity import agreement

    items = []
    for ds, iid in (("gsm8k", "gsm8k/1143"), ("humaneval", "HumanEval/98")):
        from csd.evaluation.datasets import get_item
        run = Decoder(real_pair).run(real_pair.encode_prompt(get_item(ds, iid).prompt),
                                     CSDConfig(method="ar", max_new_tokens=24))
        list(run)
        items.append({"dataset": ds, "item_id": iid, "method": "sd", "token_ids": run.token_ids})
    res = agreement({"meta": {"dtype": "float32"}, "items": items}, ["float32", "int8"], pair=real_pair)
    f32, i8 = res["summary"]["float32"], res["summary"]["int8"]
    assert f32["all"]["tokens"] == i8["all"]["tokens"] == 48 and f32["gsm8k"]["tokens"] == 24
    assert f32["all"]["share"] >= 0.95
    assert 0.5 <= i8["all"]["share"] <= 1.0
    with pytest.raises(ValueError, match="float32 run"):
        agreement({"meta": {"dtype": "int8"}, "items": items}, ["int8"], pair=real_pair)
