"""Graders of the benchmark, shared by ``csd.bench.harness`` and ``python -m csd grade``: the final stated
number (GSM8K, user files), CHAMP's final answer, HumanEval pass@1 in ``csd.evaluation.sandbox``. What each
reads, with examples: ``docs/grading.md``; the cases: ``tests/test_final_number.py``.
"""
from __future__ import annotations

import ast
import operator
import re
import textwrap
from dataclasses import dataclass, field
from fractions import Fraction

from .sandbox import run_humaneval


@dataclass
class Item:
    """One benchmark item (``csd.evaluation.datasets`` loads them; defined here, where it is graded)."""
    dataset: str                 # dataset name (a file's stem for a user file)
    item_id: str                 # stable id within the dataset (GSM8K line number, HumanEval task id, ...)
    prompt: str                  # the user message; the bench wraps it in the chat template
    reference: str | None = None  # the reference final answer (None: not graded)
    grader: str | None = None    # "number", "humaneval", "champ" or None (speed only)
    extra: dict = field(default_factory=dict)  # grader inputs (HumanEval prompt, test, entry point)
    content: str = ""            # the item's own text (question, stub, passage), without the instruction


@dataclass
class Grade:
    correct: bool | None     # None: not checkable
    predicted: str | None    # the extracted answer (or the test outcome for HumanEval)
    detail: str = ""


def grade(item: Item, text: str) -> Grade:
    """Grade one answer to one item (the benchmark and ``python -m csd grade`` both call this)."""
    if item.grader == "number":
        pred = extract_final_number(text)
        return Grade(None if item.reference is None else numbers_equal(pred, item.reference), pred)
    if item.grader == "humaneval":
        program = humaneval_program(item.extra["prompt"], text, item.extra["entry_point"])
        ok, detail = run_humaneval(program, item.extra["test"], item.extra["entry_point"],
                                   context=item.extra["prompt"])
        return Grade(ok, "passed" if ok else "failed", detail)
    if item.grader == "champ":
        return grade_champ(text, item.reference)
    return Grade(None, None)


# -- numbers -------------------------------------------------------------------------------------
# A number as written: thousands separators only in groups of three, an optional decimal part.
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# One term of an expression: optional parentheses, sign and percent sign; bounded repetitions keep a scan linear.
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
# The end of the answer's sentence (not ';': "not 16; it is 18" stays one answer line).
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
# Where an answer line divides into clauses: ", ", "; ", a dash, and before the words that open a clause.
# A parenthesis holding words: a clause at the end of a clause, else a label read as a space.
_OPENERS = (r"so|thus|therefore|hence|but|which|because|since|as|where|whereas|while|when|if|given"
            r"|assuming|compared|giving|making|i\.e\.|e\.g\.")
_CLAUSE_SPLIT = re.compile(r"[,;][ \t]{1,8}|[ \t]{0,8}(?:--|\u2014)[ \t]{0,8}|[ \t]{1,8}(?=(?:" + _OPENERS + r")\b)",
                           flags=re.IGNORECASE)
_PARENS = re.compile(r"\(([^()\n]{0,400})\)(?=([ \t]{0,8}(?:[,;]|$))?)")
# On a marker's answer line, a clause that compares or explains does not replace the answer; one that restates does.
_COMPARISON = re.compile(r"\bthan\b", flags=re.IGNORECASE)
_RESTATES = re.compile(r"=|(?:so|thus|therefore|hence|then|giving|making|it\s+is|it's|that\s+is|that's|i\.e\.)\b",
                       flags=re.IGNORECASE)
_EXPLAINS = re.compile(r"(?:because|since|as|where|whereas|while|when|if|given|assuming|compared|versus|vs"
                       r"|e\.g\.|for\s+example|based\s+on|check|verif\w*|double[- ]check)\b", flags=re.IGNORECASE)
# A number that the line says the answer is not ("not 16", "18 rather than 16").
_NEGATED = re.compile(r"\b(?:not|isn't|aren't|wasn't|never|rather\s+than|instead\s+of|other\s+than)"
                      r"[ \t]{1,4}(?:(?:equal[ \t]{1,4}to|exactly|quite|just|even)[ \t]{1,4})?\(?$",
                      flags=re.IGNORECASE)
# A sentence that checks an answer already given ("Check: 12 / 4 = 3").
_CHECK_LINE = re.compile(r"[\s*_>#-]{0,8}(?:let's[ \t]{1,4}|to[ \t]{1,4})?"
                         r"(?:check|verify|verification|double[- ]check|sanity[ \t]check)[ \t]{0,4}[:,]",
                         flags=re.IGNORECASE)
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
    if single := _SINGLE.fullmatch(last.replace(" ", "").replace("\t", "")):
        return _normalise_number(single.group(1))
    if (value := _evaluate(last)) is not None:
        return str(value)                        # "3", "-3/4": Fraction's own form
    numbers = re.findall(_NUM, last)
    return _normalise_number(numbers[-1]) if numbers else None


def _clauses(line: str) -> list[tuple[str, bool]]:
    """The clauses of an answer line, each with whether it is a parenthesis holding words."""
    out, pos, text = [], 0, ""
    for m in _PARENS.finditer(line):
        if not re.search(r"[A-Za-z]", m.group(1)):
            continue                             # bare numbers: part of an expression
        if m.group(2) is None:                   # a label inside the clause: read as a space
            text += line[pos:m.start()] + " "
        else:
            out += [(c, False) for c in _CLAUSE_SPLIT.split(text + line[pos:m.start()])]
            out.append((m.group(1), True))
            text = ""
        pos = m.end()
    return out + [(c, False) for c in _CLAUSE_SPLIT.split(text + line[pos:])]


