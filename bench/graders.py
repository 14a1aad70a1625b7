"""Graders of the benchmark, shared by ``bench.harness`` and ``python -m csd grade``.

- Numbers (GSM8K, user files): the model's FINAL STATED number (``extract_final_number``). The
  last answer marker wins ("the answer is", "final answer:", "Answer:", "####", ``\\boxed{}``);
  after a marker the answer is the expression that follows it, worked out to its result
  ("9 * 2 = 18 dollars" -> 18), so a verification line after the answer ("Check: 12 / 4 = 3")
  and an explanation after it ("18 eggs, which is 2 more than 16") do not replace it. Without a
  marker, the last number (or expression result) of the text. Markdown, LaTeX (``\\( \\)``,
  ``\\[ \\]``, ``\\frac``, ``\\text{}``, ``\\$``), currency, thousands separators and percent signs
  are read through. Numbers compare exactly as fractions: 1250 == 1,250 == 1250.00, 3/4 == 0.75.
- CHAMP: the text after the last "final answer", compared as a number or as yes/no; other
  references are not checkable (``None``).
- HumanEval pass@1: the program is assembled here (``humaneval_program``) and run by
  ``bench.sandbox``, which passes it only when its tests ran to their end.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from .sandbox import run_humaneval


# -- dispatch ------------------------------------------------------------------------------------
class Gradable(Protocol):
    """What grading reads of an item (``bench.datasets.Item`` is one)."""
    grader: str | None       # "number", "humaneval", "champ" or None (not graded)
    reference: str | None    # the reference final answer
    extra: dict              # the grader's inputs (HumanEval prompt, test, entry point)


@dataclass
class Grade:
    correct: bool | None     # None: not checkable
    predicted: str | None    # the extracted answer (or the test outcome for HumanEval)
    detail: str = ""


def grade(item: Gradable, text: str) -> Grade:
    """Grade one answer to one item (the benchmark and ``python -m csd grade`` both call this)."""
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


# -- numbers -------------------------------------------------------------------------------------
# A number as written: thousands separators only in groups of three, an optional decimal part.
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# One term of an expression: optional parentheses and sign, an optional percent sign. The
# repetitions are bounded so that a scan stays linear in the text (no quadratic backtracking).
_SP = r"[ \t]{0,4}"
_TERM = r"(?:\(" + _SP + r"){0,4}-?" + _SP + _NUM + r"(?:" + _SP + r"%)?(?:" + _SP + r"\)){0,4}"
_OP = _SP + r"[-+*/=≈]" + _SP
# An expression as models write them in an answer: "18", "9 * 2 = 18", "6 + 12 = 18", "3/4".
_EXPR = re.compile(r"(?<![\w.])" + _TERM + r"(?:" + _OP + _TERM + r")*")
_SINGLE = re.compile(r"\(?(-?" + _NUM + r"(?:/" + _NUM + r")?)%?\)?")

_MARKER = re.compile(
    r"\banswer\s*(?:(?:is|was|would\s+be|will\s+be|should\s+be|equals)\b\s*:?|[:=])"
    r"|####|\\boxed\s*\{", flags=re.IGNORECASE)
# What may stand between a marker and its number: punctuation, markdown, an opening brace.
_LEAD = re.compile(r"(?:[\s:=*_~>`{]|\\boxed\s*\{"
                   r"|(?:therefore|thus|then|so|simply|just|exactly|approximately|about|roughly|now)\b[\s,:]*)*",
                   flags=re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)|\n")
_ANSWER_SPAN = 300     # how far after a marker its answer may be (characters): keeps the scan linear


def _clean(text: str) -> str:
    """The text with markdown and LaTeX read through, so that numbers and operators stand plain."""
    t = text.replace("\u2212", "-").replace("\u2013", "-").replace("\u00a0", " ")
    for _ in range(3):      # nested \frac{\frac{..}{..}}{..}: innermost first
        t = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", t)
    t = re.sub(r"\\[dt]?frac\s*(\d)\s*(\d)", r"(\1)/(\2)", t)                # \frac12
    t = re.sub(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}", r" \1 ", t)
    t = t.replace("{,}", ",")
    t = re.sub(r"(?<=\d)\\[,!;: ](?=\d{3}\b)", "", t)                          # 1\,250
    t = re.sub(r"\\(?:times|cdot|ast)(?![A-Za-z])", "*", t)
    t = re.sub(r"\\div(?![A-Za-z])", "/", t)
    t = re.sub(r"\\approx(?![A-Za-z])", "≈", t)
    t = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", t)
    t = t.translate({ord("×"): "*", ord("·"): "*", ord("⋅"): "*", ord("÷"): "/"})
    t = t.replace("\\%", "%").replace("\\$", "$")
    t = re.sub(r"\\[()\[\]]", " ", t)                                          # \( \) \[ \]
    t = re.sub(r"(?<=\d)[ \t]*[xX][ \t]*(?=[(\d])", " * ", t)                  # 9 x 2
    return re.sub(r"[$`]|\*\*|__", "", t)


def _expression_value(expr: str) -> str | None:
    """The result of an expression: the part after its last '=' (or '≈'), as written when it is
    a single number or fraction, else worked out exactly; the last number if it cannot be."""
    last = re.split(r"[=≈]", expr)[-1].strip()
    if not last:
        return None
    single = _SINGLE.fullmatch(last.replace(" ", "").replace("\t", ""))
    if single:
        return _normalise_number(single.group(1))
    value = _evaluate(last)
    if value is not None:
        return _format_fraction(value)
    numbers = re.findall(_NUM, last)
    return _normalise_number(numbers[-1]) if numbers else None


def _value_at(text: str, pos: int) -> str | None:
    """The answer stated right after a marker ending at ``pos``: the expression that follows
    (after markdown and filler words), else the first one in the rest of that sentence."""
    pos = _LEAD.match(text, pos).end()
    m = _EXPR.match(text, pos)
    if m is None:
        limit = min(len(text), pos + _ANSWER_SPAN)
        end = _SENTENCE_END.search(text, pos, limit)
        m = _EXPR.search(text, pos, end.start() if end else limit)
    return _expression_value(m.group(0)) if m else None


def _brace_ends(text: str) -> dict[int, int]:
    """For every '{' of the text, the index of its matching '}' (the text's end when unmatched);
    one pass, so that many ``\\boxed{`` markers cost no more than one."""
    ends, stack = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            ends[stack.pop()] = i
    ends.update((i, len(text)) for i in stack)
    return ends


def _last_value(text: str) -> str | None:
    found = list(_EXPR.finditer(text))
    return _expression_value(found[-1].group(0)) if found else None


def extract_final_number(text: str) -> str | None:
    """The final stated number of an answer (see the module docstring), normalised: no thousands
    separators, currency or percent sign ("1250", "-3.50", "3/4"); ``None`` if there is none."""
    t = _clean(text)
    braces = None
    for m in reversed(list(_MARKER.finditer(t))):           # the last marker that holds a number
        if m.group(0).startswith("\\"):                     # \boxed{...}
            braces = braces if braces is not None else _brace_ends(t)
            value = _last_value(t[m.end():min(braces[m.end() - 1], m.end() + _ANSWER_SPAN)])
        else:
            value = _value_at(t, m.end())
        if value is not None:
            return value
    return _last_value(t)


def gsm8k_reference(answer: str) -> str | None:
    """The number after '####' (GSM8K), else the final number of the text (a user file's answer)."""
    if "####" in answer:
        return _value_at(_clean(answer.split("####")[-1]), 0) or _normalise_number(answer.split("####")[-1])
    return extract_final_number(answer)


def _normalise_number(s: str) -> str | None:
    s = s.strip().replace("\u2212", "-").replace("$", "").replace(",", "").replace("%", "").replace(" ", "")
    m = re.search(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?", s.rstrip("."))
    return m.group(0).lstrip("+") if m else None


def _format_fraction(f: Fraction) -> str:
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


def _to_fraction(s: str | None) -> Fraction | None:
    if s is None:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(pred: str | None, ref: str | None) -> bool:
    """Exact comparison as fractions, after normalising both (1,250 == 1250.00; 3/4 == 0.75)."""
    a = _to_fraction(_normalise_number(pred) if pred else None)
    b = _to_fraction(_normalise_number(ref) if ref else None)
    return a is not None and b is not None and a == b


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/()]))")


def _evaluate(expr: str) -> Fraction | None:
    """Exact value of an arithmetic expression (+ - * / and parentheses over decimal numbers),
    or ``None`` when it is not one. A small recursive-descent parser: nothing is ``eval``-ed."""
    s = expr.replace(",", "").replace("%", "").strip()
    tokens, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None:
            return None
        tokens.append(Fraction(m.group(1)) if m.group(1) else m.group(2))
        pos = m.end()
    if not tokens or len(tokens) > 200:
        return None
    i = 0

    def peek():
        return tokens[i] if i < len(tokens) else None

    def take():
        nonlocal i
        i += 1
        return tokens[i - 1]

    def factor() -> Fraction:
        t = take() if peek() is not None else None
        if t == "-":
            return -factor()
        if t == "+":
            return factor()
        if t == "(":
            v = expression()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return v
        if isinstance(t, Fraction):
            return t
        raise ValueError(f"unexpected {t!r}")

    def term() -> Fraction:
        v = factor()
        while peek() in ("*", "/"):
            v = v * factor() if take() == "*" else v / factor()
        return v

    def expression() -> Fraction:
        v = term()
        while peek() in ("+", "-"):
            v = v + term() if take() == "+" else v - term()
        return v

    try:
        v = expression()
    except (ValueError, ZeroDivisionError, IndexError):
        return None
    return v if i == len(tokens) else None


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
    """The rest of the line after the last "final answer (is):", else the last \\boxed{} content."""
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
    pred = extract_final_number(final)         # reads \\frac{a}{b} as a/b
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
