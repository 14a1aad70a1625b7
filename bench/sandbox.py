"""Running a HumanEval candidate program so that it passes only when its tests ran to their end.

What each guard protects against:

- Ending early with a success status (``sys.exit(0)``, ``os._exit(0)``, ``exit()``, ``quit()``,
  ``raise SystemExit``, in the module or in the function): the exit status alone proves nothing.
  The parent sends the child a per-run random nonce on its stdin; the child's runner reads it,
  closes stdin and duplicates its stdout into a private result channel, all before any candidate
  code runs (the candidate's own prints go to stderr). Only after ``check(entry_point)`` returned
  does the runner write the nonce to that channel and exit 0. The parent passes the item only when
  exactly that nonce arrived AND the exit status is 0. The candidate never sees the nonce on any
  channel; it could only dig it out of the runner's memory (its frames or objects, e.g. through
  ``gc``): that stops every exit-status escape and accident, not a program written to attack
  this runner.
- Hangs and CPU burners: a wall-clock limit, ``RLIMIT_CPU``; the whole process tree is killed.
- Memory hogs: ``RLIMIT_AS``. Huge output or files: ``RLIMIT_FSIZE`` (stdout and stderr are files
  too). Core dumps: ``RLIMIT_CORE`` 0.
- Writing or deleting outside its temporary directory, the network, processes left behind:
  the OS-level sandbox when bubblewrap (Debian's ``bubblewrap``) can run here: ``bwrap --ro-bind / /
  --tmpfs /tmp --proc /proc --dev /dev --bind WORKDIR WORKDIR --unshare-all --die-with-parent
  --new-session --cap-drop ALL --chdir WORKDIR``: the file system is read-only except the
  temporary directory and scratch tmpfs mounts that vanish with the sandbox; the network
  namespace has only its own loopback; the PID namespace dies with bwrap, so nothing survives
  the run. Where bwrap is missing or cannot create namespaces (some containers forbid them), the
  runner falls back to "rlimits": the in-process ``reliability_guard`` below, the limits above,
  a new session and killing its whole process group. The guard stops accidents and naive
  escapes (it disables process, deletion, permission and network calls and refuses writes outside
  the directory) but it is NOT a security boundary: ``ctypes`` or the C modules behind ``io``
  and ``socket`` get around it (the tests do, to prove that bwrap holds). The guard runs under
  bwrap too, as a first line. In the fallback a process that calls ``setsid`` through ``ctypes``
  leaves the process group and can outlive the run. ``isolation()`` says which one runs here
  (for the benchmark's metadata), and every result's detail names it ("passed (bwrap)").
  ``CSD_SANDBOX=bwrap|rlimits`` forces one (``bwrap`` fails loudly when it cannot run).
- Leaking the caller's environment: ``python -I -B``, a minimal environment (no proxies, no
  ``PYTHON*`` variables), a fresh temporary directory as cwd, ``HOME`` and ``TMPDIR``.
- Examples under a main guard in the answer: the candidate module runs as ``candidate``, not
  ``__main__``.

This file is also the child's runner: it runs as ``python -I -B -c <this source> ...``, so the
runner needs nothing outside the standard library and nothing from this repository's path.
"""
from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HUMANEVAL_TIMEOUT_S = 10.0
MEM_BYTES = 2 << 30          # address space of the child
FSIZE_BYTES = 1 << 20        # largest file the child may write (its stdout and stderr included)
ISOLATIONS = ("bwrap", "rlimits")
ENV_VAR = "CSD_SANDBOX"      # auto (default): bwrap when it runs here, else rlimits
_NONCE_BYTES = 32

log = logging.getLogger(__name__)


class SandboxError(ValueError):
    """The requested isolation cannot be honoured here (e.g. ``CSD_SANDBOX=bwrap`` without a
    working bubblewrap); the message says why and what to install."""