def _clause_value(clause: str) -> str | None:
    """The last number (or expression result) of a clause that is not negated ("not 16")."""
    for m in reversed(list(_EXPR.finditer(clause))):
        if not _NEGATED.search(clause, max(0, m.start() - 40), m.start()):
            if (value := _expression_value(m.group(0))) is not None:
                return value
    return None


def _line_value(line: str, explanations: bool = True) -> str | None:
    """The answer a line states: its last number not negated, "a op b = c" giving c. With ``explanations``
    (a marker's line), not one of a clause that explains an answer already stated, up to a restating clause."""
    if not re.search(r"\d", line):
        return None
    answer, explaining = None, False
    for clause, wordy_parens in _clauses(line):
        clause = clause.lstrip(" \t*_~>`")
        if explanations and answer is not None:
            restates = _RESTATES.match(clause) is not None
            if wordy_parens or _COMPARISON.search(clause) or (not restates and _EXPLAINS.match(clause)):
                explaining = True
                continue
            if explaining and not restates:
                continue
        value = _clause_value(clause)
        if value is not None:
            answer, explaining = value, False
    return answer


def _value_at(text: str, pos: int) -> str | None:
    """The value of the answer line after a marker ending at ``pos`` (past markdown, to the end of the sentence)."""
    pos = _LEAD.match(text, pos).end()
    limit = min(len(text), pos + _ANSWER_SPAN)
    end = _SENTENCE_END.search(text, pos, limit)
    return _line_value(text[pos:end.start() if end else limit])


def _brace_ends(text: str) -> dict[int, int]:
    """For every '{' of the text, the index of its matching '}' (the text's end when unmatched), in one pass."""
    ends, stack = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            ends[stack.pop()] = i
    ends.update((i, len(text)) for i in stack)
    return ends


def _last_value(text: str) -> str | None:
    """Without a marker: the value of the last sentence that states one (a check only when no earlier one does)."""
    check = None
    for line in reversed(_SENTENCE_END.split(text)):
        value = _line_value(line, explanations=False)
        if value is None:
            continue
        if _CHECK_LINE.match(line) is None:
            return value
        check = check or value
    return check


def extract_final_number(text: str) -> str | None:
    """The final stated number of an answer, normalised ("1250", "-3.50", "3/4"); ``None`` if there is none."""
    t = _clean(text)
    braces = None
    for m in reversed(list(_MARKER.finditer(t))):           # the last marker that holds a number
        if m.group(0).startswith("\\"):                     # \boxed{...}
            braces = braces if braces is not None else _brace_ends(t)
            value = _line_value(t[m.end():min(braces[m.end() - 1], m.end() + _ANSWER_SPAN)])
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


def numbers_equal(pred: str | None, ref: str | None) -> bool:
    """Exact comparison as fractions, after normalising both (1,250 == 1250.00; 3/4 == 0.75); False where
    either is missing or not a number."""
    try:
        return Fraction(_normalise_number(pred or "")) == Fraction(_normalise_number(ref or ""))
    except (TypeError, ValueError, ZeroDivisionError):      # None (no number), "1/0"
        return False


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/()]))")
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(expr: str) -> Fraction | None:
    """Exact value of an arithmetic expression (+ - * / and parentheses over decimal numbers), else ``None``.
    Python parses it with each number replaced by a name; nothing is ``eval``-ed."""
    s = expr.replace(",", "").replace("%", "").strip()
    numbers, code, pos = [], [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None:
            return None
        if m.group(1):
            numbers.append(Fraction(m.group(1)))
        code.append(f"n{len(numbers) - 1}" if m.group(1) else m.group(2))      # spaced: "* *" is no power
        pos = m.end()
    if not code or len(code) > 200:
        return None
    try:
        return _arithmetic(ast.parse(" ".join(code), mode="eval").body, numbers)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _arithmetic(node: ast.expr, numbers: list[Fraction]) -> Fraction:
    op = _ARITHMETIC.get(type(getattr(node, "op", None)))
    if isinstance(node, ast.Name):
        return numbers[int(node.id[1:])]
    if isinstance(node, ast.UnaryOp) and op is not None:
        return op(_arithmetic(node.operand, numbers))
    if isinstance(node, ast.BinOp) and op is not None:
        return op(_arithmetic(node.left, numbers), _arithmetic(node.right, numbers))
    raise ValueError(f"not arithmetic: {type(node).__name__}")


# -- CHAMP -------------------------------------------------------------------------------------
def champ_checkable(reference: str | None) -> str | None:
    """'number' when the reference is a plain number (or fraction), 'yesno' for Yes/No, else None."""
    r = (reference or "").strip()
    if re.fullmatch(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?", r):
        return "number"
    if r.lower() in ("yes", "no"):
        return "yesno"
    return None


def champ_final_answer(text: str) -> str | None:
    """The rest of the line after the last "final answer (is):", else the last \\boxed{} content."""
    if m := list(re.finditer(r"final answer\s*(?:is)?\s*:?\s*(.+)", text, flags=re.IGNORECASE)):
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
    """The code of an answer: the last fenced block that defines ``entry_point``, else any function, else the
    last block (an unterminated one runs to the end); the raw text when there is no fence."""
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
    """The prompt (imports, helpers, stub), then the model's full function (redefining the stub) or a bare body."""
    code = extract_code(answer, entry_point)
    if _defines(code, entry_point):
        return prompt + "\n    pass\n\n" + textwrap.dedent(code)
    return prompt + code
