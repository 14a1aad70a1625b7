"""The HumanEval sandbox's guard: every escape that could pass a wrong solution or reach outside the sandbox
has its own test, run with bwrap and, where it applies, with the rlimits fallback."""
from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import pytest
import sandbox_fixtures

from csd.evaluation import sandbox
from csd.evaluation.datasets import load_humaneval
from csd.evaluation.graders import grade, humaneval_program
from csd.evaluation.sandbox import SandboxError, isolation, run_humaneval

sandbox_mode = sandbox_fixtures.sandbox_mode  # the fixture


@pytest.fixture(scope="module")
def humaneval():
    return {it.item_id: it for it in load_humaneval()}


# -- HumanEval: the sandbox ------------------------------------------------------------------------
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
    got = run_humaneval(program, "def check(fn):\n    assert fn() == 1\n", "f", mode=mode)
    assert got == (True, f"passed ({mode})")
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
        with caplog.at_level("WARNING", logger="csd.evaluation.sandbox"):
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