# -- which isolation -----------------------------------------------------------------------------
def isolation(mode: str | None = None) -> str:
    """The isolation a run gets here: "bwrap" or "rlimits". ``mode`` (else ``$CSD_SANDBOX``) may
    force one; "auto" (the default) takes bwrap when it can start a sandbox on this machine."""
    mode = (mode or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if mode not in ("auto",) + ISOLATIONS:
        raise SandboxError(f"{ENV_VAR} must be auto, bwrap or rlimits, got {mode!r}")
    if mode == "rlimits":
        return "rlimits"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxError(f"the bwrap sandbox was asked for, but {problem}")
    _warn_fallback(problem)
    return "rlimits"


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """``None`` when bubblewrap can run a sandboxed Python here, else why not (checked once)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (install Debian's bubblewrap: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="csd-humaneval-probe-") as tmp:
        workdir = os.path.realpath(tmp)
        try:
            probe = subprocess.run(_bwrap_prefix(exe, workdir) + [sys.executable, "-I", "-S", "-c", "pass"],
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap ({exe}) could not start: {e}"
    if probe.returncode != 0:
        why = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap ({exe}) cannot create its sandbox here: {why[-1] if why else probe.returncode}"
    return None


@functools.lru_cache(maxsize=1)
def _warn_fallback(problem: str) -> None:
    log.warning("HumanEval programs run without the bwrap sandbox (only rlimits and an in-process "
                "guard): %s", problem)


def _bwrap_prefix(exe: str, workdir: str) -> list[str]:
    """The bwrap command line up to the sandboxed command: everything read-only but ``workdir``."""
    args = [exe, "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
    for path in _python_dirs_under_tmp():          # a Python installed under /tmp must stay visible
        args += ["--ro-bind", path, path]
    # the working directory is bound last, so that no later mount (/dev, /proc) can cover it
    return args + ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, workdir, "--unshare-all",
                   "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--chdir", workdir, "--"]


def _python_dirs_under_tmp() -> list[str]:
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                          os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(d for d in dirs if d == "/tmp" or d.startswith("/tmp/"))


# -- the parent ------------------------------------------------------------------------------------
def run_humaneval(program: str, test: str, entry_point: str, timeout: float = HUMANEVAL_TIMEOUT_S,
                  mem_bytes: int = MEM_BYTES, mode: str | None = None) -> tuple[bool, str]:
    """Run ``program``, then ``test``, then ``check(<entry_point>)`` in a child process isolated as
    the module docstring says. Returns ``(passed, detail)``: passed only when ``check`` returned
    (the nonce arrived) and the exit status is 0; the detail ends with the isolation used."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a Python identifier")
    iso = isolation(mode)
    nonce = secrets.token_hex(_NONCE_BYTES).encode("ascii")
    with tempfile.TemporaryDirectory(prefix="csd-humaneval-") as tmp, \
            tempfile.TemporaryFile(prefix="csd-humaneval-out-") as out, \
            tempfile.TemporaryFile(prefix="csd-humaneval-err-") as err:
        workdir = os.path.realpath(tmp)
        script = Path(workdir) / "candidate.py"
        script.write_text(f"{program}\n\n{test}\n", encoding="utf-8")
        child = [sys.executable, "-I", "-B", "-c", _runner_source(), str(script), entry_point, workdir,
                 str(int(timeout) + 1), str(mem_bytes), str(FSIZE_BYTES)]
        cmd = _bwrap_prefix(shutil.which("bwrap") or "bwrap", workdir) + child if iso == "bwrap" else child
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "HOME": workdir, "TMPDIR": workdir}
        rd, wr = os.pipe()            # the nonce waits in the pipe; the child reads it before anything else
        try:
            os.write(wr, nonce)
        finally:
            os.close(wr)
        try:
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=rd, stdout=out, stderr=err,
                                    start_new_session=True)
        finally:
            os.close(rd)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:g} s ({iso})"
        finally:
            _kill_group(proc)         # whatever the program left running in its process group
            proc.wait()
        out.seek(0)
        result = out.read(len(nonce) + 1)
        err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
        last = err.read().decode("utf-8", "replace").strip().splitlines()
    return _verdict(rc, result == nonce, last[-1].strip() if last else "", iso)


