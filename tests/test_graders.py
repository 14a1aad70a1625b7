"""The graders: final numbers (GSM8K, user files), CHAMP, the HumanEval sandbox (every escape that
could pass a wrong solution or reach outside the sandbox has its own test, run with bwrap and, where
it applies, with the rlimits fallback), and ``python -m csd grade`` end to end."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import sandbox
from bench.datasets import DatasetError, get_item, load_champ, load_gsm8k, load_humaneval
from bench.graders import (
    champ_checkable,
    extract_code,
    extract_final_number,
    grade,
    grade_champ,
    gsm8k_reference,
    humaneval_program,
    numbers_equal,
)
from bench.sandbox import SandboxError, isolation, run_humaneval

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


# -- HumanEval: the sandbox ------------------------------------------------------------------------
def _need_bwrap() -> None:
    """bwrap must run here: on CI a missing or broken bubblewrap fails the test, elsewhere it skips."""
    problem = sandbox.bwrap_problem()      # says "install Debian's bubblewrap" when bwrap is missing
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.fixture(params=["bwrap", "rlimits"])
def mode(request):
    """Each sandbox test runs with bwrap and with the rlimits fallback (forced)."""
    if request.param == "bwrap":
        _need_bwrap()
    return request.param


@pytest.fixture
def bwrap():
    _need_bwrap()
    return "bwrap"


def _he0(humaneval, body: str) -> tuple[str, str, str]:
    x = humaneval["HumanEval/0"].extra
    return humaneval_program(x["prompt"], body, x["entry_point"]), x["test"], x["entry_point"]


WRONG = "    return True\n"


def test_humaneval_canonical_passes_wrong_fails(humaneval):
    it = humaneval["HumanEval/0"]
    x = it.extra
    answer = f"Here is the function:\n```python\n{x['prompt']}{x['canonical_solution']}```\nIt works."
    assert grade(it, answer).correct is True                                     # full function in a block
    ok, detail = run_humaneval(*_he0(humaneval, x["canonical_solution"]))         # a bare body
    assert ok and detail == f"passed ({isolation()})"
    ok, detail = run_humaneval(*_he0(humaneval, WRONG))
    assert not ok and "AssertionError" in detail
    truncated = f"```python\n{x['prompt']}    for i in range(len("                # cut off mid-line
    assert grade(it, truncated).correct is False
    # a later block of the model's own tests is not the solution; a main guard does not run
    extra = (f"```python\n{x['prompt']}{x['canonical_solution']}```\nTests:\n```python\ndef test_it():\n"
             f"    assert False\n\nif __name__ == '__main__':\n    raise SystemExit(input())\n```")
    assert grade(it, extra).correct is True


@pytest.mark.parametrize("task", ["HumanEval/0", "HumanEval/32", "HumanEval/162"])
def test_canonical_solutions_pass_under_the_guard(humaneval, mode, task):
    """The guard leaves what solutions need (162 uses hashlib); the prompt gives the test poly (32)."""
    x = humaneval[task].extra
    ok, detail = run_humaneval(humaneval_program(x["prompt"], x["canonical_solution"], x["entry_point"]),
                               x["test"], x["entry_point"], mode=mode, context=x["prompt"])
    assert ok and detail == f"passed ({mode})", detail


ESCAPES = ["sys.exit(0)", "os._exit(0)", "exit()", "quit()", "raise SystemExit", "raise SystemExit(0)"]


@pytest.mark.parametrize("escape", ESCAPES)
@pytest.mark.parametrize("where", ["module", "function"])
def test_early_exit_does_not_pass(humaneval, mode, escape, where):
    """A wrong solution that ends the process with a success status before its tests run fails."""
    if where == "module":
        program, test, entry = _he0(humaneval, WRONG)
        program += f"\nimport os, sys\n{escape}\n"
    else:
        program, test, entry = _he0(humaneval, f"    import os, sys\n    {escape}\n    return True\n")
    ok, detail = run_humaneval(program, test, entry, mode=mode)
    assert not ok, detail
    assert detail.endswith(f"({mode})")


def test_result_channel_cannot_be_forged(humaneval, mode):
    """The candidate reads nothing on stdin and does not pass by writing "passed" to every descriptor."""
    program, test, entry = _he0(humaneval, WRONG)
    program += ("\nimport os, sys\nseen = sys.stdin.read()\nassert seen == '', seen\n"
                "for fd in range(1, 64):\n"
                "    try:\n        os.write(fd, b'passed ' + seen.encode())\n    except OSError:\n        pass\n"
                "print('passed')\nos._exit(0)\n")
    ok, detail = run_humaneval(program, test, entry, mode=mode)
    assert not ok and "ended before its tests finished" in detail


def test_humaneval_timeout_kills_infinite_loop(humaneval, mode):
    t0 = time.monotonic()
    ok, detail = run_humaneval(*_he0(humaneval, "    while True:\n        pass\n"), timeout=2, mode=mode)
    assert not ok and detail == f"timed out after 2 s ({mode})"
    assert time.monotonic() - t0 < 6


def test_humaneval_sandbox_isolation(monkeypatch, tmp_path, mode):
    """Runs in a fresh temporary cwd, without the caller's environment (proxies, PYTHONPATH)."""
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    program = ("import os, sys, tempfile\n"
               "def f():\n"
               "    assert 'HTTP_PROXY' not in os.environ and 'PYTHONPATH' not in os.environ\n"
               f"    assert os.getcwd() != {str(tmp_path)!r}\n"
               "    assert os.path.basename(os.getcwd()).startswith('csd-humaneval-')\n"
               "    open('left_behind.txt', 'w').write('x')\n"
               "    return 1\n")
    assert run_humaneval(program, "def check(fn):\n    assert fn() == 1\n", "f", mode=mode) == (True, f"passed ({mode})")
    assert not (tmp_path / "left_behind.txt").exists()
    # memory limit: allocating far beyond it fails instead of swapping the machine
    hog = "def f():\n    return len(bytearray(8 << 30))\n"
    ok, detail = run_humaneval(hog, "def check(fn):\n    fn()\n", "f", mode=mode)
    assert not ok and "MemoryError" in detail


