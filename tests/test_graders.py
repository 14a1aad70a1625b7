"""The graders: final numbers (GSM8K, user files), CHAMP, extracting code, and ``python -m csd grade``
end to end. The HumanEval sandbox has its own file (test_sandbox.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from csd.evaluation.datasets import DatasetError, get_item, load_champ, load_gsm8k, load_humaneval
from csd.evaluation.graders import (
    champ_checkable,
    extract_code,
    extract_final_number,
    grade,
    grade_champ,
    gsm8k_reference,
    numbers_equal,
)

ROOT = Path(__file__).resolve().parents[1]


# -- GSM8K: the final stated number ----------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("3 + 4 = 7 apples. The answer is 7.", "7"),
    ("She pays $1,250 in total.\nThe answer is $1,250.", "1250"),
    ("The answer is: **18**", "18"),
    ("Step 1: 5 * 3 = 15\nStep 2: 15 - 2 = 13\nSo the total is 13", "13"),
    ("The final result is \\boxed{42}.", "42"),
    ("The answer is -3.50 degrees", "-3.50"),
    ("The answer is 12. Check: 12 / 4 = 3", "12"),
    ("no number here", None),
])
def test_gsm8k_final_number(text, expected):
    assert extract_final_number(text) == expected


QWEN_JANET = r"""To determine how much Janet makes every day at the farmers' market, we need to follow these steps:

1. **Calculate the total number of eggs laid per day:**
   Janet's ducks lay 16 eggs per day.

2. **Subtract the eggs Janet eats for breakfast and uses for muffins:**
   \[
   16 - 3 - 4 = 9
   \]

3. **Calculate the revenue from selling the remaining eggs:**
   \[
   9 \times 2 = 18
   \]

Therefore, Janet makes \(\boxed{18}\) dollars every day at the farmers' market."""

QWEN_STEPS = """Let's break this down step by step.

**Step 1:** The robe needs 2 bolts of blue fiber.
**Step 2:** It needs half that much white fiber: 2 / 2 = 1 bolt.
**Step 3:** In total: 2 + 1 = 3 bolts.

**Answer:** 3"""

QWEN_DISPLAY = r"""First, the cost of the house after repairs:
\[
80{,}000 + 50{,}000 = 130{,}000
\]
The value increased by 150%, so the new value is \( 80{,}000 \times 2.5 = 200{,}000 \).

Profit: \( 200{,}000 - 130{,}000 = 70{,}000 \)

**Final Answer**
\[
\boxed{70{,}000}
\]"""


