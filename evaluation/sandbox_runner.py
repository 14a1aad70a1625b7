"""The two processes of a HumanEval run (``csd.evaluation.sandbox`` starts them): the trusted test HARNESS,
which runs the prompt and the test's ``check``, and the sandboxed CHILD that holds the candidate and answers
each call through a pipe. They share no globals; only plain builtin data is accepted back (``plain_loads``).
Protocol and threat model: ``docs/grading.md``. Runs as ``python -I -B -c <this source> harness|child ...``:
standard library only.
"""
from __future__ import annotations

import io
import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import time

MAX_FRAME = 16 << 20          # the largest reply the harness reads (bytes)
MAX_NODES = 1_000_000         # the most containers and values a reply may hold (shared ones each time)
MAX_DEPTH = 100               # the deepest a reply may nest
PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)
_HEADER = struct.Struct(">I")


# -- frames: a 4-byte length, then the payload ------------------------------------------------------
def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


class NotPlain(ValueError):
    """A reply holds something other than plain builtin data."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("builtins", "complex"):     # the only builtin that pickles by name
            return complex
        raise NotPlain(f"a value built by {module}.{name}")


def plain_loads(data: bytes):
    """The value of a pickle of plain builtin data, else ``NotPlain``: no class can be named (so no code
    runs), and the value's size and depth are bounded (no cycles)."""
    try:
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except NotPlain:
        raise
    except Exception as e:           # truncated or forged bytes, out-of-band buffers, persistent ids
        raise NotPlain(f"bytes that are not a plain pickle ({type(e).__name__})") from None
    nodes, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        nodes += 1
        if type(v) not in PLAIN_TYPES:
            raise NotPlain(f"an object of type {type(v).__module__}.{type(v).__qualname__}")
        if nodes > MAX_NODES:
            raise NotPlain(f"a value of more than {MAX_NODES} items (or one that contains itself)")
        if depth > MAX_DEPTH:
            raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels (or one that contains itself)")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for kv in v.items() for x in kv)
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend((x, depth + 1) for x in v)
    return value


def _describe(e: BaseException) -> str:
    try:
        msg = str(e)
    except Exception:                # a candidate's exception whose __str__ fails
        msg = ""
    return (f"{type(e).__name__}: {msg}" if msg else type(e).__name__)[:300]


# -- the child: the candidate, sandboxed ------------------------------------------------------------------
def _child_main(argv: list[str]) -> None:
    """Load the candidate (as module ``candidate``) under the guard, answer ``R`` or ``F`` + why not, then
    each call with ``V`` + pickled value, ``E`` + what it raised or ``U`` + an unpicklable value's type.
    The helpers are bound before any candidate code runs."""
    import builtins

    script, entry_point, workdir = argv[0], argv[1], argv[2]
    cpu_s, mem_bytes, fsize_bytes = (int(a) for a in argv[3:6])
    read, write, exit_now, dumps, loads = os.read, os.write, os._exit, pickle.dumps, pickle.loads
    # private, non-inheritable duplicates of stdin (requests) and stdout (replies); then stdin reads /dev/null
    # and stdout goes to stderr, so the candidate's prints and reads touch neither channel
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)

    def reply(tag: bytes, data: bytes = b"") -> None:
        view = memoryview(frame(tag + data))
        while view:
            view = view[write(replies, view):]

    def receive() -> bytes | None:
        buf = b""
        while len(buf) < _HEADER.size or len(buf) < _HEADER.size + _HEADER.unpack(buf[:_HEADER.size])[0]:
            chunk = read(requests, 1 << 16)
            if not chunk:
                return None
            buf += chunk
        return buf[_HEADER.size:]

    try:
        with open(script, encoding="utf-8") as f:
            code = compile(f.read(), "candidate.py", "exec")
        namespace = {"__name__": "candidate", "__file__": script, "__builtins__": builtins}
        reliability_guard(workdir, cpu_s, mem_bytes, fsize_bytes)
        exec(code, namespace)         # noqa: S102 - running the candidate is this runner's purpose
        fn = namespace.get(entry_point)
        if not callable(fn):
            raise NameError(f"the program defines no function {entry_point!r}")
    except BaseException as e:        # SyntaxError, an error or SystemExit while loading
        reply(b"F", _describe(e).encode("utf-8", "replace"))
        exit_now(1)
    reply(b"R")
    while (request := receive()) is not None:
        args, kwargs = loads(request)
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:    # SystemExit and KeyboardInterrupt included: a failed call
            reply(b"E", _describe(e).encode("utf-8", "replace"))
            continue
        try:
            data, why = dumps(result, protocol=5), f"over {MAX_FRAME >> 20} MiB"
        except BaseException as e:    # a generator, a lambda, a class of the module, too deep ...
            data, why = None, _describe(e)
        if data is None or len(data) > MAX_FRAME - 1:
            kind = type(result)
            reply(b"U", f"{kind.__module__}.{kind.__qualname__} ({why})".encode("utf-8", "replace"))
        else:
            reply(b"V", data)
    exit_now(0)