def test_isolation_setting(monkeypatch):
    monkeypatch.setenv("CSD_SANDBOX", "rlimits")
    assert isolation() == "rlimits"
    ok, detail = run_humaneval("def f():\n    return 1\n", "def check(fn):\n    assert fn() == 1\n", "f")
    assert ok and detail == "passed (rlimits)"
    monkeypatch.setenv("CSD_SANDBOX", "docker")
    with pytest.raises(SandboxError, match="auto, bwrap or rlimits"):
        isolation()
    monkeypatch.delenv("CSD_SANDBOX")
    assert isolation() == ("bwrap" if sandbox.bwrap_problem() is None else "rlimits")


def test_falls_back_when_bwrap_cannot_start(tmp_path, monkeypatch, caplog):
    """A bwrap that cannot create namespaces (as in some containers): auto mode falls back to
    rlimits with a warning and says so in the detail; a forced bwrap fails loudly."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("CSD_SANDBOX", raising=False)
    sandbox.bwrap_problem.cache_clear()
    sandbox._warn_fallback.cache_clear()
    try:
        assert "No permissions to create new namespace" in sandbox.bwrap_problem()
        with caplog.at_level("WARNING", logger="bench.sandbox"):
            assert isolation() == "rlimits"
        assert "without the bwrap sandbox" in caplog.text
        ok, detail = run_humaneval("def f():\n    return 1\n", "def check(fn):\n    assert fn() == 1\n", "f")
        assert ok and detail == "passed (rlimits)"
        with pytest.raises(SandboxError, match="cannot create its sandbox"):
            isolation("bwrap")
    finally:
        sandbox.bwrap_problem.cache_clear()
        sandbox._warn_fallback.cache_clear()


# Plain attempts run under both isolations (the guard stops them in the fallback); attempts that get
# around the in-process guard (ctypes, _io, _socket) only under bwrap, the one that must hold.
SANDBOX_HOLDS = pytest.mark.parametrize("mode, bypass", [("bwrap", False), ("bwrap", True), ("rlimits", False)],
                                        ids=["bwrap-plain", "bwrap-bypassing-guard", "rlimits-plain"],
                                        indirect=["mode"])


# Attempts that the candidate makes; each swallows its own OSError so that every one is tried.
def _attempts(lines: list[str]) -> str:
    out = ["import os, sys, shutil, socket, subprocess, ctypes, struct, time",
           "libc = ctypes.CDLL(None, use_errno=True)"]
    for line in lines:
        out += ["try:", f"    {line}", "except OSError:", "    pass"]
    return "\n".join(out) + "\n"


def _run_attempts(lines: list[str], mode: str) -> tuple[bool, str]:
    """The attempts at module level, then a correct function: the run must still pass, so a
    blocked attempt neither crashes the runner nor fakes a result."""
    program = _attempts(lines) + "\ndef f():\n    return 1\n"
    return run_humaneval(program, "def check(fn):\n    assert fn() == 1\n", "f", mode=mode)


def _write_lines(path: Path, bypass: bool) -> list[str]:
    p = repr(str(path))
    if not bypass:
        return [f"open({p}, 'w').write('escaped')", f"os.open({p}, os.O_WRONLY | os.O_CREAT)",
                f"__import__('pathlib').Path({p}).write_text('escaped')"]
    return [f"__import__('_io').FileIO({p}, 'w').write(b'escaped')",
            f"libc.write(libc.open({str(path).encode()!r}, 0o101, 0o644), b'escaped', 7)"]   # O_WRONLY|O_CREAT


@SANDBOX_HOLDS
def test_cannot_write_outside(tmp_path, mode, bypass):
    targets = [tmp_path / "escaped.txt", Path.home() / f"csd-escape-{secrets.token_hex(6)}.txt"]
    try:
        ok, detail = _run_attempts([line for t in targets for line in _write_lines(t, bypass)], mode)
        assert ok, detail
        for t in targets:
            assert not t.exists(), t
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


@SANDBOX_HOLDS
def test_cannot_delete_outside(tmp_path, mode, bypass):
    home_victim = Path.home() / f"csd-victim-{secrets.token_hex(6)}.txt"
    victim, victim_dir = tmp_path / "victim.txt", tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "inside.txt").write_text("keep")
    lines = []
    try:
        for v in (victim, home_victim):
            v.write_text("keep")
            p = repr(str(v))
            if bypass:
                lines += [f"libc.unlink({str(v).encode()!r})",
                          f"__import__('importlib').reload(__import__('posix')).unlink({p})"]
            else:
                lines += [f"os.remove({p})", f"os.unlink({p})", f"import os as o; getattr(o, 'unlink')({p})",
                          f"os.rename({p}, {p} + '.moved')", f"os.truncate({p}, 0)", f"os.chmod({p}, 0)"]
        d = repr(str(victim_dir))
        lines += ([f"libc.rmdir({str(victim_dir).encode()!r})"] if bypass else
                  [f"shutil.rmtree({d})", f"shutil.move({d}, {d} + '.moved')"])
        ok, detail = _run_attempts(lines, mode)
        assert ok, detail
        for v in (victim, home_victim, victim_dir / "inside.txt"):
            assert v.read_text() == "keep", v
    finally:
        home_victim.unlink(missing_ok=True)


@SANDBOX_HOLDS
def test_cannot_reach_the_network(mode, bypass):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        if bypass:
            addr = f"struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)"
            lines = [f"libc.connect(libc.socket(2, 1, 0), {addr}, 16)",
                     f"__import__('_socket').socket().connect(('127.0.0.1', {port}))"]
        else:
            lines = [f"socket.create_connection(('127.0.0.1', {port}), timeout=2)",
                     f"socket.socket().connect(('127.0.0.1', {port}))"]
        ok, detail = _run_attempts(lines, mode)
        assert ok, detail
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()                                   # nobody connected
    finally:
        server.close()


def _alive_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue                                      # the process ended while we looked
    return pids


@pytest.mark.parametrize("bypass", [False, True], ids=["plain", "bypassing-guard"])
def test_no_process_left_behind(humaneval, mode, bypass):
    """Background processes die with the run, and the wrong solution still fails."""
    marker = f"1000.{secrets.randbelow(10 ** 9):09d}"
    if bypass:      # the sandbox, not the guard, must stop these: raw fork and system() through libc
        lines = [f"libc.system(b'sleep {marker} &')",
                 (f"pid = libc.fork()\n    if pid == 0:\n"
                  f"        libc.execl(b'/bin/sleep', b'sleep', b'{marker}', None)\n        os._exit(0)")]
    else:
        lines = [f"subprocess.Popen(['sleep', '{marker}'])",
                 (f"pid = os.fork()\n    if pid == 0:\n        try:\n"
                  f"            os.execvp('sleep', ['sleep', '{marker}'])\n        finally:\n            os._exit(0)"),
                 f"os.system('sleep {marker} &')"]
    program, test, entry = _he0(humaneval, WRONG)
    program = _attempts(lines) + program
    pids = _alive_with(marker)
    try:
        ok, detail = run_humaneval(program, test, entry, mode=mode)
        assert not ok and "AssertionError" in detail, detail
        deadline = time.monotonic() + 2
        while (pids := _alive_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids == [], f"left behind: {pids}"
    finally:
        for pid in pids:
            os.kill(pid, 9)


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