def _verdict(rc: int, finished: bool, last_line: str, iso: str) -> tuple[bool, str]:
    if finished and rc == 0:
        return True, f"passed ({iso})"
    if finished:
        why = f"exit status {rc} after the tests finished"
    elif rc == 0:                     # whatever it printed: a clean exit without the nonce is an escape
        why = "the program ended before its tests finished (exit status 0)"
    elif last_line:
        why = last_line[:300]
    elif rc < 0:
        why = f"killed by signal {-rc} before its tests finished"
    else:
        why = f"exit status {rc} before its tests finished"
    return False, f"{why} ({iso})"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass                          # the group is already gone: nothing left to kill
    except PermissionError as e:      # a member changed its credentials; the group id was reused
        log.warning("could not kill the sandbox's process group %d: %s", proc.pid, e)


@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    return Path(__file__).read_text(encoding="utf-8")


# -- the child: runner and guard ---------------------------------------------------------------------
def _result_channel():
    """Read the nonce from stdin to its end, replace stdin by /dev/null, keep a private duplicate of
    stdout as the result channel and point fd 1 at stderr. Returns ``emit()``, which writes the
    nonce to the channel and exits 0 at once; it holds what it needs in its closure, so a candidate
    that patches ``os`` or ``sys`` cannot change it."""
    chunks = []
    while chunk := os.read(0, 4096):
        chunks.append(chunk)
    token = b"".join(chunks)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    channel = os.dup(1)               # not inheritable: children of the candidate do not get it
    os.dup2(2, 1)
    write, exit_now = os.write, os._exit
    stdout, stderr = sys.stdout, sys.stderr

    def emit() -> None:
        stdout.flush()
        stderr.flush()
        write(channel, token)
        exit_now(0)

    return emit


def _set_limits(cpu_s: int, mem_bytes: int, fsize_bytes: int) -> None:
    import resource

    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, mem_bytes),
                         (resource.RLIMIT_FSIZE, fsize_bytes), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))


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


def reliability_guard(workdir: str, cpu_s: int = int(HUMANEVAL_TIMEOUT_S) + 1, mem_bytes: int = MEM_BYTES,
                      fsize_bytes: int = FSIZE_BYTES) -> None:
    """Make this process unfit for accidental damage before it runs a candidate: resource limits
    (CPU seconds, address space, file size, no core files); no new processes, signals to others,
    deletions, renames, permission or owner changes, links, environment changes or changes of
    directory; writes only under ``workdir``; no outgoing or listening sockets; ``exit()`` and
    ``quit()`` refused; faulthandler off. Reading files, imports and computing (math, re,
    itertools, collections, hashlib ...) are untouched. Not a security boundary (see the module
    docstring): a determined program gets around it with ``ctypes``."""
    import builtins
    import faulthandler
    import io
    import posix
    import socket

    _set_limits(cpu_s, mem_bytes, fsize_bytes)
    sys.modules["resource"] = None    # the limits stay as set (a root process could raise them)

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

    root = os.path.realpath(workdir)
    realpath, fspath, fsdecode = os.path.realpath, os.fspath, os.fsdecode

    def inside(path) -> None:
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
            if dir_fd is not None:
                raise PermissionError("writing relative to a directory descriptor is disabled in the sandbox")
            inside(path)
        return real_os_open(path, flags, mode)

    real_mkdir = os.mkdir

    def guarded_mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is not None:
            raise PermissionError("mkdir relative to a directory descriptor is disabled in the sandbox")
        inside(path)
        return real_mkdir(path, mode)

    for module in (os, posix):
        module.open, module.mkdir = guarded_os_open, guarded_mkdir


def _child_main(argv: list[str]) -> None:
    """The runner: nonce channel first, then the guard, then the candidate module (as
    ``candidate``), then ``check(entry_point)``, then the nonce. Any exception, ``SystemExit`` or
    early exit skips the nonce, so the parent fails the run."""
    import builtins

    emit = _result_channel()
    script, entry_point, workdir = argv[0], argv[1], argv[2]
    cpu_s, mem_bytes, fsize_bytes = (int(a) for a in argv[3:6])
    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), script, "exec")
    namespace = {"__name__": "candidate", "__file__": script, "__builtins__": builtins}
    reliability_guard(workdir, cpu_s, mem_bytes, fsize_bytes)
    exec(code, namespace)             # noqa: S102 - running the candidate is this runner's purpose
    check, candidate = namespace["check"], namespace[entry_point]
    check(candidate)
    emit()


if __name__ == "__main__":
    _child_main(sys.argv[1:])