_OS_DISABLED = (
    # processes and signals
    "kill", "killpg", "system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
    "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
    "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
    "setsid", "setpgid", "setpgrp", "setuid", "seteuid", "setreuid", "setresuid", "setgid", "setegid",
    "setregid", "setresgid", "chroot", "chdir", "fchdir",
    # the environment of the process
    "putenv", "unsetenv",
    # deleting, moving, truncating, permissions, links
    "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "truncate", "ftruncate",
    "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "chflags", "lchflags",
    "link", "symlink", "mkfifo", "mknod",
)


def _refuse(name: str):
    def refused(*args, **kwargs):
        raise PermissionError(f"{name} is disabled in the HumanEval sandbox")
    refused.__name__ = refused.__qualname__ = name.rsplit(".", 1)[-1]
    return refused


def reliability_guard(workdir: str, cpu_s: int, mem_bytes: int, fsize_bytes: int) -> None:
    """Make this process unfit for accidental damage before it runs a candidate: resource limits, no
    process, deletion, permission, network or environment calls, writes only under ``workdir``. Not a
    security boundary: ``ctypes`` gets around it (docs/grading.md)."""
    import resource

    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, mem_bytes),
                         (resource.RLIMIT_FSIZE, fsize_bytes), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    sys.modules["resource"] = None    # the limits stay as set (a root process could raise them)
    _refuse_calls()
    _confine_writes(workdir)


def _refuse_calls() -> None:
    """faulthandler, exit, quit, ``_OS_DISABLED``, shutil's deletions and moves, new processes and sockets
    that connect or listen: each replaced by a call that raises PermissionError."""
    import builtins
    import faulthandler
    import posix
    import socket

    faulthandler.disable()
    for name in ("enable", "dump_traceback_later", "register"):
        setattr(faulthandler, name, _refuse(f"faulthandler.{name}"))
    builtins.exit = _refuse("exit")
    builtins.quit = _refuse("quit")

    for module in (os, posix):        # os re-exports posix: both names must go
        for name in _OS_DISABLED:
            if hasattr(module, name):
                setattr(module, name, _refuse(f"os.{name}"))
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, _refuse(f"shutil.{name}"))
    subprocess.Popen = _refuse("subprocess.Popen")            # run, call, check_output ... use it
    import _posixsubprocess
    _posixsubprocess.fork_exec = _refuse("_posixsubprocess.fork_exec")

    for name in ("connect", "connect_ex", "bind", "sendto", "sendmsg"):
        setattr(socket.socket, name, _refuse(f"socket.{name}"))
    socket.create_connection = _refuse("socket.create_connection")
    socket.create_server = _refuse("socket.create_server")


def _confine_writes(workdir: str) -> None:
    """open, os.open and os.mkdir write only under ``workdir`` (or to os.devnull)."""
    import builtins
    import posix

    root = os.path.realpath(workdir)
    realpath, fspath, fsdecode = os.path.realpath, os.fspath, os.fsdecode

    def inside(path, dir_fd=None) -> None:
        if dir_fd is not None:
            raise PermissionError("writing relative to a directory descriptor is disabled in the sandbox")
        full = realpath(fsdecode(fspath(path)))
        if not (full == root or full.startswith(root + os.sep) or full == os.devnull):
            raise PermissionError(f"writing outside the sandbox's directory is disabled: {full}")

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and any(c in mode for c in "wax+"):
            inside(file)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open

    real_os_open = os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & writes:
            inside(path, dir_fd)
        return real_os_open(path, flags, mode)

    real_mkdir = os.mkdir

    def guarded_mkdir(path, mode=0o777, *, dir_fd=None):
        inside(path, dir_fd)
        return real_mkdir(path, mode)

    for module in (os, posix):
        module.open, module.mkdir = guarded_os_open, guarded_mkdir


# -- the harness: the tests, trusted, in their own process ---------------------------------------------
class CandidateError(Exception):
    """The candidate raised during a call; the message names its exception."""


class RunFailed(BaseException):
    """The child timed out, crashed or broke the protocol: the run fails whatever the test does
    next (a BaseException, so that a test's ``except Exception`` does not swallow it)."""


