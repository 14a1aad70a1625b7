"""The benchmark report's quality alarms: length against AR, answers that end vs answers cut by the
cap, and every item graded differently from AR, listed with both texts."""
from __future__ import annotations

import pytest

from csd.bench.alarms import alarm_lines, alarms, flips
from csd.bench.results import ItemResult, overall, summarize


def _item(item, method, tokens, stopped, correct, text):
    return ItemResult("gsm8k", item, method, 0, 1.0, tokens, tokens, None, stopped_by=stopped, correct=correct,
                      predicted="18" if correct else "16", text=text)


def _run():
    recs = [
        _item("1", "ar", 100, "eos", True, "AR says 18"), _item("1", "csd", 60, "eos", False, "CSD says 16"),
        _item("2", "ar", 100, "eos", False, "AR says 16"), _item("2", "csd", 60, "max_new_tokens", True, "CSD: 18"),
        _item("3", "ar", 100, "eos", True, "AR 18 again"), _item("3", "csd", 60, "max_new_tokens", False, "CSD\n16"),
        _item("4", "ar", 100, "eos", None, "ungraded"), _item("4", "csd", 60, "eos", None, "ungraded too"),
    ]
    summary = summarize(recs, ["ar", "csd"])
    return {"items": [r.to_dict() for r in recs], "summary": summary}, overall(summary)


def test_length_and_endings_are_measured_against_ar():
    _, stats = _run()
    assert stats["csd"]["length_vs_ar"] == pytest.approx(0.6) and stats["ar"]["length_vs_ar"] == pytest.approx(1.0)
    assert stats["csd"]["eos_share"] == 0.5 and stats["csd"]["cap_share"] == 0.5 and stats["ar"]["cap_share"] == 0


def test_each_band_raises_its_alarm_and_a_quiet_column_raises_none():
    _, stats = _run()
    found = alarms(stats["csd"], stats["ar"])
    assert any("0.60x AR's length" in a for a in found)
    assert any("50% ended by EOS against AR's 100%" in a for a in found)
    assert any("lost 2 graded items to AR, gained 1" in a for a in found)
    assert alarms(stats["ar"], stats["ar"]) == []


def test_every_item_graded_unlike_ar_is_listed_with_both_texts():
    results, stats = _run()
    f = flips(results, "csd")
    assert [x["item_id"] for x in f] == ["1", "2", "3"]               # item 4 is not graded: not a flip
    assert f[0]["text"] == "CSD says 16" and f[0]["ar_text"] == "AR says 18" and f[1]["correct"] is True
    md = "\n".join(alarm_lines(results, stats))
    assert "| csd | 0.60x | 50% | 50% | 1 / 2 |" in md
    assert "**csd, gsm8k 1: wrong where AR was right**" in md and "**csd, gsm8k 2: right where AR was wrong**" in md
    assert "    CSD says 16" in md and "    AR says 18" in md and "    CSD\n    16" in md
    assert alarm_lines(results, {"csd": stats["csd"]}) == []           # no AR column: nothing to compare with
