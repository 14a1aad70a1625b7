"""The final stated number (issue 25, item 7): the last number of the answer line, an expression's
result, never a number the line negates or one that only explains the answer already stated, so
that a wrong answer cannot talk its way past the grader and a right one is not failed for its words."""
from __future__ import annotations

import json
import re

import pytest

from csd.evaluation.datasets import data_file, get_item
from csd.evaluation.graders import extract_final_number, grade, gsm8k_reference, numbers_equal

# GSM8K's first item: Janet's ducks, reference 18.
THREE = ["1/2 of 36 = 18", "9 eggs at 2 dollars each, so 18", "not 16; it is 18"]


@pytest.mark.parametrize("prefix", ["The answer is ", ""], ids=["marker", "no-marker"])
@pytest.mark.parametrize("sentence", THREE)
def test_the_final_stated_value_is_graded(prefix, sentence):
    item = get_item("gsm8k", "gsm8k/0")
    assert item.reference == "18"
    text = prefix + sentence
    assert extract_final_number(text) == "18", text
    g = grade(item, text)
    assert g.correct is True and g.predicted == "18", (text, g)


@pytest.mark.parametrize("text, expected", [
    ("The answer is 18, not 16.", "18"),                              # a negated number does not count
    ("She makes $18, not $16.", "18"),
    ("The answer is 18 rather than 16", "18"),
    ("The answer is half of 36, which is 18", "18"),                  # a clause that restates replaces
    ("The answer is 16 - 3 - 4 = 9 eggs, 9 * $2 = $18", "18"),
    ("The answer is 18 because 9 eggs, at 2 each, make 18 dollars", "18"),
    ("The answer is 18 because she sells 9 eggs at $2", "18"),         # a reason explains, keeps 18
    ("Answer: 18 if she sells all 9 eggs at $2", "18"),               # so does a condition
    ("The answer is 12 (check: 12 / 4 = 3)", "12"),                   # so does a worded parenthesis
    ("The answer is 18 (9 eggs * $2)", "18"),
    ("The answer is 18 \u2014 2 more than 16", "18"),                 # a comparison explains
    ("The answer is (16 - 3 - 4) * 2.", "18"),                        # bare parentheses: an expression
    ("1 \\text{ (Monday)} + 3 \\text{ (Tuesday)} + 2 \\text{ (Friday)} = 6", "6"),   # labels, not clauses
    ("She makes 9 * 2 = 18 dollars. Check: 18 / 2 = 9", "18"),         # a check after it, no marker
    ("Check: 18 / 2 = 9", "9"),                                       # ... counts when it is all there is
    ("It is not 16.", None),
])
def test_answer_line_readings(text, expected):
    assert extract_final_number(text) == expected, text


@pytest.mark.parametrize("text", [
    "The answer is 16, not 18.",
    "The answer is 18; no, it is 16",
    "The answer is 16, which is 2 less than 18",
    "The answer is 16 (the reference says 18)",
    "The answer is 16 because 9 * 2 = 18 minus the 2 she eats",
    "It is 18 if you count the broken ones, but the answer is 16",
])
def test_a_wrong_answer_that_mentions_the_right_number_fails(text):
    g = grade(get_item("gsm8k", "gsm8k/0"), text)
    assert g.correct is False and g.predicted == "16", (text, g)


def test_worked_text_without_a_marker_reads_as_before():
    """GSM8K's own 1319 worked solutions, their '####' line and calculator notes removed: the last
    number of the text matches the reference in 1282 (measured before this reading and after it:
    the answer-line rules change nothing in text without a marker)."""
    rows = [json.loads(line) for line in data_file("gsm8k").read_text(encoding="utf-8").splitlines() if line.strip()]
    hits = 0
    for row in rows:
        body = re.sub(r"<<[^>]*>>", "", row["answer"].split("####")[0]).strip()
        hits += numbers_equal(extract_final_number(body), gsm8k_reference(row["answer"]))
    assert len(rows) == 1319 and hits >= 1282, hits