@pytest.mark.parametrize("text, expected", [
    ("The answer is 9 * 2 = 18 dollars.", "18"),                      # an expression's result
    ("Janet sells 9 eggs at $2 each.\n#### 18", "18"),
    ("She pays $18.00 in total.", "18"),
    ("So the answer is \\boxed{18}", "18"),
    ("Janet has 18 eggs", "18"),
    ("The answer is: **18**", "18"),
    ("**Answer:** 18", "18"),
    ("Final answer: 1,250", "1250"),
    ("Total cost: $500 + $750 = $1,250.", "1250"),
    ("The answer is 18.", "18"),
    ("She sells 9 eggs for $2 each, so she makes $18 every day.", "18"),      # the last number
    ("The temperature drops by 7 degrees, to \u22127 degrees.\nThe answer is -7.", "-7"),
    ("Each slice costs $0.75.", "0.75"),
    ("It takes 2.5 hours. The answer is 2.5", "2.5"),
    ("The answer is 3/4 of the pizza.", "0.75"),
    ("She ate \\(\\frac{3}{4}\\) of the pizza.", "3/4"),
    ("The answer is \\(18\\)", "18"),
    ("\\boxed{\\$18}", "18"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("The answer is 18 (eighteen).", "18"),
    ("The discount is 25%.", "25"),
    ("The discount is 25\\%.", "25"),
    ("Therefore, the total cost is $6 + $12 = $18.", "18"),
    ("The answer is 12. Check: 12 / 4 = 3", "12"),                    # a verification after the answer
    ("The answer is 18 eggs, which is 2 more than 16.", "18"),         # an explanation after the answer
    ("The answer is 9 \\times 2 = 18", "18"),
    ("The answer is 9 * 2.", "18"),                                   # an expression left unworked
    ("The final answer is $\\boxed{1{,}250}$.", "1250"),
    ("The answer is: $ 1,250.50", "1250.5"),
    ("The answer is that Janet makes $18 a day.", "18"),
    ("I will end with 'The answer is N'.\nShe makes 9 x 2 = 18 dollars.", "18"),   # N is no number
    ("The answer is:\n\n\\[\n\\boxed{18}\n\\]", "18"),
    (QWEN_JANET, "18"),
    (QWEN_STEPS, "3"),
    (QWEN_DISPLAY, "70000"),
    ("I cannot determine this from the information given.", None),
    ("", None),
], ids=lambda v: repr(v)[:40])
def test_final_number_realistic_answers(text, expected):
    got = extract_final_number(text)
    if expected is None:
        assert got is None
    else:
        assert numbers_equal(got, expected), (got, expected)


def test_final_number_stays_fast_on_hostile_text():
    """Scans stay linear: long runs of spaces, parentheses, markers or braces cost milliseconds."""
    t0 = time.monotonic()
    for text in ("1" + " " * 20_000 + "x", "(  " * 5_000, "answer is x " * 3_000, "\\boxed{" * 3_000,
                 "1 +" * 5_000 + " a", "\\frac{" * 3_000):
        extract_final_number(text)
    assert time.monotonic() - t0 < 2


def test_numbers_compare_exactly():
    for a, b in (("1250", "1,250"), ("1250", "1250.00"), ("$1,250", "1250"), ("0.75", "3/4"), ("25%", "25"),
                 ("-3.5", "-3.50"), ("1000", "1,000"), ("1234.50", "1234.5")):
        assert numbers_equal(a, b), (a, b)
    for a, b in (("18", "19"), ("0.3333", "1/3"), (None, "18"), ("18", None), ("x", "x")):
        assert not numbers_equal(a, b), (a, b)


def test_gsm8k_reference_and_comparison():
    assert gsm8k_reference("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert gsm8k_reference("...\n#### 1,000") == "1000"
    assert gsm8k_reference("4") == "4"                      # a user file's answer
    assert numbers_equal("1000", "1,000")
    assert numbers_equal("1234.50", "1234.5")
    assert not numbers_equal("18", "19")
    assert not numbers_equal(None, "18")
    item = load_gsm8k()[0]
    assert item.grader == "number" and item.reference == gsm8k_reference("#### " + item.reference)
    assert grade(item, f"Some work.\nThe answer is {item.reference}.").correct is True
    assert grade(item, "The answer is 123456789.").correct is False


# -- CHAMP -------------------------------------------------------------------------------------
def test_champ_grading():
    assert grade_champ("Thus ... The final answer is: 239.", "239").correct is True
    assert grade_champ("The final answer is: 240", "239").correct is False
    assert grade_champ("The final answer is: \\frac{1}{18}", "1/18").correct is True
    assert grade_champ("The final answer is: No, such a sequence cannot exist.", "No").correct is True
    assert grade_champ("The final answer is: Yes", "No").correct is False
    assert grade_champ("I could not finish", "239").correct is False
    assert grade_champ("The final answer is: x^3-1", "x^3-1").correct is None           # not checkable
    items = load_champ()
    kinds = Counter(champ_checkable(it.reference) for it in items)
    assert kinds["number"] >= 70 and kinds["yesno"] >= 10 and kinds[None] > 0


# -- items by id -------------------------------------------------------------------------------
def test_get_item():
    assert get_item("gsm8k", "gsm8k/0").reference == "18"
    assert get_item("humaneval", "HumanEval/0").extra["entry_point"] == "has_close_elements"
    assert get_item("humaneval", "humaneval/0").item_id == "HumanEval/0"             # letter case aside
    assert get_item("champ", "P_Combinatorics_1").grader == "champ"
    with pytest.raises(DatasetError, match="look like gsm8k/0, gsm8k/1"):
        get_item("gsm8k", "17")
    with pytest.raises(DatasetError, match="unknown dataset"):
        get_item("mmlu", "1")


# -- HumanEval: the program ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def humaneval():
    return {it.item_id: it for it in load_humaneval()}


def test_extract_code():
    text = "Sure.\n```python\nimport math\n```\nand\n```python\ndef g(x):\n    return x\n```\nDone"
    assert extract_code(text).startswith("def g(x)")
    assert extract_code("```\ndef h():\n    pass\n") == "def h():\n    pass\n"     # unterminated block
    two = "```python\ndef f(x):\n    return 1\n```\n```python\ndef test_f():\n    assert f(0)\n```"
    assert extract_code(two, "f").startswith("def f(x)") and extract_code(two).startswith("def test_f")
    assert extract_code("    return 1\n") == "    return 1\n"                        # no fence: raw text


# -- python -m csd grade, end to end -------------------------------------------------------------------
def _grade_cli(*runs: tuple[list[str], str | None]) -> list[tuple[int, str, str]]:
    """``python -m csd grade ARGS`` for each (ARGS, stdin), run side by side (each start imports torch)."""
    procs = []
    for args, stdin in runs:
        p = subprocess.Popen([sys.executable, "-m", "csd", "grade", *args], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((p, stdin))
    return [_finish(p, stdin) for p, stdin in procs]


def _finish(p: subprocess.Popen, stdin: str | None) -> tuple[int, str, str]:
    out, err = p.communicate(stdin or "", timeout=180)
    return p.returncode, out, err


def test_grade_cli_gsm8k(tmp_path):
    right = tmp_path / "right.txt"
    right.write_text("Janet has 16 - 3 - 4 = 9 eggs left.\nShe makes 9 * $2 = $18.\nThe answer is 18.")
    item = ["--dataset", "gsm8k", "--item", "gsm8k/0"]
    (rc1, out1, err1), (rc2, out2, err2) = _grade_cli((item + ["--answer-file", str(right)], None),
                                                      (item + ["--answer-file", "-"], "The answer is 17."))
    assert rc1 == 0, err1
    out = json.loads(out1)
    assert out["correct"] is True and out["predicted"] == "18" and out["item_id"] == "gsm8k/0"
    assert set(out) >= {"correct", "predicted", "detail"}
    assert rc2 == 0, err2
    assert json.loads(out2)["correct"] is False and json.loads(out2)["predicted"] == "17"


def test_grade_cli_humaneval(tmp_path, humaneval):
    x = humaneval["HumanEval/0"].extra
    good, cheat = tmp_path / "good.md", tmp_path / "cheat.md"
    good.write_text(f"```python\n{x['prompt']}{x['canonical_solution']}```\n")
    cheat.write_text(f"```python\nimport sys\n\n{x['prompt']}    return True\n\nsys.exit(0)\n```\n")
    item = ["--dataset", "humaneval", "--item", "HumanEval/0"]
    results = _grade_cli((item + ["--answer-file", str(good)], None), (item + ["--answer-file", str(cheat)], None))
    for (rc, out, err), expected in zip(results, (True, False)):
        assert rc == 0, err
        assert json.loads(out)["correct"] is expected, out


def test_grade_cli_errors(tmp_path):
    answer = tmp_path / "a.txt"
    answer.write_text("The answer is 18.")
    runs = [["--dataset", "gsm8k", "--item", "gsm8k/99999", "--answer-file", str(answer)],
            ["--dataset", "mmlu", "--item", "1", "--answer-file", str(answer)],
            ["--dataset", "gsm8k", "--item", "gsm8k/0", "--answer-file", str(tmp_path / "missing.txt")]]
    for args, (rc, out, err) in zip(runs, _grade_cli(*((args, None) for args in runs))):
        assert rc == 2 and out == "", (args, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