class Sandboxed:
    """The child process and its two pipes, seen from the harness. ``call`` is the candidate."""

    def __init__(self, cmd: list[str], env: dict, cwd: str, deadline: float, timeout: float):
        import tempfile

        self.deadline, self.timeout, self.calls, self.failure = deadline, timeout, 0, None
        self.err = tempfile.TemporaryFile(prefix="csd-humaneval-child-err-")
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err)
        self.to_child, self.from_child = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.to_child, False)

    def wait_ready(self) -> None:
        """Until the program has loaded; why not when it fails to (SyntaxError, an exit ...)."""
        tag, data = self._receive()
        if tag == b"F":
            self._fail(data.decode("utf-8", "replace"))
        if tag != b"R":
            self._broken(f"it answered {tag!r} before it was ready")

    def call(self, args: tuple, kwargs: dict):
        if self.failure is not None:
            raise RunFailed(self.failure)
        try:
            request = pickle.dumps((args, kwargs), protocol=5)
        except Exception as e:
            raise TypeError(f"the test passed an argument that cannot be sent to the candidate: {e}") from None
        self.calls += 1
        self._send(frame(request))
        tag, data = self._receive()
        if tag == b"V":
            try:
                return plain_loads(data)
            except NotPlain as e:
                self._fail(f"the candidate returned {e}, not plain data")
        if tag == b"U":
            self._fail(f"the candidate returned a {data.decode('utf-8', 'replace')}, which cannot be sent "
                       "as plain data")
        if tag == b"E":
            raise CandidateError(data.decode("utf-8", "replace"))
        self._broken(f"it answered {tag!r}")

    def _fail(self, why: str):
        self.failure = why
        raise RunFailed(why)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._fail(f"timed out after {self.timeout:g} s")
        return left

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            select.select([], [self.to_child], [], self._left())
            try:
                view = view[os.write(self.to_child, view):]
            except BlockingIOError:
                continue
            except OSError:               # the child is gone (broken pipe)
                self._broken("it stopped reading")

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if not select.select([self.from_child], [], [], self._left())[0]:
                continue                  # _left() raises once the deadline has passed
            chunk = os.read(self.from_child, min(n - len(buf), 1 << 20))
            if not chunk:
                self._broken("it closed its reply channel")
            buf += chunk
        return bytes(buf)

    def _receive(self) -> tuple[bytes, bytes]:
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        if not 1 <= size <= MAX_FRAME:
            self._broken(f"it sent a reply of {size} bytes")
        payload = self._read(size)
        return payload[:1], payload[1:]

    def _broken(self, what: str):
        """The child did not answer as it must: fail, saying how it ended if it did (within a moment)."""
        try:
            rc = self.proc.wait(timeout=max(0.0, min(1.0, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            self._fail(f"the program broke the protocol ({what})")
        if rc == 0:
            self._fail("the program ended before its tests finished (exit status 0)")
        self.err.seek(max(0, self.err.seek(0, os.SEEK_END) - 4096))
        last = self.err.read().decode("utf-8", "replace").strip().splitlines()
        if last:
            self._fail(last[-1].strip()[:300])
        self._fail(f"killed by signal {-rc} before its tests finished" if rc < 0 else
                   f"exit status {rc} before its tests finished")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.err.close()


def _test_error(e: BaseException, test: str) -> str:
    """What failed in the test, and where: "AssertionError at test line 12: assert ..."."""
    import traceback

    lines = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<test>"]
    where = ""
    if lines:
        src = test.splitlines()[lines[-1].lineno - 1].strip() if lines[-1].lineno else ""
        where = f" at test line {lines[-1].lineno}: {src}"
    what = f"the candidate raised {e}" if isinstance(e, CandidateError) else _describe(e)
    return (what + where)[:300]


def run_tests(job: dict) -> dict:
    """Run the prompt and the test, call ``check`` with the sandboxed candidate: ``{"passed": bool, "why": str}``."""
    deadline = time.monotonic() + job["timeout"]
    namespace = {"__name__": "humaneval_test"}
    try:
        exec(compile(job["context"], "<prompt>", "exec"), namespace)      # noqa: S102 - the dataset's code
        exec(compile(job["test"], "<test>", "exec"), namespace)           # noqa: S102
        check = namespace["check"]
    except BaseException as e:
        return {"passed": False, "why": f"the test cannot run: {_describe(e)}"}
    child = None
    try:
        child = Sandboxed(job["cmd"], job["env"], job["workdir"], deadline, job["timeout"])
        child.wait_ready()

        def candidate(*args, **kwargs):
            return child.call(args, kwargs)

        candidate.__name__ = candidate.__qualname__ = job["entry_point"]
        namespace[job["entry_point"]] = candidate       # helpers of the prompt call it by name
        check(candidate)
    except RunFailed as e:
        return {"passed": False, "why": str(e)}
    except BaseException as e:
        return {"passed": False, "why": child.failure if child and child.failure else _test_error(e, job["test"])}
    finally:
        if child is not None:
            child.close()
    if child.failure is not None:            # a test that swallowed the failure does not pass
        return {"passed": False, "why": child.failure}
    if child.calls == 0:
        return {"passed": False, "why": "the tests never called the candidate"}
    return {"passed": True, "why": "passed"}


def _harness_main() -> None:
    """Read the job (JSON) from stdin, run it, write ``<nonce> <verdict JSON>`` on stdout."""
    import json

    job = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    sys.stdout.write(f"{job['nonce']} {json.dumps(run_tests(job))}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1] == "child":
        _child_main(sys.argv[2:])
    else:
        _harness_main()
