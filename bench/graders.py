"""Graders of the benchmark: the final number of a math answer (GSM8K, user files), CHAMP's
final answer, and HumanEval pass@1 (the program is assembled here and run by ``bench.sandbox``).
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from .sandbox import run_humaneval

if TYPE_CHECKING:
    from .datasets import Item


# -- dispatch ------------------------------------------------------------------------------------
@dataclass
class Grade:
    correct: bool | None     # None: not checkable
    predicted: str | None    # the extracted answer (or the test outcome for HumanEval)
    detail: str = ""


def grade(item: Item, text: str) -> Grade:
    if item.grader == "number":
        pred = extract_final_number(text)
        return Grade(None if item.reference is None else numbers_equal(pred, item.reference), pred)
    if item.grader == "humaneval":
        program = humaneval_program(item.extra["prompt"], text, item.extra["entry_point"])
        ok, detail = run_humaneval(program, item.extra["test"], item.extra["entry_point"])
        return Grade(ok, "passed" if ok else "failed", detail)
    if item.grader == "champ":
        return grade_champ(text, item.reference)
    return Grade(None, None)


_NUM = r"[-+−]?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s?/\s?\d+)?"


def gsm8k_reference(answer: str) -> str | None:
    """The number after '####' (GSM8K), else the last number in the text."""
    if "####" in answer:
        return _normalise_number(answer.split("####")[-1])
    return extract_final_number(answer)


def extract_final_number(text: str) -> str | None:
    """The model's final number: after the last 'answer is', else in the last \\boxed{}, else the last number."""
    text = text.replace("−", "-")
    for pattern in (r"answer\s*(?:is|:)\s*:?\s*\**\s*\$?\\?\(?\s*(" + _NUM + ")",
                    r"\\boxed\{\s*(" + _NUM + r")\s*\}"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            return _normalise_number(found[-1])
    found = re.findall(_NUM, text)
    return _normalise_number(found[-1]) if found else None


def _normalise_number(s: str) -> str | None:
    s = s.strip().replace("−", "-").replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    m = re.search(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?", s)
    return m.group(0).lstrip("+") if m else None


def _to_fraction(s: str | None) -> Fraction | None:
    if s is None:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(pred: str | None, ref: str | None) -> bool:
    a, b = _to_fraction(pred), _to_fraction(_normalise_number(ref) if ref else None)
    return a is not None and b is not None and a == b


# -- CHAMP -------------------------------------------------------------------------------------
def champ_checkable(reference: str | None) -> str | None:
    """'number' when the reference is a plain number (or fraction), 'yesno' for Yes/No, else None."""
    if reference is None:
        return None
    r = reference.strip()
    if re.fullmatch(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?", r):
        return "number"
    if r.lower() in ("yes", "no"):
        return "yesno"
    return None


def champ_final_answer(text: str) -> str | None:
    m = list(re.finditer(r"final answer\s*(?:is)?\s*:?\s*(.+)", text, flags=re.IGNORECASE))
    if m:
        return m[-1].group(1).strip()
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return boxed[-1].strip() if boxed else None


def grade_champ(text: str, reference: str | None) -> Grade:
    kind = champ_checkable(reference)
    final = champ_final_answer(text)
    if kind is None:
        return Grade(None, final, "reference is not a number or yes/no")
    if final is None:
        return Grade(False, None, "no final answer")
    if kind == "yesno":
        word = re.match(r"[\W_]*(\w+)", final)
        return Grade(bool(word) and word.group(1).lower() == reference.strip().lower(), final)
    pred = extract_final_number(final.replace("\\frac{", "").replace("}{", "/").replace("}", ""))
    return Grade(numbers_equal(pred, reference), pred)


# -- HumanEval ---------------------------------------------------------------------------------
def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of an answer: among its ```python (or ```) blocks, the last one that defines
    ``entry_point``, else the last that defines any function, else the last block; an
    unterminated block runs to the end of the text; the raw text when there is no fence."""
    blocks = re.findall(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", text, flags=re.DOTALL)
    blocks = [b for b in blocks if b.strip()]
    if not blocks:
        return text
    defines = [b for b in blocks if re.search(r"^\s*def\s", b, flags=re.MULTILINE)]
    if entry_point:
        defines = [b for b in defines if _defines(b, entry_point)] or defines
    return (defines or blocks)[-1]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, flags=re.MULTILINE) is not None


def humaneval_program(prompt: str, answer: str, entry_point: str) -> str:
    """The program to test: the problem's prompt (imports, helpers, stub), then either the
    model's full function (which redefines the stub) or, for a bare body, prompt + body."""
    code = extract_code(answer, entry_point)
    if _defines(code, entry_point):
        return prompt + "\n    pass\n\n" + textwrap.dedent(code)
    return prompt + code


# Runs first in the child: limits, then the candidate as __main__. Setting the limits in the child
